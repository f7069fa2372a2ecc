"""The O(N^2) wall, measured: where attention's time passes the linears' as the prompt grows to the context.

Each size is one fresh prefill of the first N tokens of the bundled book (``long_text``) on the
measured backend (the engine's real path) or the textbook ops, clocked per op (``op_timing``):
attention, linears, and the rest of the time to first token. Three things come out:

* the measured crossover: the N where attention's seconds pass the linears' (between two measured
  sizes where they cross, else from the quadratic fits of each, said to be extrapolated);
* the FLOP model's crossover (``analysis.flops``): where attention's FLOPs pass the linears'. The two
  differ by how fast each runs here: ``achieved_gflops`` says at what rate each did its FLOPs;
* TTFT = a + b N + c N^2 (``length_sweep.fit_quadratic``), with the N and N^2 terms apart.

The sweep keeps to a time budget: a size whose predicted time (the last one's, scaled by N^2) would
pass it is left out, and ``stopped`` says so.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from prefillviz.analysis.flops import engine_step_costs
from prefillviz.engine.errors import ConfigError
from prefillviz.experiments.length_sweep import QuadraticFit, fit_quadratic
from prefillviz.experiments.long_text import long_prompt_ids
from prefillviz.experiments.model_setup import device_and_dtype, model_tokenizer_and_id
from prefillviz.experiments.op_timing import TimedBackend
from prefillviz.experiments.sparse_prefill import backend_for, run_prefill
from prefillviz.machine.progress import FractionProgress

DEFAULT_WALL_SIZES = (512, 1024, 2048, 4096, 8191)  # to SmolLM2's whole context: 8,191 + the first token
DEFAULT_TIME_BUDGET_S = 180.0
WALL_BACKENDS = {"measured": "measured (the engine's real path: the dispatch's choice per step)",
                 "torch": "torch (the textbook ops)"}


@dataclass
class WallPoint:
    """One prompt length: medians over the timed runs, in seconds."""

    num_tokens: int
    ttft_s: float
    attention_s: float
    linears_s: float
    attention_per_layer_s: list[float]
    linears_per_layer_s: list[float]
    attention_flops: int
    linear_flops: int

    @property
    def rest_s(self) -> float:
        return max(0.0, self.ttft_s - self.attention_s - self.linears_s)

    @property
    def attention_share(self) -> float:
        return self.attention_s / self.ttft_s


@dataclass
class WallResult:
    model_id: str
    device: str
    dtype: str
    max_context: int | None
    points: list[WallPoint]
    ttft_fit: QuadraticFit | None
    attention_fit: QuadraticFit | None
    linears_fit: QuadraticFit | None
    measured_crossover_tokens: float | None
    crossover_extrapolated: bool
    flop_crossover_tokens: int | None
    stopped: str = ""
    backend: str = "torch (the textbook ops)"
    elapsed_s: float = 0.0
    runs: int = 1
    notes: list[str] = field(default_factory=list)

    def achieved_gflops(self) -> dict[str, float]:
        """At the largest N: the FLOP rate attention and the linears each ran at (GFLOP/s)."""
        last = self.points[-1]
        return {"attention": last.attention_flops / last.attention_s / 1e9,
                "linears": last.linear_flops / last.linears_s / 1e9}

    def as_json(self) -> dict:
        fits = {name: (vars(fit) if fit else None) for name, fit in
                (("ttft", self.ttft_fit), ("attention", self.attention_fit), ("linears", self.linears_fit))}
        return {
            "model": self.model_id, "device": self.device, "dtype": self.dtype, "backend": self.backend,
            "max_context": self.max_context, "runs": self.runs, "elapsed_s": self.elapsed_s, "stopped": self.stopped,
            "points": [{**vars(p), "rest_s": p.rest_s, "attention_share": p.attention_share} for p in self.points],
            "fits": fits, "measured_crossover_tokens": self.measured_crossover_tokens,
            "crossover_extrapolated": self.crossover_extrapolated, "flop_crossover_tokens": self.flop_crossover_tokens,
            "achieved_gflops": self.achieved_gflops() if self.points else None,
        }


def flop_crossover(model: Any, limit: int = 1 << 17) -> int | None:
    """The smallest prefill N whose attention FLOPs reach its linears' (the FLOP model; None: not below ``limit``)."""
    def attention_ahead(n: int) -> bool:
        cost = engine_step_costs(model, n, n)
        return cost.attention_flops >= cost.linear_flops

    if not attention_ahead(limit):
        return None
    low, high = 1, limit
    while low < high:
        middle = (low + high) // 2
        low, high = (low, middle) if attention_ahead(middle) else (middle + 1, high)
    return low


