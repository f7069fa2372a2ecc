"""The attention function the engine puts inside a stock ``transformers`` model.

Registered under one name in both ``AttentionInterface`` (the function) and
``AttentionMaskInterface`` (a mask builder that returns None: the engine knows each
request's causal structure from its own metadata, so no (T, T) mask is built). With only
the first registration, transformers would still build and pass its own mask for a packed
batch, which is wrong for chunked prefill.

For each layer it:
1. writes the step's new K/V into the paged cache through the slot mapping (the KV writes);
2. for each request packed in the batch, attends its queries over the request's cached +
   new keys (gathered through its block table), causally, offset by what was cached, with
   the kernel the measured dispatch chose for this step (``dispatch.py``; the runner puts the
   step's ``choice`` in the metadata):

       keys  ->  0 .......... context_len
       query i (position num_computed + i) sees keys 0 .. num_computed + i

Without engine metadata (a plain HF call on the same model) it falls back to SDPA, so one
loaded model serves both the engine and the oracle.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property

import torch
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from prefillviz.engine.dispatch import ROWS_CANDIDATES, V7, V8, StepChoice
from prefillviz.engine.kv_cache import PagedKVCache
from prefillviz.engine.ops import engine_ops
from prefillviz.engine.ops.engine_ops import BRGEMM, COMPILED, COMPILED_TILES, engine_ops_status, step_meta
from prefillviz.engine.ops.paged import LOOP, LOOP_FP32_DECODES, NAIVE, PACKED, PagedKernel, PagedStep
from prefillviz.engine.shared_settings import shared_setting

ATTENTION_NAME = "prefillviz_paged"
ENGINE_KERNELS: dict[str, PagedKernel] = {kernel.name: kernel for kernel in (COMPILED, COMPILED_TILES, BRGEMM, LOOP_FP32_DECODES, LOOP, PACKED, NAIVE)}
"""The attention versions the engine can run (the dispatch's candidates, and v1, their oracle), by name."""


@dataclass
class AttentionMetadata:
    """Where each request's queries sit in the packed batch and where its K/V live."""

    kv_cache: PagedKVCache
    slot_mapping: torch.Tensor  # (T,) cache slot of every scheduled token
    query_start_loc: list[int]  # request r's queries are batch rows [q[r], q[r+1])
    num_computed_tokens: list[int]  # per request: tokens already cached before this step
    context_slots: list[torch.Tensor | None]  # per request: slots of positions 0..context_len-1
    request_ids: list[str] = field(default_factory=list)  # per request, batch order
    positions: torch.Tensor | None = None  # (T,) on CPU: each token's position in its request
    # observers see (layer_idx, module, query, key, value, metadata) after the write; the
    # instruments (timers, KV write log, query capture) attach here
    observers: list[Callable] = field(default_factory=list)
    choice: StepChoice | None = None  # the step's measured dispatch (set by the runner before the forward)

    @cached_property
    def paged_step(self) -> PagedStep:
        """The step as the kernels in ``prefillviz/engine/ops/paged.py`` take it (made once, used by every layer)."""
        return PagedStep(self.query_start_loc, self.num_computed_tokens, self.slot_mapping, self.context_slots)

    @cached_property
    def compiled_meta(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``engine_ops.step_meta`` of the step, for v7, v7 tiles and v8: made once, read by every layer."""
        return step_meta(self.paged_step)

    def last_rows_step(self, keep: list[int]) -> PagedStep | None:
        """The step cut to the batch rows ``keep``, where each is the last row of its request (as the
        runner keeps a sampling request's logits): per such request one query, the last, over its whole
        context in the cache; the other requests left out. None where a kept row is not its request's
        last. A forward's last layer needs attention at these rows only (the K/V of every row are
        written before): at 512 tokens that is one query row where there were 512."""
        step = self.paged_step
        last = {self.query_start_loc[r + 1] - 1: r for r in range(step.num_requests)}  # a request's last row -> the request
        if not keep or any(row not in last for row in keep):
            return None
        requests = [last[row] for row in keep]
        return PagedStep(
            list(range(len(keep) + 1)),
            [step.context_len(r) - 1 for r in requests],
            self.slot_mapping[torch.tensor(keep, device=self.slot_mapping.device)],
            [step.slots(r) for r in requests],
        )


def compiled_attention_status(device: torch.device | str, dtype: torch.dtype, head_dim: int) -> tuple[object | None, str]:
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


def attend(name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_cache, value_cache, step, scale: float, meta=None,
           rows: torch.Tensor | None = None) -> torch.Tensor:
    """One layer's attention with candidate ``name``: q (T, H, D), k and v (T, KVH, D) -> (T, H D).

    The step's new K/V are already in the cache. ``meta`` is ``engine_ops.step_meta(step)``,
    made once per step, for v7 and v8, and ``rows`` the q|k|v rows (T, (H + 2 KVH) D) they read q from
    as they are; the SDPA versions take the views as they are.
    """
    num_tokens, num_heads, head_dim = q.shape
    if name in ROWS_CANDIDATES:
        queries = rows if rows is not None else q.reshape(num_tokens, num_heads * head_dim)
        return engine_ops.paged_attention(engine_ops.engine_ops(), queries, key_cache, value_cache, step, num_heads, scale, meta,
                                          row_lanes=name == V7, brgemm=name == V8)
    kernel = ENGINE_KERNELS[name]
    out = kernel(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), key_cache, value_cache, step, scale)  # (H, T, D)
    return out.transpose(0, 1).reshape(num_tokens, num_heads * head_dim)


def step_attention(meta: AttentionMetadata, layer_idx: int, module: torch.nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   scale: float, rows: torch.Tensor | None = None, written: bool = False, keep: torch.Tensor | None = None) -> torch.Tensor:
    """One layer's attention in an engine step, whichever forward runs it: the step's new K/V
    into the paged cache (unless ``written``), the instruments' observers, then the step's
    measured attention (``meta.choice``). q (T, H, D), k and v (T, KVH, D) -> (T, H D); with
    ``keep`` (batch rows, each its request's last: the forward's last layer) -> (kept, H D),
    computed at those rows only (``AttentionMetadata.last_rows_step``).

    The observers see (layer, module, q (1, H, T, D), k, v (1, KVH, T, D), metadata), as the
    stock forward's attention function shows them.
    """
    cache = meta.kv_cache
    if not written:
        cache.write(layer_idx, meta.slot_mapping, k, v)
    for observer in meta.observers:
        observer(layer_idx, module, q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], meta)
    choice = meta.choice.attention
    step, compiled_meta = meta.paged_step, meta.compiled_meta if choice in ROWS_CANDIDATES else None
    kept = meta.last_rows_step(keep.tolist()) if keep is not None else None
    if kept is not None:
        q, k, v = q.index_select(0, keep), k.index_select(0, keep), v.index_select(0, keep)
        rows = rows.index_select(0, keep) if rows is not None else None
        step, compiled_meta = kept, step_meta(kept) if choice in ROWS_CANDIDATES else None
    out = attend(choice, q, k, v, cache.key_cache[layer_idx], cache.value_cache[layer_idx], step, scale, compiled_meta, rows)
    return out.index_select(0, keep) if keep is not None and kept is None else out  # a kept row inside a request: every row's, then those


def paged_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,  # (1, H, T, D), post-RoPE
    key: torch.Tensor,  # (1, KVH, T, D)
    value: torch.Tensor,  # (1, KVH, T, D)
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    prefillviz_metadata: AttentionMetadata | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    meta = prefillviz_metadata
    if meta is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # (T, heads, D), post-RoPE
    out = step_attention(meta, module.layer_idx, module, q, k, v, scale)
    return out.view(1, q.shape[0], q.shape[1], q.shape[2]), None  # (1, T, H, D)


def no_mask(*args, **kwargs) -> None:
    """Mask builder for ATTENTION_NAME: the attention function derives causality itself."""
    return None


AttentionInterface.register(ATTENTION_NAME, paged_attention_forward)
AttentionMaskInterface.register(ATTENTION_NAME, no_mask)


@contextmanager
def engine_attention(model: torch.nn.Module) -> Iterator[None]:
    """Route the model's attention through ``paged_attention_forward`` inside the block.

    The model's config is shared by every thread, so this is a ``shared_setting``: set by the
    first thread in, restored by the last one out (even on error). A plain call meanwhile
    passes no engine metadata and gets SDPA with no mask, which is causal: an unpadded
    forward computes as the stock model does.
    """
    config = model.config

    def apply() -> Callable[[], None]:
        previous = config._attn_implementation
        config._attn_implementation = ATTENTION_NAME
        return lambda: setattr(config, "_attn_implementation", previous)

    with shared_setting(model, "attention", apply):
        yield
