"""How far two computations of the same numbers may differ, from the dtype's precision.

A bound tuned on one CPU fails on the next: our machines run AVX2, AVX-512, AVX512-BF16 or AMX
kernels, which add the same products in other orders and round at other places (issue 25: on AMX
tiles the packed and stock bf16 runs of the bundled model differed by three bf16 grid steps, where
the bound tuned on an AVX512-BF16 CPU allowed less than one). So each bound here is a number of
steps of the dtype's grid at the size of the values compared:

    one step   eps(dtype) x magnitude, eps = torch.finfo(dtype).eps (bf16 2^-7, fp16 2^-10,
               fp32 2^-23): at least one grid step at that magnitude (at most two), so a step
               covers one rounding of a value of that size to the dtype.
    sums       every kernel here sums its products in fp32. The error of a K-term fp32 sum grows
               like sqrt(K) x eps_fp32 of the terms' size (a random walk of roundings: Higham and
               Mary, "A new approach to probabilistic rounding error analysis", 2019; the worst
               case is K x eps_fp32, which ``linear_difference_bound`` uses). In fp32 this term is
               what differs between two orders; in bf16 the rounding of the result dominates.

How many steps each kind of comparison gets is said where its constant is defined.
"""

from __future__ import annotations

import math
import threading

import torch

from prefillviz.analysis import rounding

FP32_EPS = torch.finfo(torch.float32).eps

# One op or kernel against another computation of the same result (an oracle, another kernel):
# each side rounds its result to the dtype once (a step apiece), and sums in its own order.
OP_STEPS = 2
# Two whole forward passes of one model (other kernels for the linears or the attention, chunks
# instead of one pass), or one pass against the same weights in fp32. Every activation of every
# layer is rounded, but RMSNorm rescales each layer's output, so the roundings reach the logits as
# a random walk relative to their size instead of adding up layer by layer, and the largest
# difference over a vocabulary is a few steps at max |logit|: summing every linear of the bundled
# model in another order, or in fp32, moves its bf16 logits by up to three and a half. Six leaves
# room for that (tests/model/test_packed_weights.py checks each bf16 path against fp32). In fp32
# the sums' term, sqrt(K) with K the model's longest sum, is what the passes differ by.
MODEL_STEPS = 6


def eps(dtype: torch.dtype) -> float:
    """The dtype's relative step: the gap between 1.0 and the next number."""
    return torch.finfo(dtype).eps


def allowed_difference(dtype: torch.dtype, magnitude, steps: float, terms: int = 1) -> float:
    """``steps`` roundings to ``dtype`` plus the error of a ``terms``-term fp32 sum, at ``magnitude``.

    Args:
        dtype: the dtype both results were computed in.
        magnitude: the size of the values compared (a float, or a tensor: its largest |value|).
        steps: how many steps the comparison allows (``OP_STEPS``, ``MODEL_STEPS``, ...).
        terms: the longest fp32 sum on the way (a dot product's length, a context's keys).
    """
    if isinstance(magnitude, torch.Tensor):
        magnitude = magnitude.detach().float().abs().max().item()
    return steps * (eps(dtype) + math.sqrt(terms) * FP32_EPS) * float(magnitude)


def max_difference(actual, reference) -> float:
    return (torch.as_tensor(actual).float() - torch.as_tensor(reference).float()).abs().max().item()


def assert_within(actual, reference, allowed: float, what: str = "") -> float:
    """max |actual - reference| <= allowed (a scalar bound); returns the difference."""
    assert torch.as_tensor(actual).shape == torch.as_tensor(reference).shape, what
    difference = max_difference(actual, reference)
    assert difference <= allowed, f"{what}: max |difference| {difference:.3g} > allowed {allowed:.3g}"
    return difference


# --------------------------------------------------------------------------- whole models
def longest_sum(model: torch.nn.Module, num_tokens: int = 0) -> int:
    """The most terms one fp32 sum has in a forward pass: a linear's input width, or the keys attended."""
    return rounding.longest_sum(model.config, num_tokens)


def logits_allowed_difference(
    model: torch.nn.Module, reference: torch.Tensor, num_tokens: int = 0, steps: float = MODEL_STEPS
) -> float:
    """The max |difference| allowed between two forward passes' logits (``MODEL_STEPS`` at max |reference|)."""
    dtype = next(model.parameters()).dtype
    return allowed_difference(dtype, reference, steps, longest_sum(model, num_tokens))


def maps_allowed_difference(model: torch.nn.Module, num_tokens: int) -> float:
    """Attention maps (fp32) rebuilt from one forward's q/k against another forward's: the two passes'
    q and k differ by a whole forward's roundings (``MODEL_STEPS`` with the model's longest sums),
    relative to what they feed, and a map's entries are probabilities, at most 1."""
    return allowed_difference(torch.float32, 1.0, MODEL_STEPS, longest_sum(model, num_tokens))


