"""Where prefill turns compute-bound: the knee of time to first token against N at small N.

A prefill step reads every weight once, whatever N is; its FLOPs grow with N. While the weight
read takes longer than the math, TTFT is flat (memory-bound); past the point where they are
equal it grows with N (compute-bound):

    TTFT                          /
      |                         /      <- compute-bound: ~ b·(N - knee)
      |________________________/
      |  flat: reading weights  ^ knee
      +------------------------------- N

The knee is fitted to the medians by ``t = a + b·max(0, N - k)`` (least squares over k, and a,
b >= 0 for each k). The roofline predicts it: the N whose step intensity (FLOPs / bytes, from the
FLOP model) reaches this machine's ridge point (measured peak FLOP/s / measured bandwidth). The
Sarathi-Serve paper's Figure 2 shows the same on an A100: time per prompt token falls until about
512 tokens, then stays flat. Every run is one fresh request (``ways.run_way``, capture "none").
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import numpy as np

from prefillviz.analysis.flops import model_costs
from prefillviz.analysis.machine_peaks import MachinePeaks
from prefillviz.analysis.model_shape import model_shape
from prefillviz.engine.errors import ConfigError
from prefillviz.experiments.model_setup import device_and_dtype, model_tokenizer_and_id, token_ids_of_length
from prefillviz.experiments.ways import run_way, time_to_first_token_s, warm_up_both_ways
from prefillviz.machine.progress import FractionProgress, ProgressCounter

DEFAULT_SIZES = (8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512)


@dataclass
class KneeFit:
    """``t = a + b·max(0, N - knee)``: ``a`` the flat part (ms), ``b`` ms per token past the knee."""

    knee_tokens: float
    flat_ms: float
    ms_per_token: float
    r_squared: float

    def predict(self, num_tokens) -> np.ndarray:
        n = np.asarray(num_tokens, dtype=float)
        return self.flat_ms + self.ms_per_token * np.maximum(0.0, n - self.knee_tokens)


def fit_knee(num_tokens: list[int], times_ms: list[float]) -> KneeFit:
    """The hinge fit over candidate knees between the smallest and the largest N (every 1/8 of each gap).

    Raises:
        ConfigError: fewer than 3 different N.
    """
    n, t = np.asarray(num_tokens, dtype=float), np.asarray(times_ms, dtype=float)
    if len(np.unique(n)) < 3:
        raise ConfigError("Finding a knee needs at least 3 different prompt lengths.")
    sizes = np.unique(n)
    candidates = sorted(
        {float(a + (b - a) * i / 8) for a, b in zip(sizes, sizes[1:]) for i in range(8)} | {float(sizes[-1])}
    )
    best = None
    for k in candidates:
        design = np.stack([np.ones_like(n), np.maximum(0.0, n - k)], axis=1)
        (a, b), *_ = np.linalg.lstsq(design, t, rcond=None)
        if b < 0:  # the rising part can't fall
            a, b = float(t.mean()), 0.0
        error = float(((t - (a + b * np.maximum(0.0, n - k))) ** 2).sum())
        if best is None or error < best[0] - 1e-12:
            best = (error, k, float(a), float(b))
    error, k, a, b = best
    spread = float(((t - t.mean()) ** 2).sum())
    return KneeFit(k, a, b, 1.0 - error / spread if spread > 0 else 1.0)


def ridge_tokens(info, peaks: MachinePeaks, limit: int = 1 << 16) -> int:
    """The smallest N whose one-step prefill reaches the ridge's intensity (the roofline's knee);
    ``limit`` if none below it does."""
    ridge = peaks.ridge_intensity
    if model_costs(info, limit, limit).arithmetic_intensity < ridge:
        return limit
    low, high = 1, limit
    while low < high:  # the intensity grows with N: bisect
        middle = (low + high) // 2
        if model_costs(info, middle, middle).arithmetic_intensity >= ridge:
            high = middle
        else:
            low = middle + 1
    return low


@dataclass
class KneeResult:
    model_id: str
    device: str
    dtype: str
    sizes: list[int]
    ttft_ms: list[float]  # medians, one per size
    runs_ms: list[list[float]]
    fit: KneeFit
    ridge_tokens: int | None  # None: no peaks given
    peaks: MachinePeaks | None

    def rows(self) -> list[dict]:
        fitted = self.fit.predict(self.sizes)
        return [
            {"prompt_tokens": n, "ttft_ms": t, "ttft_per_token_ms": t / n, "fitted_ms": float(f), "runs_ms": runs}
            for n, t, f, runs in zip(self.sizes, self.ttft_ms, fitted, self.runs_ms)
        ]


def check_sizes(model, sizes: list[int]) -> list[int]:
    sizes = sorted({int(n) for n in sizes})
    limit = model_shape(model).max_context or math.inf
    if len(sizes) < 3 or sizes[0] < 1 or sizes[-1] + 1 > limit:
        raise ConfigError(
            f"Pick at least 3 different prompt lengths from 1 to {limit - 1 if limit != math.inf else 'the context'}."
        )
    return sizes


def run_knee(
    loaded_or_pair, sizes=DEFAULT_SIZES, runs: int = 3, peaks: MachinePeaks | None = None,
    progress: FractionProgress | None = None,
) -> KneeResult:
    """TTFT of a one-step prefill at each N (median of ``runs`` after one untimed run of each shape).

    Raises:
        ConfigError: fewer than 3 sizes, or one outside the model's context.
    """
    model, tokenizer, model_id = model_tokenizer_and_id(loaded_or_pair)
    sizes = check_sizes(model, sizes)
    counter = ProgressCounter(progress, len(sizes) * (runs + 1))
    warm_up_both_ways(model, tokenizer, token_ids_of_length(tokenizer, model.config.vocab_size, 8))
    all_runs: dict[int, list[float]] = {n: [] for n in sizes}
    ids = {n: token_ids_of_length(tokenizer, model.config.vocab_size, n) for n in sizes}
    for run in range(runs + 1):  # sweeps interleaved: a burst of load spreads over every N; round 0 warms up
        for n in sizes:
            ttft = time_to_first_token_s(run_way(model, tokenizer, ids[n], token_budget=n)) * 1000
            if run > 0:
                all_runs[n].append(ttft)
            counter.advance(f"N={n:,}: round {run + 1} of {runs + 1} (the first warms up)")
    medians = [statistics.median(all_runs[n]) for n in sizes]
    ridge = ridge_tokens(model, peaks) if peaks is not None else None
    return KneeResult(
        model_id, *device_and_dtype(model), sizes, medians, [all_runs[n] for n in sizes], fit_knee(sizes, medians),
        ridge, peaks,
    )
