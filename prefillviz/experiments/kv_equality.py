"""The equality proof: both ways filled the same KV cache and predict the same next token.

Two inspection passes (capture ``"inspect"``) of one prompt, one parallel and one token by
token, each keep the post-RoPE keys and values written to the KV cache in every layer and
the first-token logits; ``compare_inspections`` measures how far apart they are, and an
``EqualityCheck`` passes when every difference is within a few roundings of the dtype at the size of
what is compared (``relative_tolerance_for``), the same bound on every CPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from prefillviz.analysis import rounding
from prefillviz.engine.trace import Trace
from prefillviz.experiments.ways import REQUEST_ID


def relative_tolerance_for(dtype: str, longest_sum: int) -> float:
    """The relative difference both ways may differ by in this dtype: two whole forward passes'
    roundings (``rounding.TWO_FORWARDS_STEPS`` steps of the dtype, plus the model's longest fp32 sum's),
    relative to the size of what is compared. A wrong key or value is off by about its own size
    (relative ~1), in any dtype and whatever the size of a model's keys; rounding is off by this."""
    return rounding.relative_bound(dtype, rounding.TWO_FORWARDS_STEPS, longest_sum)


@dataclass
class EqualityCheck:
    """How far apart the two ways' KV caches and first-token logits are (inspection passes).

    Attributes:
        dtype: the model's dtype (keys and values are compared in fp32 copies of it).
        longest_sum: the most terms of one fp32 sum in the model's forward (its widest linear input).
        num_positions: prompt positions compared in every layer.
        same_positions: both ways wrote K/V for the same positions in the same order.
        key_max_abs_diff: (L,) max |K_parallel - K_token_by_token| per layer, all KV heads.
        value_max_abs_diff: (L,) the same for V.
        key_max_abs: (L,) max |K| per layer (the scale the differences compare to).
        value_max_abs: (L,) max |V| per layer.
        logits_max_abs_diff: max over the vocabulary of |logit_parallel - logit_token_by_token|.
        logits_max_abs: max |logit| of the parallel pass (the scale that difference compares to).
        top_two_margin: the parallel pass's top logit minus its second.
        token_by_token_top_logit_gap: the parallel pass's top logit minus its logit of the token-by-token top token.
        probs_max_abs_diff: the same for softmax probabilities.
        parallel_top_token_id, token_by_token_top_token_id: argmax of each way's logits.
    """

    dtype: str
    longest_sum: int
    num_positions: int
    same_positions: bool
    key_max_abs_diff: list[float]
    value_max_abs_diff: list[float]
    key_max_abs: list[float]
    logits_max_abs_diff: float
    probs_max_abs_diff: float
    parallel_top_token_id: int
    token_by_token_top_token_id: int
    value_max_abs: list[float]
    logits_max_abs: float
    top_two_margin: float
    token_by_token_top_logit_gap: float

    @property
    def relative_diff(self) -> float:
        """The largest difference over the layer's largest value, keys and values, all layers."""
        return max(self.relative_diffs("keys") + self.relative_diffs("values"), default=math.nan)

    @property
    def relative_tolerance(self) -> float:
        """The relative difference that still counts as rounding in this dtype (``relative_tolerance_for``)."""
        return relative_tolerance_for(self.dtype, self.longest_sum)

    @property
    def logits_allowed(self) -> float:
        """The largest logits difference that passes: the relative tolerance at max |logit|."""
        return self.relative_tolerance * self.logits_max_abs

    @property
    def top_tokens_agree(self) -> bool:
        """The same top token where the top two logits are more than twice the allowed difference apart;
        in a closer race (a near tie, which rounding may decide), the token-by-token top is one of the tied."""
        if self.parallel_top_token_id == self.token_by_token_top_token_id:
            return True
        return (
            self.top_two_margin <= 2 * self.logits_allowed
            and self.token_by_token_top_logit_gap <= 2 * self.logits_allowed
        )

    def describe_tolerance(self) -> str:
        """The bound in words (dtype, steps, sums) and as a number."""
        return (
            f"{rounding.describe(self.dtype, rounding.TWO_FORWARDS_STEPS, self.longest_sum)}: "
            f"{self.relative_tolerance:.1e} of the largest value"
        )

    @property
    def num_layers(self) -> int:
        return len(self.key_max_abs_diff)

    @property
    def max_key_diff(self) -> float:
        return max(self.key_max_abs_diff, default=math.nan)

    @property
    def max_value_diff(self) -> float:
        return max(self.value_max_abs_diff, default=math.nan)

    def relative_diffs(self, which: str) -> list[float]:
        """Per layer, max |difference| over the layer's max |value|, of the ``"keys"`` or the ``"values"``."""
        diffs, scales = (
            (self.key_max_abs_diff, self.key_max_abs) if which == "keys"
            else (self.value_max_abs_diff, self.value_max_abs)
        )
        return [diff / scale if scale > 0 else (0.0 if diff == 0 else math.inf) for diff, scale in zip(diffs, scales)]

    @property
    def passed(self) -> bool:
        """Same positions, the same top token (or either of a near tie), and every difference within the tolerance."""
        return (
            self.same_positions
            and self.num_layers > 0
            and self.top_tokens_agree
            and self.relative_diff <= self.relative_tolerance
            and self.logits_max_abs_diff <= self.logits_allowed
        )

    def rows(self) -> list[dict]:
        """One row per layer, for downloads."""
        return [
            {"layer": i, "key_max_abs_diff": k, "key_max_abs": km, "value_max_abs_diff": v, "value_max_abs": vm,
             "key_allowed": self.relative_tolerance * km, "value_allowed": self.relative_tolerance * vm}
            for i, (k, km, v, vm) in enumerate(
                zip(self.key_max_abs_diff, self.key_max_abs, self.value_max_abs_diff, self.value_max_abs)
            )
        ]


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits.astype(np.float64) - logits.max())
    return shifted / shifted.sum()


