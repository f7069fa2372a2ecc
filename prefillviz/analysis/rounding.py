"""How far two computations of the same numbers may differ from rounding alone, from the dtype.

The app's own pass marks (both ways fill the same KV cache, the engine against HF on a GPU) use
these, as the tests do (``tests/tolerances.py``): a bound tuned on one CPU's result fails on the
next, whose kernels (AVX2, AVX-512, AVX512-BF16, AMX tiles) add the same products in other orders.

    one step   eps(dtype) x the size of the values compared: one rounding of a value that size
    sums       every kernel sums in fp32, and a K-term sum in another order moves its result by
               about sqrt(K) x eps_fp32 of the terms' size (a random walk of roundings)

Two whole forward passes of one model (one step of N tokens against N steps of one, chunks,
other kernels) differ by a few steps at the size of what they compare: RMSNorm rescales every
layer's output, so the roundings of the layers do not add up (``TWO_FORWARDS_STEPS``).
"""

from __future__ import annotations

import math

import torch

from prefillviz.machine.devices import dtype_name

FP32_EPS = torch.finfo(torch.float32).eps
TWO_FORWARDS_STEPS = 6


def as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """A torch dtype from itself or its name ("bfloat16", "torch.float32")."""
    return dtype if isinstance(dtype, torch.dtype) else getattr(torch, dtype_name(dtype))


def relative_bound(dtype: torch.dtype | str, steps: float = TWO_FORWARDS_STEPS, terms: int = 1) -> float:
    """``steps`` roundings to ``dtype`` plus a ``terms``-term fp32 sum's, relative to the values' size."""
    return steps * (torch.finfo(as_dtype(dtype)).eps + math.sqrt(max(terms, 1)) * FP32_EPS)


def longest_sum(config, num_tokens: int = 0) -> int:
    """The most terms one fp32 sum has in a forward pass: a linear's input width, or the keys attended."""
    widths = [getattr(config, name, 0) or 0 for name in ("hidden_size", "intermediate_size", "n_embd", "n_inner")]
    if getattr(config, "n_embd", None) and not getattr(config, "n_inner", None):
        widths.append(4 * config.n_embd)  # GPT-2's MLP when n_inner is unset
    return max(widths + [num_tokens, 1])


def describe(dtype: torch.dtype | str, steps: float, terms: int) -> str:
    """The bound in words, for captions and JSON."""
    return (
        f"{steps:g} rounding steps of {dtype_name(dtype)} (eps {torch.finfo(as_dtype(dtype)).eps:.1e}) "
        f"plus a {terms:,}-term fp32 sum's"
    )