def assert_same_greedy_token(reference: torch.Tensor, other: torch.Tensor | int, allowed: float) -> None:
    """``other`` (logits, or the token it chose) picks ``reference``'s top token wherever the bound leaves no doubt.

    Each logit may move by ``allowed``, so the argmax can't change when the top two reference
    logits are more than twice that apart: then the tokens must be equal. Closer than that (a
    near tie), either may win, and the check is that ``other``'s token is one of those within
    twice the bound of the top (a wrong token far down the list still fails).
    """
    top = reference.float().topk(2).values
    margin = float(top[0] - top[1])
    chosen = int(other.argmax()) if isinstance(other, torch.Tensor) else int(other)
    if margin > 2 * allowed:
        assert chosen == int(reference.argmax()), (
            f"greedy token {chosen} != {int(reference.argmax())} (top-two margin {margin:.3g} > 2 x {allowed:.3g})"
        )
    else:
        assert float(reference[chosen]) >= float(top[0]) - 2 * allowed, (
            f"token {chosen} is {float(top[0] - reference[chosen]):.3g} below the top, more than 2 x {allowed:.3g} "
            f"(a near tie: margin {margin:.3g})"
        )


@torch.inference_mode()
def assert_same_greedy_generation(
    model: torch.nn.Module, prompt: list[int], generated: list[int], reference: list[int]
) -> None:
    """``generated`` (the engine's greedy tokens) is ``reference`` (the HF greedy tokens), checked as
    ``assert_same_greedy_token`` checks one token at each position, from one HF forward over the
    prompt and ``reference``: exact where the top two logits are apart, either of a near tie's
    tokens where they are not, and after a near tie chose differently the two may part (the rest
    continues from another text)."""
    assert len(generated) == len(reference), f"{len(generated)} tokens generated, {len(reference)} expected"
    device = next(model.parameters()).device
    # logits: (new, V)
    logits = model(torch.tensor([prompt + reference[:-1]], device=device)).logits[0, len(prompt) - 1 :].float().cpu()
    for index, (chosen, expected) in enumerate(zip(generated, reference)):
        assert_same_greedy_token(
            logits[index], chosen, logits_allowed_difference(model, logits[index], num_tokens=len(prompt) + index)
        )
        if chosen != expected:
            return  # a near tie (else the line above failed): the texts part here


# --------------------------------------------------------------------------- linears
def linear_difference_bound(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Per output of ``x @ weight.T (+ bias)``: how far two kernels in x's dtype may differ from each other
    or from the fp32 product. ``linear_checks.linear_tolerance`` (each output rounded once, the
    fp32 sum's worst case K x eps_fp32, twice over), plus a step of the dtype at |bias| for its add."""
    # here: the unit tier imports this file without the engine
    from prefillviz.backends.linear_checks import linear_tolerance

    with torch.no_grad():
        bound = linear_tolerance(x, weight)
        if bias is not None:
            bound = bound + 2 * eps(x.dtype) * bias.float().abs()
    return bound


def assert_linear_close(
    got: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
    want: torch.Tensor | None = None,
) -> None:
    """``got`` is ``F.linear(x, weight, bias)`` (``want``; by default computed in fp32) within
    ``linear_difference_bound``."""
    with torch.no_grad():
        if want is None:
            want = torch.nn.functional.linear(x.float(), weight.float(), None if bias is None else bias.float())
        assert got.shape == want.shape, f"shape {tuple(got.shape)} != {tuple(want.shape)}"
        excess = (got.float() - want.float()).abs() - linear_difference_bound(x, weight, bias)
    assert float(excess.max()) <= 0, (
        f"an output exceeds its bound by {float(excess.max()):.3g} ({x.dtype}, K={x.shape[-1]})"
    )


def assert_linear_close_from_two_threads(linear, weight: torch.Tensor, rows: tuple[int, ...], loops: int) -> None:
    """``linear`` called from two threads at once (the app's sessions share the model's linears), each
    output ``assert_linear_close`` to F.linear: no call sees another's scratch or state."""
    inputs = {name: [torch.randn(n, weight.shape[1]).to(weight.dtype) for n in rows] for name in ("a", "b")}
    errors = []

    def work(name):
        try:
            for _ in range(loops):
                for x in inputs[name]:
                    assert_linear_close(linear(x), x, weight)
        except Exception as error:  # reported in the main thread
            errors.append(error)

    threads = [threading.Thread(target=work, args=(name,)) for name in inputs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors and not any(thread.is_alive() for thread in threads), errors


# --------------------------------------------------------------------------- attention
def attention_allowed_difference(
    v: torch.Tensor, context: int, dtype: torch.dtype | None = None, steps: float = OP_STEPS
) -> float:
    """Attention output against another computation of it: a weighted mean of V rows, so its size
    is max |v|; the longest sums are the context's keys or a head's dimensions (``context``)."""
    return allowed_difference(dtype or v.dtype, v, steps, max(context, v.shape[-1]))