def measured_crossover(points: list[WallPoint], attention_fit, linears_fit) -> tuple[float | None, bool]:
    """(the N where attention's time reaches the linears', whether it is extrapolated from the fits)."""
    for a, b in zip(points, points[1:]):
        ratio_a, ratio_b = a.attention_s / a.linears_s, b.attention_s / b.linears_s
        if ratio_a < 1 <= ratio_b:  # between two measured sizes: log-log interpolation of the ratio
            share = math.log(ratio_a) / (math.log(ratio_a) - math.log(ratio_b))
            return math.exp(math.log(a.num_tokens) + share * (math.log(b.num_tokens) - math.log(a.num_tokens))), False
    if points and points[0].attention_s >= points[0].linears_s:
        return float(points[0].num_tokens), False
    if attention_fit is None or linears_fit is None:
        return None, True
    for n in range(points[-1].num_tokens, 1 << 20, 64):  # past the last size, on the fits
        if attention_fit.predict([n])[0] >= linears_fit.predict([n])[0]:
            return float(n), True
    return None, True


def run_wall(loaded_or_pair: Any, sizes=DEFAULT_WALL_SIZES, runs: int = 1,
             time_budget_s: float = DEFAULT_TIME_BUDGET_S, progress: FractionProgress | None = None,
             backend: str = "measured") -> WallResult:
    """Time each size's prefill on ``backend`` ("measured" or "torch": ``sparse_prefill.BACKENDS``; ``runs`` timed
    runs after one small warm-up), within ``time_budget_s``.

    Raises:
        ConfigError: a size outside 1 .. the model's context, or fewer than 3 sizes.
    """
    model, tokenizer, model_id = model_tokenizer_and_id(loaded_or_pair)
    context = getattr(model.config, "max_position_embeddings", None)
    sizes = sorted({int(n) for n in sizes})
    if len(sizes) < 3:
        raise ConfigError("The wall needs at least 3 prompt lengths for its fits; pick more sizes.")
    if sizes[0] < 1 or (context and sizes[-1] + 1 > context):
        raise ConfigError(f"Prompt lengths must lie in 1..{context - 1:,} (the model's context, less the first "
                          f"token), got {sizes[-1]:,}.")
    num_layers = model.config.num_hidden_layers
    started = time.perf_counter()
    say = progress or (lambda fraction, text: None)
    say(0.0, "warming up (256 tokens)")
    run_prefill(model, long_prompt_ids(tokenizer, min(256, sizes[0])), None, backend_name=backend)
    weights = [n * n for n in sizes]  # the progress bar counts work as N^2
    points, stopped, last_run_s = [], "", None
    for index, n in enumerate(sizes):
        elapsed = time.perf_counter() - started
        predicted = last_run_s * (n / points[-1].num_tokens) ** 2 * runs if last_run_s else 0.0
        if points and elapsed + predicted > time_budget_s:
            stopped = (f"stopped before N={n:,}: its {runs} run(s) would take ~{predicted:.0f} s more, past the "
                       f"{time_budget_s:.0f} s budget")
            break
        token_ids = long_prompt_ids(tokenizer, n)
        timed = []
        for run in range(runs):
            say(sum(weights[:index]) / sum(weights), f"N={n:,}: run {run + 1} of {runs}")
            timed_backend = TimedBackend(backend_for(backend, None))
            result = run_prefill(model, token_ids, None, backend=timed_backend)
            timed.append((result, timed_backend.times))
        last_run_s = statistics.median(r.ttft_s for r, _ in timed)
        cost = engine_step_costs(model, n, n)
        points.append(WallPoint(
            n, last_run_s, statistics.median(r.attention_s for r, _ in timed),
            statistics.median(r.linears_s for r, _ in timed),
            [statistics.median(t.per_layer("attention", num_layers)[i] for _, t in timed) for i in range(num_layers)],
            [statistics.median(t.per_layer("linears", num_layers)[i] for _, t in timed) for i in range(num_layers)],
            cost.attention_flops, cost.linear_flops,
        ))
    say(1.0, "fitting")
    fits = [None, None, None]
    if len(points) >= 3:
        ns = [p.num_tokens for p in points]
        fits = [fit_quadratic(ns, [getattr(p, key) for p in points]) for key in ("ttft_s", "attention_s", "linears_s")]
    crossover, extrapolated = measured_crossover(points, fits[1], fits[2])
    return WallResult(model_id, *device_and_dtype(model), context, points, *fits, crossover, extrapolated,
                      flop_crossover(model), stopped, WALL_BACKENDS[backend], time.perf_counter() - started, runs)
