"""Time to first token against the prompt length N, both ways, with a quadratic fit each.

Every run is a fresh request on a fresh engine (``ways.run_way``: prefix cache off, capture
``"none"``). The medians are fitted by ``t = a + b N + c N^2`` with a, b, c >= 0: ``a`` the
fixed cost of a request, ``b`` the cost per token, ``c`` the part that grows with N^2.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from prefillviz.analysis.model_shape import model_shape
from prefillviz.engine.errors import ConfigError
from prefillviz.experiments.model_setup import device_and_dtype, model_tokenizer_and_id, token_ids_of_length
from prefillviz.experiments.ways import PARALLEL, TOKEN_BY_TOKEN, run_way, time_to_first_token_s, warm_up_both_ways
from prefillviz.machine.progress import FractionProgress, ProgressCounter

DEFAULT_PARALLEL_SIZES = (16, 32, 64, 128, 256)
DEFAULT_SEQUENTIAL_SIZES = (4, 8, 16, 24, 32)


@dataclass
class QuadraticFit:
    """Least-squares fit ``t = a + b N + c N^2`` with a, b, c >= 0 (t in seconds, N in tokens).

    ``a`` is the fixed cost per request, ``b`` the cost per token, ``c`` the part that grows
    with N^2 (causal attention: token i attends to i keys). None can be negative: no cost
    shrinks as the prompt grows, so a negative value would only be fitting noise.
    """

    a_s: float
    b_s_per_token: float
    c_s_per_token2: float
    r_squared: float

    def predict(self, num_tokens: Sequence[float] | np.ndarray) -> np.ndarray:
        n = np.asarray(num_tokens, dtype=float)
        return self.a_s + self.b_s_per_token * n + self.c_s_per_token2 * n**2


def fit_quadratic(num_tokens: Sequence[float], times_s: Sequence[float]) -> QuadraticFit:
    """Non-negative least squares ``t = a + b N + c N^2`` over the measured points.

    With three coefficients, non-negative least squares is solved exactly by trying every
    subset of them: ordinary least squares on the subset, kept if no coefficient is
    negative; the feasible subset with the smallest squared error wins.

    Raises:
        ConfigError: fewer than 3 different N (three coefficients need three points).
    """
    n = np.asarray(num_tokens, dtype=float)
    t = np.asarray(times_s, dtype=float)
    if len(np.unique(n)) < 3:
        raise ConfigError("The fit t = a + bN + cN² needs at least 3 different prompt lengths N; pick more sizes.")
    design = np.stack([np.ones_like(n), n, n**2], axis=1)  # (points, 3): columns 1, N, N^2
    best, best_error = np.zeros(3), float((t**2).sum())
    for subset in ([0, 1, 2], [0, 1], [0, 2], [1, 2], [0], [1], [2]):
        solution, *_ = np.linalg.lstsq(design[:, subset], t, rcond=None)
        if (solution < 0).any():
            continue
        coefficients = np.zeros(3)
        coefficients[subset] = solution
        error = float(((t - design @ coefficients) ** 2).sum())
        if error < best_error:
            best, best_error = coefficients, error
    spread = float(((t - t.mean()) ** 2).sum())
    r_squared = 1.0 - best_error / spread if spread > 0 else 1.0
    return QuadraticFit(float(best[0]), float(best[1]), float(best[2]), r_squared)


@dataclass
class LengthPoint:
    """One prompt length of the sweep, one way: its time to first token over the timed runs."""

    way: str
    num_tokens: int
    num_steps: int
    time_to_first_token_s: float  # median over the timed runs
    runs_s: list[float]


@dataclass
class SweepResult:
    """Time to first token against N, both ways, with their quadratic fits (timing passes)."""

    model_id: str
    device: str
    dtype: str
    points: dict[str, list[LengthPoint]]  # way -> points in N order
    fits: dict[str, QuadraticFit]

    def rows(self) -> list[dict]:
        rows = []
        for way, points in self.points.items():
            fit = self.fits[way]
            for p in points:
                rows.append(
                    {
                        "way": way,
                        "num_tokens": p.num_tokens,
                        "num_steps": p.num_steps,
                        "time_to_first_token_s": p.time_to_first_token_s,
                        "fitted_s": float(fit.predict([p.num_tokens])[0]),
                        "runs_s": p.runs_s,
                    }
                )
        return rows

    def fit_rows(self) -> list[dict]:
        return [
            {
                "way": way, "a_s": f.a_s, "b_s_per_token": f.b_s_per_token, "c_s_per_token2": f.c_s_per_token2,
                "r_squared": f.r_squared,
            }
            for way, f in self.fits.items()
        ]


def _check_sizes(name: str, sizes: Sequence[int], limit: float) -> list[int]:
    sizes = sorted({int(n) for n in sizes})
    if len(sizes) < 3:
        raise ConfigError(
            f"The {name} sweep needs at least 3 different prompt lengths for the fit t = a + bN + cN²; pick more sizes."
        )
    if sizes[0] < 1 or sizes[-1] + 1 > limit:
        raise ConfigError(f"The {name} sweep's prompt lengths must lie in 1..{int(limit) - 1}.")
    return sizes


def run_sweep(
    loaded_or_pair: Any,
    parallel_sizes: Sequence[int] = DEFAULT_PARALLEL_SIZES,
    sequential_sizes: Sequence[int] = DEFAULT_SEQUENTIAL_SIZES,
    parallel_runs: int = 3,
    sequential_runs: int = 1,
    progress: FractionProgress | None = None,
) -> SweepResult:
    """Time to first token for N prompt tokens, parallel (1 step) and token by token (N steps).

    Prompts are ``token_ids_of_length`` (real prose). Each parallel size gets one untimed
    warm-up run of its shape first; the median of the timed runs is fitted.

    Raises:
        ConfigError: fewer than 3 different sizes for a way, or a size outside the model's context.
    """
    model, tokenizer, model_id = model_tokenizer_and_id(loaded_or_pair)
    info = model_shape(model)
    limit = info.max_context or math.inf
    parallel_sizes = _check_sizes(PARALLEL, parallel_sizes, limit)
    sequential_sizes = _check_sizes(TOKEN_BY_TOKEN, sequential_sizes, limit)
    parallel_runs, sequential_runs = max(1, parallel_runs), max(1, sequential_runs)
    counter = ProgressCounter(
        progress, len(parallel_sizes) * (parallel_runs + 1) + sum(sequential_sizes) * sequential_runs
    )

    counter.advance("warming up", 0)
    warm_up_both_ways(model, tokenizer, token_ids_of_length(tokenizer, info.vocab_size, 8))
    points: dict[str, list[LengthPoint]] = {PARALLEL: [], TOKEN_BY_TOKEN: []}
    for n in parallel_sizes:
        token_ids = token_ids_of_length(tokenizer, info.vocab_size, n)
        traces = []
        for run in range(parallel_runs + 1):  # run 0 warms up this shape
            traces.append(run_way(model, tokenizer, token_ids, token_budget=n))
            counter.advance(f"parallel N={n}: run {run + 1} of {parallel_runs + 1} (the first warms up)")
        points[PARALLEL].append(_length_point(PARALLEL, n, traces[1:]))
    for n in sequential_sizes:
        token_ids = token_ids_of_length(tokenizer, info.vocab_size, n)
        traces = []
        for run in range(sequential_runs):
            label = f"token-by-token N={n}, run {run + 1}"
            # the lambda is called during this run
            on_step = counter.per_step(lambda step: f"{label}: step {step} of {n}")  # noqa: B023
            traces.append(run_way(model, tokenizer, token_ids, 1, progress=on_step))
        points[TOKEN_BY_TOKEN].append(_length_point(TOKEN_BY_TOKEN, n, traces))
    fits = {
        way: fit_quadratic([p.num_tokens for p in way_points], [p.time_to_first_token_s for p in way_points])
        for way, way_points in points.items()
    }
    return SweepResult(model_id, *device_and_dtype(model), points, fits)


def _length_point(way: str, num_tokens: int, timed_traces: list) -> LengthPoint:
    times = [time_to_first_token_s(trace) for trace in timed_traces]
    return LengthPoint(way, num_tokens, timed_traces[-1].num_steps, statistics.median(times), times)