def compare_inspections(
    parallel: Trace, token_by_token: Trace, longest_sum: int, request_id: str = REQUEST_ID
) -> EqualityCheck:
    """Compare the K/V written in every layer and the first-token logits of two inspection passes.

    Args:
        parallel: inspection trace of the one-step prefill.
        token_by_token: inspection trace of the N one-token steps.
        longest_sum: the most terms of one fp32 sum in the model's forward (``rounding.longest_sum``).
        request_id: the request to compare (both traces name it the same).

    Returns:
        The ``EqualityCheck``.
    """
    a, b = parallel.captured_qk[request_id], token_by_token.captured_qk[request_id]
    same_positions = a.positions.shape == b.positions.shape and bool(np.array_equal(a.positions, b.positions))
    if same_positions:
        key_diffs = [float(np.abs(ka - kb).max()) for ka, kb in zip(a.keys, b.keys)]  # (KVH, N, D) each
        value_diffs = [float(np.abs(va - vb).max()) for va, vb in zip(a.values, b.values)]
    else:
        key_diffs = value_diffs = [math.inf] * len(a.keys)
    logits_a = parallel.requests[request_id].first_token_logits
    logits_b = token_by_token.requests[request_id].first_token_logits
    top_two = np.sort(logits_a)[-2:]
    return EqualityCheck(
        dtype=parallel.dtype,
        longest_sum=longest_sum,
        num_positions=len(a.positions),
        same_positions=same_positions,
        key_max_abs_diff=key_diffs,
        value_max_abs_diff=value_diffs,
        key_max_abs=[float(np.abs(k).max()) for k in a.keys],
        logits_max_abs_diff=float(np.abs(logits_a - logits_b).max()),
        probs_max_abs_diff=float(np.abs(_softmax(logits_a) - _softmax(logits_b)).max()),
        parallel_top_token_id=int(logits_a.argmax()),
        token_by_token_top_token_id=int(logits_b.argmax()),
        value_max_abs=[float(np.abs(v).max()) for v in a.values],
        logits_max_abs=float(np.abs(logits_a).max()),
        top_two_margin=float(top_two[-1] - top_two[0]),
        token_by_token_top_logit_gap=float(logits_a.max() - logits_a[int(logits_b.argmax())]),
    )
