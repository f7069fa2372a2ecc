"""The attention versions the measured backend can run, by name, and one layer's call of one.

The dispatch's candidates (``dispatch.py``): v7 and v7 tiles (the engine's C++ kernel, in its two
layouts), v8 (its softmax between oneDNN brgemm matmuls), and torch's SDPA in v6, v2 and v3
(``ops/paged.py``); v1, the naive oracle, checks them all.
"""

from __future__ import annotations

import torch

from prefillviz.backends.dispatch import ROWS_CANDIDATES, V7, V8
from prefillviz.backends.ops import engine_ops
from prefillviz.backends.ops.engine_ops import BRGEMM, COMPILED, COMPILED_TILES, engine_ops_status, step_meta
from prefillviz.backends.ops.paged import LOOP, LOOP_FP32_DECODES, NAIVE, PACKED, PagedKernel
from prefillviz.engine.paged_attention import PagedStep

ENGINE_KERNELS: dict[str, PagedKernel] = {
    kernel.name: kernel for kernel in (COMPILED, COMPILED_TILES, BRGEMM, LOOP_FP32_DECODES, LOOP, PACKED, NAIVE)
}
"""The attention versions the engine can run (the dispatch's candidates, and v1, their oracle), by name."""


def compiled_attention_status(device: torch.device | str, dtype: torch.dtype,
                              head_dim: int) -> tuple[object | None, str]:
    """(the engine's C++ ops when v7 runs this head size and dtype here, else None; why not)."""
    if torch.device(device).type != "cpu" or dtype not in (torch.float32, torch.bfloat16):
        return None, "the engine's C++ ops run float32 and bfloat16 on a CPU only"
    ops, why = engine_ops_status()
    if ops is None:
        return None, why
    width = ops.vector_width()
    if head_dim % width or head_dim // width not in (1, 2, 4, 8, 16):
        return None, f"head size {head_dim} is not 1, 2, 4, 8 or 16 vectors of {width} floats"
    return ops, why


def attend(name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_cache, value_cache, step, scale: float,
           meta=None, rows: torch.Tensor | None = None) -> torch.Tensor:
    """One layer's attention with candidate ``name``: q (T, H, D), k and v (T, KVH, D) -> (T, H D).

    The step's new K/V are already in the cache. ``meta`` is ``engine_ops.step_meta(step)``,
    made once per step, for v7 and v8, and ``rows`` the q|k|v rows (T, (H + 2 KVH) D) they read q from
    as they are; the SDPA versions take the views as they are.
    """
    num_tokens, num_heads, head_dim = q.shape
    if name in ROWS_CANDIDATES:
        queries = rows if rows is not None else q.reshape(num_tokens, num_heads * head_dim)
        return engine_ops.paged_attention(engine_ops.engine_ops(), queries, key_cache, value_cache, step, num_heads,
                                          scale, meta, row_lanes=name == V7, brgemm=name == V8)
    kernel = ENGINE_KERNELS[name]
    out = kernel(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                 key_cache, value_cache, step, scale)  # (H, T, D)
    return out.transpose(0, 1).reshape(num_tokens, num_heads * head_dim)


def last_rows_step(meta, keep: list[int]) -> PagedStep | None:
    """The step of ``meta`` (``engine.attention.AttentionMetadata``) cut to the batch rows ``keep``, each the last
    row of its request: one query per such request, over its whole context in the cache. The forward's last layer
    needs attention only at the rows whose logits are kept (every row's K/V are written before). None where a kept
    row is not its request's last."""
    step = meta.step
    last = {meta.query_start_loc[r + 1] - 1: r for r in range(step.num_requests)}  # a request's last row -> it
    if not keep or any(row not in last for row in keep):
        return None
    requests = [last[row] for row in keep]
    return PagedStep(list(range(len(keep) + 1)), [step.context_len(r) - 1 for r in requests],
                     meta.slot_mapping[torch.tensor(keep, device=meta.slot_mapping.device)],
                     [step.slots(r) for r in requests])


def step_attention(name: str, layer: int, q, k, v, scale: float, meta, rows: torch.Tensor | None,
                   keep: torch.Tensor | None) -> torch.Tensor:
    """One layer's attention in an engine step with candidate ``name`` (the K/V already in the cache): (T, H D);
    with ``keep`` (batch rows, each its request's last: the forward's last layer), (kept, H D), computed at those
    rows only."""
    cache, step = meta.kv_cache, meta.step
    compiled_meta = step.kept(("compiled meta",), lambda: step_meta(step)) if name in ROWS_CANDIDATES else None
    kept = last_rows_step(meta, keep.tolist()) if keep is not None else None
    if kept is not None:
        q, k, v = q.index_select(0, keep), k.index_select(0, keep), v.index_select(0, keep)
        rows = rows.index_select(0, keep) if rows is not None else None
        step, compiled_meta = kept, step_meta(kept) if name in ROWS_CANDIDATES else None
    out = attend(name, q, k, v, cache.key_cache[layer], cache.value_cache[layer], step, scale, compiled_meta, rows)
    # a kept row inside a request: every row's, then those
    return out.index_select(0, keep) if keep is not None and kept is None else out
