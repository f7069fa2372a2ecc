"""Block-sparse prefill on the measured backend (the textbook's is ``engine/sparse_attention.py``).

The same method (XAttention's antidiagonal scores, then ``select_blocks``' tiles, then attention over
those tiles) in two versions:

    textbook          plain torch: the scores' matmul in the model's dtype, per query block one SDPA
                      over its kept key blocks, gathered
    v8 block-sparse   three C++ ops: ``antidiagonal_scores`` (the scores in fp32, from the q|k|v rows as
                      they lie), ``select_tiles`` (``select_blocks``, tie for tie) and v8's brgemm kernel
                      with each query block walking its kept tiles only (``brgemm_block_sparse``)

Which one runs is measured (``sparse_choice``): v8 block-sparse where v8 runs here, matches the textbook
on random inputs of the model's shape (its scores, tiles and attention), and is faster on a fresh prompt
of ``TIMED_TOKENS``; else the textbook's. Once per process, model shape, dtype, thread count and keep
fraction.

A step with no fresh prompt of two blocks or more (a chunk after cached context, decodes) runs the
measured backend's dense choice. In a step with one, the other requests run dense in the same version:
on v8 in the same call, or on torch's SDPA.
"""

from __future__ import annotations

import functools
import statistics
from dataclasses import dataclass

import torch

from prefillviz.backends.dispatch_tuning import attention_heads
from prefillviz.backends.measured import MeasuredBackend, MeasuredStepOps
from prefillviz.backends.ops import engine_ops
from prefillviz.backends.ops.paged_check import KernelCheckError, compare_to_oracle, random_step
from prefillviz.engine.sparse_attention import (
    ANTIDIAGONAL_STRIDE,
    SPARSE_BLOCK_SIZE,
    antidiagonal_block_scores,
    block_sparse_attention,
    block_sparse_backend,
    blocks_to_keep,
    select_blocks,
    sparse_requests,
)
from prefillviz.machine.timers import run_seconds

V8_SPARSE, TEXTBOOK_SPARSE = "v8 block-sparse", "textbook block-sparse"
TIMED_TOKENS = 2048  # the fresh prompt both versions are timed on (16 blocks of 128)
RUNS = 5


@dataclass(frozen=True)
class SparseChoice:
    """Which version computes the kept tiles here, why, and the median seconds each took (one layer)."""

    kernel: str
    why: str
    seconds: dict


def kept_tiles(q: torch.Tensor, k: torch.Tensor, step, scale: float, keep_fraction: float, num_heads: int,
               num_kv_heads: int) -> tuple:
    """(every block-sparse request's (H, nb, nb) map, flat uint8; (R,) int64, where each starts, -1 for a dense
    request) for v8 block-sparse: q (T, H D) and k (T, KVH D) rows (unit inner stride). The scores are the
    textbook's, computed by ``antidiagonal_scores`` (``ops/csrc/antidiagonal_scores.h``) in fp32 throughout."""
    ops = engine_ops.engine_ops()
    maps, starts, at = [], [], 0
    for r, sparse in enumerate(sparse_requests(step)):
        if not sparse:
            starts.append(-1)
            continue
        rows = slice(step.query_start_loc[r], step.query_start_loc[r + 1])
        scores = ops.antidiagonal_scores(q[rows], k[rows], num_heads, num_kv_heads, scale, ANTIDIAGONAL_STRIDE,
                                         SPARSE_BLOCK_SIZE)  # (H, nb, nb)
        maps.append(ops.select_tiles(scores, blocks_to_keep(scores.shape[-1], keep_fraction)).flatten())
        starts.append(at)
        at += maps[-1].numel()
    return torch.cat(maps), torch.tensor(starts, dtype=torch.long)


def v8_block_sparse(q, k, key_cache, value_cache, step, scale: float, keep_fraction: float, meta=None,
                    rows: torch.Tensor | None = None) -> torch.Tensor:
    """One layer's attention of ``step`` with its fresh long prompts block-sparse on v8: q (T, H, D) -> (T, H D)."""
    num_tokens, num_heads, head_dim = q.shape
    if rows is not None:  # the q|k|v rows: q and k read where they lie
        queries, keys = rows[:, : num_heads * head_dim], rows[:, num_heads * head_dim :][:, : k.shape[1] * head_dim]
    else:
        queries, keys = q.reshape(num_tokens, -1), k.reshape(num_tokens, -1)
    kept, starts = kept_tiles(queries, keys, step, scale, keep_fraction, num_heads, k.shape[1])
    slots, requests = meta if meta is not None else engine_ops.step_meta(step)
    return engine_ops.engine_ops().brgemm_block_sparse(queries, key_cache, value_cache, slots, requests, num_heads,
                                                       scale, kept, starts, SPARSE_BLOCK_SIZE)


