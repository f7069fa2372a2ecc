"""Random paged steps and the check of a paged kernel against the fp32 v1 oracle.

The engine's dispatch checks every candidate with these before it times one
(``prefillviz/backends/dispatch_tuning.py``); the Kernel timings page checks the teaching
family with the same ones (``prefillviz/kernels/paged_attention.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from prefillviz.backends.ops.paged import PagedKernel, PagedStep, paged_naive
from prefillviz.engine.errors import PrefillVizError

DEFAULT_TOLERANCE = {dtype: 8 * torch.finfo(dtype).eps + 2 * 4096**0.5 * torch.finfo(torch.float32).eps
                     for dtype in (torch.float32, torch.float16, torch.bfloat16)}
"""Allowed max |kernel - oracle| per unit of max |v|, by dtype: a few ulps of the output's dtype plus fp32 accumulation
over up to 4,096 keys."""
ORACLE_ROW_BLOCK = 256  # the check's oracle holds at most (H, 256, N) scores at a time


class KernelCheckError(PrefillVizError):
    """A kernel disagrees with its oracle (or returns a wrong shape, or non-finite values): it is not timed."""


def compare_to_oracle(
    name: str, got: torch.Tensor, expected: torch.Tensor, v: torch.Tensor, tolerance: float | None, where: str
) -> tuple[float, float]:
    """(max |got - expected|, allowed); raises ``KernelCheckError`` on a wrong shape, a
    non-finite value or a difference above ``tolerance`` (None: ``DEFAULT_TOLERANCE`` for
    v's dtype) times max(1, max |v|)."""
    tolerance = DEFAULT_TOLERANCE.get(v.dtype, 1e-4) if tolerance is None else tolerance
    allowed = tolerance * max(1.0, float(v.abs().max()))
    if got.shape != expected.shape:
        raise KernelCheckError(f"{name} returned shape {tuple(got.shape)}, expected {tuple(expected.shape)}.")
    difference = float((got.float() - expected).abs().max())
    if not math.isfinite(difference) or difference > allowed:
        raise KernelCheckError(
            f"{name} differs from the naive oracle by {difference:.3g} (allowed {allowed:.1g}) on {where}: "
            "it is not timed."
        )
    return difference, allowed


@dataclass
class PagedInputs:
    """A step's q, new K/V, a filled paged cache and the step's metadata, ready to call a kernel with."""

    workload: str
    q: torch.Tensor
    k_new: torch.Tensor
    v_new: torch.Tensor
    key_cache: torch.Tensor
    value_cache: torch.Tensor
    step: PagedStep
    scale: float

    def arguments(self) -> tuple:
        return self.q, self.k_new, self.v_new, self.key_cache, self.value_cache, self.step, self.scale

    @property
    def num_context_tokens(self) -> int:
        return sum(self.step.context_len(r) for r in range(self.step.num_requests))


def random_step(
    requests: list[tuple[int, int]],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int = 16,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    workload: str = "",
    shuffle_blocks: bool = True,
) -> PagedInputs:
    """Random q/k/v for a step of ``requests`` = [(num_computed, num_new), ...].

    Each request gets its own blocks, handed out in a shuffled order (as a block pool that
    has served other requests would; ``shuffle_blocks=False``: in order, as a fresh engine's
    pool hands them out), its cached context and new K/V written to the cache.
    """
    generator = torch.Generator().manual_seed(seed)
    blocks_per_request = [math.ceil((cached + new) / block_size) for cached, new in requests]
    total = sum(blocks_per_request)
    physical = torch.randperm(total, generator=generator) if shuffle_blocks else torch.arange(total)
    key_cache = torch.zeros(len(physical), block_size, num_kv_heads, head_dim)
    value_cache = torch.zeros_like(key_cache)
    query_start_loc, num_computed, new_slots, context_slots, first_block = [0], [], [], [], 0
    for (cached, new), num_blocks in zip(requests, blocks_per_request):
        table = physical[first_block : first_block + num_blocks]
        first_block += num_blocks
        positions = torch.arange(cached + new)
        slots = table[positions // block_size] * block_size + positions % block_size
        keys = torch.randn(cached + new, num_kv_heads, head_dim, generator=generator)
        values = torch.randn(cached + new, num_kv_heads, head_dim, generator=generator)
        key_cache.view(-1, num_kv_heads, head_dim)[slots] = keys
        value_cache.view(-1, num_kv_heads, head_dim)[slots] = values
        new_slots.append(slots[cached:])
        context_slots.append(slots if cached else None)
        num_computed.append(cached)
        query_start_loc.append(query_start_loc[-1] + new)
    slot_mapping = torch.cat(new_slots)
    k_new = key_cache.view(-1, num_kv_heads, head_dim)[slot_mapping].transpose(0, 1)
    v_new = value_cache.view(-1, num_kv_heads, head_dim)[slot_mapping].transpose(0, 1)
    q = torch.randn(num_heads, query_start_loc[-1], head_dim, generator=generator)

    def put(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(device=device, dtype=dtype).contiguous()

    step = PagedStep(query_start_loc, num_computed, slot_mapping.to(device),
                     [None if s is None else s.to(device) for s in context_slots])
    return PagedInputs(workload, put(q), put(k_new), put(v_new), put(key_cache), put(value_cache), step, head_dim**-0.5)


@torch.inference_mode()
def check_paged(kernel: PagedKernel, inputs: PagedInputs, tolerance: float | None = None) -> tuple[float, float]:
    """``kernel`` against the fp32 v1 oracle on the same step.

    Returns:
        (max |kernel - oracle|, the allowed difference).

    Raises:
        KernelCheckError: a wrong shape, non-finite values, or a difference above the allowed one.
    """
    fp32 = [t.float() if isinstance(t, torch.Tensor) else t for t in inputs.arguments()]
    expected = paged_naive(*fp32, row_block=ORACLE_ROW_BLOCK)
    where = f"the {inputs.workload or 'given'} step"
    return compare_to_oracle(kernel.name, kernel(*inputs.arguments()), expected, inputs.v_new, tolerance, where)
