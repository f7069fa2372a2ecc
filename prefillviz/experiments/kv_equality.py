"""The equality proof: both ways filled the same KV cache and predict the same next token.

Two inspection passes (capture ``"inspect"``) of one prompt, one parallel and one token by
token, each keep the post-RoPE keys and values written to the KV cache in every layer and
the first-token logits; ``compare_inspections`` measures how far apart they are, and an
``EqualityCheck`` passes when every difference is within a dtype's rounding (``TOLERANCES``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from prefillviz.engine.devices import dtype_name
from prefillviz.engine.trace import Trace
from prefillviz.experiments.ways import REQUEST_ID

TOLERANCES = {"float32": 1e-3, "float16": 0.25, "bfloat16": 1.0}
"""Largest max-abs difference (keys, values, logits) that still counts as "the same".

fp32: 1e-3, as the engine-vs-HF tests. bf16 keeps 8 significant bits, so a key or logit
near 20-35 is rounded to steps of 0.125-0.25; a different matmul shape (N rows vs 1 row)
flips some roundings, and the flips add up over the layers. fp16 keeps 11 bits (8x finer).
"""

RELATIVE_ROUNDING_STEPS = 8
ACCUMULATION_FLOOR = 1e-4
"""The relative pass mark: keys and values count as "the same" when their largest difference,
over the layer's largest |K| or |V|, is within 8 rounding steps of the dtype (2^-significant
bits: bf16 8 x 2^-8 = 3%) plus 1e-4 (matmuls add in float32 in every dtype, and a different
order of a long sum moves float32 results by a few parts per million per layer). A wrong key
or value is off by about its own size (relative ~1), in any dtype and whatever the size of a
model's keys, which an absolute tolerance can't say."""
SIGNIFICANT_BITS = {"float32": 24, "float16": 11, "bfloat16": 8}


def relative_tolerance_for(dtype: str) -> float:
    """The relative difference allowed in this dtype (see ``RELATIVE_ROUNDING_STEPS``)."""
    bits = SIGNIFICANT_BITS.get(dtype_name(dtype), SIGNIFICANT_BITS["bfloat16"])
    return RELATIVE_ROUNDING_STEPS * 2.0**-bits + ACCUMULATION_FLOOR


def tolerance_for(dtype: str) -> float:
    """The max-abs difference allowed between the two ways in this dtype (see ``TOLERANCES``)."""
    return TOLERANCES.get(dtype_name(dtype), TOLERANCES["bfloat16"])


@dataclass
class EqualityCheck:
    """How far apart the two ways' KV caches and first-token logits are (inspection passes).

    Attributes:
        dtype: the model's dtype (keys and values are compared in fp32 copies of it).
        tolerance: the largest max-abs difference that passes (``TOLERANCES``).
        num_positions: prompt positions compared in every layer.
        same_positions: both ways wrote K/V for the same positions in the same order.
        key_max_abs_diff: (L,) max |K_parallel - K_token_by_token| per layer, all KV heads.
        value_max_abs_diff: (L,) the same for V.
        key_max_abs: (L,) max |K| per layer (the scale the differences compare to).
        value_max_abs: (L,) max |V| per layer.
        logits_max_abs_diff: max over the vocabulary of |logit_parallel - logit_token_by_token|.
        probs_max_abs_diff: the same for softmax probabilities.
        parallel_top_token_id, token_by_token_top_token_id: argmax of each way's logits.
    """

    dtype: str
    tolerance: float
    num_positions: int
    same_positions: bool
    key_max_abs_diff: list[float]
    value_max_abs_diff: list[float]
    key_max_abs: list[float]
    logits_max_abs_diff: float
    probs_max_abs_diff: float
    parallel_top_token_id: int
    token_by_token_top_token_id: int
    value_max_abs: list[float] = dataclasses.field(default_factory=list)

    @property
    def relative_diff(self) -> float:
        """The largest difference over the layer's largest value, keys and values, all layers."""
        pairs = list(zip(self.key_max_abs_diff, self.key_max_abs)) + list(zip(self.value_max_abs_diff, self.value_max_abs))
        return max((diff / scale if scale > 0 else (0.0 if diff == 0 else math.inf) for diff, scale in pairs), default=math.nan)

    @property
    def relative_tolerance(self) -> float:
        """The relative difference that still counts as rounding in this dtype (``relative_tolerance_for``)."""
        return relative_tolerance_for(self.dtype)

    @property
    def num_layers(self) -> int:
        return len(self.key_max_abs_diff)

    @property
    def max_key_diff(self) -> float:
        return max(self.key_max_abs_diff, default=math.nan)

    @property
    def max_value_diff(self) -> float:
        return max(self.value_max_abs_diff, default=math.nan)

    @property
    def passed(self) -> bool:
        """Same positions, same top token, and every difference below the tolerance."""
        diffs = (self.max_key_diff, self.max_value_diff, self.logits_max_abs_diff)
        return (
            self.same_positions
            and self.num_layers > 0
            and self.parallel_top_token_id == self.token_by_token_top_token_id
            and all(d < self.tolerance for d in diffs)
        )

    def rows(self) -> list[dict]:
        """One row per layer, for downloads."""
        return [
            {"layer": i, "key_max_abs_diff": k, "value_max_abs_diff": v, "key_max_abs": m, "tolerance": self.tolerance}
            for i, (k, v, m) in enumerate(zip(self.key_max_abs_diff, self.value_max_abs_diff, self.key_max_abs))
        ]


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits.astype(np.float64) - logits.max())
    return shifted / shifted.sum()


def compare_inspections(parallel: Trace, token_by_token: Trace, request_id: str = REQUEST_ID) -> EqualityCheck:
    """Compare the K/V written in every layer and the first-token logits of two inspection passes.

    Args:
        parallel: inspection trace of the one-step prefill.
        token_by_token: inspection trace of the N one-token steps.
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
    return EqualityCheck(
        dtype=parallel.dtype,
        tolerance=tolerance_for(parallel.dtype),
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
    )