def textbook_block_sparse(kernel, q, k, v, key_cache, value_cache, step, scale: float) -> torch.Tensor:
    """The textbook's ``kernel`` (``block_sparse_backend(keep).attention``: its dense requests on SDPA) on the
    measured forward's layout: q (T, H, D) -> (T, H D)."""
    out = kernel(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), key_cache, value_cache, step, scale)
    return out.transpose(0, 1).reshape(q.shape[0], -1)


def scores_allowed_difference(q: torch.Tensor, k: torch.Tensor, scale: float,
                              stride: int = ANTIDIAGONAL_STRIDE) -> float:
    """How far two fp32 computations of ``antidiagonal_block_scores(q, k)`` may differ, from the values' size.

    A stride-row's logit is S D products summed, times scale / S; each computation's sum lies within
    sqrt(S D) eps_fp32 x the sum of the products' sizes of the exact one (Cauchy-Schwarz bounds that sum by the
    largest q and k stride-rows' norms), so two lie within twice that. A softmax's outputs move by p x twice its
    inputs' largest move, and a tile's shares sum to at most 1: each score moves by at most twice the logits'
    move, plus a few fp32 steps for the exponentials (exp2's fit: 1.5 ulp) and the normalisations."""
    eps = torch.finfo(torch.float32).eps
    num_tokens, head_dim = q.shape[1] // stride * stride, q.shape[-1]
    q_rows = q[:, :num_tokens].float().reshape(q.shape[0], -1, stride * head_dim).norm(dim=-1).max()
    k_rows = k[:, :num_tokens].float().reshape(k.shape[0], -1, stride * head_dim).norm(dim=-1).max()
    logit_move = (stride * head_dim) ** 0.5 * eps * float(q_rows * k_rows) * scale / stride
    return 2 * 2 * logit_move + 8 * eps


@functools.cache
def sparse_choice(num_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype, keep_fraction: float,
                  threads: int) -> SparseChoice:
    """Check v8 block-sparse against the textbook's tiles in fp32, then time both on a fresh prompt (CPU)."""
    device = torch.device("cpu")
    if why := engine_ops.brgemm_why(device, dtype, head_dim):
        return SparseChoice(TEXTBOOK_SPARSE, f"v8 block-sparse does not run here: {why}", {})
    inputs = random_step([(0, TIMED_TOKENS)], num_heads, num_kv_heads, head_dim, dtype=dtype, seed=2)
    textbook = block_sparse_backend(keep_fraction).attention
    q, k, v = (t.transpose(0, 1) for t in (inputs.q, inputs.k_new, inputs.v_new))  # (T, heads, D)
    meta = engine_ops.step_meta(inputs.step)
    calls = {
        V8_SPARSE: lambda: v8_block_sparse(q, k, inputs.key_cache, inputs.value_cache, inputs.step, inputs.scale,
                                           keep_fraction, meta),
        TEXTBOOK_SPARSE: lambda: textbook_block_sparse(textbook, q, k, v, inputs.key_cache, inputs.value_cache,
                                                       inputs.step, inputs.scale),
    }
    where = f"a fresh prompt of {TIMED_TOKENS:,} tokens, keep {keep_fraction:g}"
    try:  # the scores against the textbook's in fp32, then the tiles they keep against the textbook's attention
        ops = engine_ops.engine_ops()
        scores = ops.antidiagonal_scores(q.reshape(TIMED_TOKENS, -1), k.reshape(TIMED_TOKENS, -1),
                                         num_heads, num_kv_heads, inputs.scale, ANTIDIAGONAL_STRIDE, SPARSE_BLOCK_SIZE)
        want = antidiagonal_block_scores(inputs.q.float(), inputs.k_new.float(), inputs.scale)
        allowed = scores_allowed_difference(inputs.q, inputs.k_new, inputs.scale)
        compare_to_oracle("antidiagonal_scores", scores, want, torch.ones(()), allowed, where)
        kept = select_blocks(scores, keep_fraction)
        if not torch.equal(ops.select_tiles(scores, blocks_to_keep(kept.shape[-1], keep_fraction)).bool(), kept):
            raise KernelCheckError(f"select_tiles kept other tiles than the textbook's select_blocks on {where}")
        expected = block_sparse_attention(inputs.q.float(), inputs.k_new.float(), inputs.v_new.float(), inputs.scale,
                                          kept)
        compare_to_oracle(V8_SPARSE, calls[V8_SPARSE]().float(), expected.transpose(0, 1).reshape(TIMED_TOKENS, -1),
                          inputs.v_new, None, where)
    except (KernelCheckError, RuntimeError) as error:
        return SparseChoice(TEXTBOOK_SPARSE, f"v8 block-sparse failed its check here: {error}", {})
    try:
        calls[TEXTBOOK_SPARSE]()  # warm-up (v8's ran in its check)
    except RuntimeError as error:  # torch's SDPA refused this dtype or mask here
        return SparseChoice(V8_SPARSE, f"the textbook's version failed here: {str(error).splitlines()[0][:160]}", {})
    runs = {name: [] for name in calls}
    for _ in range(RUNS):  # in turns: a burst of other work slows one run of each, not every run of one
        for name, call in calls.items():
            runs[name].append(run_seconds(call, 1, device))
    seconds = {name: statistics.median(values) for name, values in runs.items()}
    best = min(seconds, key=seconds.get)
    other = next(name for name in seconds if name != best)
    return SparseChoice(best, f"{seconds[other] / seconds[best]:.1f}x faster than the {other} here, measured",
                        seconds)


class BlockSparseStepOps(MeasuredStepOps):
    """A step with a fresh long prompt: the measured choice for everything but its attention, block-sparse."""

    def __init__(self, model: torch.nn.Module, dense: MeasuredStepOps, keep_fraction: float,
                 choice: SparseChoice, textbook) -> None:
        super().__init__(model, dense.choice, dense.compiled)
        self.keep_fraction, self.sparse, self.textbook = keep_fraction, choice, textbook
        others = "v8 brgemm" if choice.kernel == V8_SPARSE else "torch SDPA"
        self.ran["attention"] = (f"{choice.kernel} prefill (XAttention, keep {keep_fraction:g}; {choice.why}); "
                                 f"the step's other requests dense on {others}")

    def attention(self, layer: int, q, k, v, scale: float, meta, keep: torch.Tensor | None = None) -> torch.Tensor:
        rows, self.rows = self.rows, None
        cache, step = meta.kv_cache, meta.step
        key_cache, value_cache = cache.key_cache[layer], cache.value_cache[layer]
        if self.sparse.kernel == V8_SPARSE:
            compiled = step.kept(("compiled meta",), lambda: engine_ops.step_meta(step))
            out = v8_block_sparse(q, k, key_cache, value_cache, step, scale, self.keep_fraction, compiled, rows)
        else:
            out = textbook_block_sparse(self.textbook, q, k, v, key_cache, value_cache, step, scale)
        return out.index_select(0, keep) if keep is not None else out  # the last layer: its sampled rows


class BlockSparseBackend(MeasuredBackend):
    """The measured backend with a fresh prompt's prefill block-sparse at ``keep_fraction`` (0 < f <= 1)."""

    def __init__(self, keep_fraction: float) -> None:
        self.textbook = block_sparse_backend(keep_fraction).attention  # (which checks the fraction)
        super().__init__()
        self.keep_fraction = float(keep_fraction)

    def choice_for(self, model: torch.nn.Module) -> SparseChoice:
        parameter = next(model.parameters())
        if parameter.device.type != "cpu":
            return SparseChoice(TEXTBOOK_SPARSE, "v8 block-sparse is a CPU kernel", {})
        return sparse_choice(*attention_heads(model), parameter.dtype, self.keep_fraction, torch.get_num_threads())

    def prepare(self, model: torch.nn.Module) -> None:
        super().prepare(model)
        self.choice_for(model)  # measured now, not inside a timed step

    def for_step(self, model: torch.nn.Module, meta) -> MeasuredStepOps:
        dense = super().for_step(model, meta)
        if not any(sparse_requests(meta.step)):
            return dense
        return BlockSparseStepOps(model, dense, self.keep_fraction, self.choice_for(model), self.textbook)
