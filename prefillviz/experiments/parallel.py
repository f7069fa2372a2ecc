"""The same prompt two ways: one parallel step, or one token per step.

    parallel        token_budget >= N   ->  1 step of N tokens  (one (1, N) batch)
    token-by-token  token_budget = 1    ->  N steps of 1 token  (N (1, 1) batches)

Both are the same engine and the same model; only the budget differs. Each way runs twice:

* a **timing pass** (capture ``"none"``: no hooks, nothing copied) after a warm-up, for the
  times, the per-step latencies and tokens/s;
* an **inspection pass** (capture ``"inspect"``) that keeps the post-RoPE keys and values
  written to the KV cache in every layer, and the first-token logits, to prove both ways
  filled the same cache and predict the same next token (within a dtype's rounding).

``run_sweep`` times the time to first token over several prompt lengths N for both ways
and fits ``t = a + b N + c N^2`` by least squares (a, b, c >= 0); ``run_roofline`` places
measured prefill and decode steps under this machine's measured roofs (``analysis.roofline``).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from prefillviz.analysis.flops import model_costs
from prefillviz.analysis.peaks import MachinePeaks
from prefillviz.analysis.peaks_history import machine_peaks
from prefillviz.analysis.roofline import RooflinePoint, measure_roofline_points
from prefillviz.devices import dtype_name
from prefillviz.errors import ConfigError, RequestError
from prefillviz.experiments.one_request import run_one
from prefillviz.instrument.machine_load import LoadReading, MachineLoad
from prefillviz.instrument.trace import Trace
from prefillviz.models import model_info
from prefillviz.progress import FractionProgress
from prefillviz.prompts import bench_token_ids

PARALLEL = "parallel"
TOKEN_BY_TOKEN = "token-by-token"
WAYS = (PARALLEL, TOKEN_BY_TOKEN)
REQUEST_ID = "prompt"

TOLERANCES = {"float32": 1e-3, "float16": 0.25, "bfloat16": 1.0}
"""Largest max-abs difference (keys, values, logits) that still counts as "the same".

fp32: 1e-3, as the engine-vs-HF tests. bf16 keeps 8 significant bits, so a key or logit
near 20-35 is rounded to steps of 0.125-0.25; a different matmul shape (N rows vs 1 row)
flips some roundings, and the flips add up over the layers. fp16 keeps 11 bits (8x finer).
"""

DEFAULT_PARALLEL_SIZES = (16, 32, 64, 128, 256)
DEFAULT_SEQUENTIAL_SIZES = (4, 8, 16, 24, 32)
DEFAULT_ROOFLINE_PREFILL_SIZES = (16, 64, 256)
DEFAULT_ROOFLINE_DECODE_CONTEXTS = (64, 256)



# ---------------------------------------------------------------- shared helpers
def _model_and_tokenizer(loaded_or_pair: Any) -> tuple[Any, Any, str]:
    """(model, tokenizer, model id) from a ``LoadedModel`` or a ``(model, tokenizer)`` pair."""
    if isinstance(loaded_or_pair, tuple):
        model, tokenizer = loaded_or_pair
        return model, tokenizer, getattr(model.config, "name_or_path", "") or type(model).__name__
    return loaded_or_pair.model, loaded_or_pair.tokenizer, loaded_or_pair.model_id


def _device_and_dtype(model: Any) -> tuple[str, str]:
    parameter = next(model.parameters())
    return str(parameter.device), dtype_name(parameter.dtype)


def _run_once(model: Any, tokenizer: Any, token_ids: list[int], token_budget: int, capture_level: str = "none", progress=None) -> Trace:
    """One request of ``token_ids`` generating its first token only, on a fresh engine."""
    return run_one(model, tokenizer, token_ids, token_budget, capture_level, progress, request_id=REQUEST_ID)[0]


def _warm_up(model: Any, tokenizer: Any, token_ids: list[int]) -> None:
    """First-call costs out of the way: one parallel step of these tokens, and 2 one-token steps."""
    _run_once(model, tokenizer, token_ids, token_budget=len(token_ids))
    _run_once(model, tokenizer, token_ids[:2], token_budget=1)


def tolerance_for(dtype: str) -> float:
    """The max-abs difference allowed between the two ways in this dtype (see ``TOLERANCES``)."""
    return TOLERANCES.get(dtype_name(dtype), TOLERANCES["bfloat16"])


def sweep_token_ids(tokenizer: Any, vocab_size: int, num_tokens: int) -> list[int]:
    """``num_tokens`` ids of real prose (``prompts.BENCH_TEXT``); a fixed id pattern without a tokenizer."""
    if tokenizer is not None:
        return bench_token_ids(tokenizer, num_tokens)
    return [(7 * i + 3) % vocab_size for i in range(num_tokens)]


# ---------------------------------------------------------------- the equality proof
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
    )


# ---------------------------------------------------------------- one prompt, both ways
@dataclass
class WayRun:
    """One way of prefilling the prompt: its timing pass (kept) and how the inspection pass went.

    Attributes:
        way: ``"parallel"`` or ``"token-by-token"``.
        token_budget: the engine's token budget (N or 1).
        timing: the timing pass kept (capture ``"none"``); for parallel, the run with the
            median time to first token.
        timing_runs_s: time to first token of every timing run.
        inspection_num_steps: steps the inspection pass took (N or 1, like the timing pass).
        inspection_time_s: the inspection pass's time to first token (slower: it copies tensors).
    """

    way: str
    token_budget: int
    timing: Trace
    timing_runs_s: list[float]
    inspection_num_steps: int
    inspection_time_s: float

    @property
    def record(self):
        return self.timing.requests[REQUEST_ID]

    @property
    def num_steps(self) -> int:
        return self.timing.num_steps

    @property
    def time_to_first_token_s(self) -> float:
        """Request arrival (already tokenized) to its first token sampled: all N or 1 steps."""
        return self.record.time_to_first_token_s

    @property
    def step_wall_times_s(self) -> list[float]:
        return [step.wall_time_s for step in self.timing.steps]

    @property
    def forward_time_s(self) -> float:
        """Model forward time summed over the steps."""
        return sum(step.forward_time_s for step in self.timing.steps)

    @property
    def tokens_per_s(self) -> float:
        """Prompt tokens processed per second of time to first token."""
        return self.record.num_prompt_tokens / self.time_to_first_token_s


@dataclass
class ParallelComparison:
    """One prompt prefilled both ways, timed and checked. Built by ``run_both_ways``."""

    model_id: str
    device: str
    dtype: str
    prompt: str
    token_ids: list[int]
    num_prompt_tokens_before_cut: int  # the prompt's length before ``max_tokens`` cut it
    parallel: WayRun
    token_by_token: WayRun
    equality: EqualityCheck
    roofline_points: list[RooflinePoint] = field(default_factory=list)  # this prompt, both ways
    machine_load: LoadReading | None = None  # other processes' CPU use during the timing passes

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def ratio(self) -> float:
        """Token-by-token time to first token over parallel's."""
        return self.token_by_token.time_to_first_token_s / self.parallel.time_to_first_token_s

    def way(self, name: str) -> WayRun:
        return self.parallel if name == PARALLEL else self.token_by_token

    def step_rows(self) -> list[dict]:
        """Every timed step of both ways (timing pass), for downloads."""
        rows = []
        for run in (self.parallel, self.token_by_token):
            for step in run.timing.steps:
                rows.append(
                    {
                        "way": run.way,
                        "step": step.step_index + 1,
                        "tokens": step.num_scheduled_tokens,
                        "start_ms": step.start_time_s * 1e3,
                        "wall_time_ms": step.wall_time_s * 1e3,
                        "forward_time_ms": step.forward_time_s * 1e3,
                    }
                )
        return rows

    def summary(self) -> dict:
        """JSON-ready headline numbers."""
        return {
            "model": self.model_id,
            "device": self.device,
            "dtype": self.dtype,
            "num_prompt_tokens": self.num_tokens,
            "ratio_token_by_token_over_parallel": self.ratio,
            **{
                run.way: {
                    "token_budget": run.token_budget,
                    "num_steps": run.num_steps,
                    "time_to_first_token_s": run.time_to_first_token_s,
                    "timing_runs_s": run.timing_runs_s,
                    "forward_time_s": run.forward_time_s,
                    "tokens_per_s": run.tokens_per_s,
                    "inspection_num_steps": run.inspection_num_steps,
                }
                for run in (self.parallel, self.token_by_token)
            },
            "equality": {
                "tolerance": self.equality.tolerance,
                "passed": self.equality.passed,
                "max_key_diff": self.equality.max_key_diff,
                "max_value_diff": self.equality.max_value_diff,
                "logits_max_abs_diff": self.equality.logits_max_abs_diff,
                "probs_max_abs_diff": self.equality.probs_max_abs_diff,
            },
        }


def prompt_token_ids(tokenizer: Any, prompt: str | list[int], max_tokens: int | None = None) -> tuple[list[int], int]:
    """The prompt's token ids, cut to the first ``max_tokens``; and its length before the cut.

    Raises:
        RequestError: the prompt is empty, or text was given without a tokenizer.
    """
    if isinstance(prompt, str):
        if not prompt.strip():
            raise RequestError("The prompt is empty: type some text to run the model on.")
        if tokenizer is None:
            raise RequestError("This model has no tokenizer: give the prompt as token ids.")
        token_ids = list(tokenizer(prompt)["input_ids"])
    else:
        token_ids = [int(t) for t in prompt]
    if not token_ids:
        raise RequestError("The prompt is empty: it has no tokens.")
    if max_tokens is not None and max_tokens < 1:
        raise ConfigError(f"The token limit must be at least 1, got {max_tokens}.")
    return token_ids[:max_tokens] if max_tokens else token_ids, len(token_ids)


def _prompt_roofline_points(model: Any, parallel: WayRun, token_by_token: WayRun, num_tokens: int) -> list[RooflinePoint]:
    """This prompt on the roofline: the parallel step, and all token-by-token steps together
    (their FLOPs, bytes and forward times summed)."""
    cost = model_costs(model, num_tokens, num_tokens)
    flops, bytes_ = 0, 0
    for step in token_by_token.timing.steps:
        chunk = step.chunks[0]  # the one request's token: position chunk.start_position
        step_cost = model_costs(model, chunk.num_tokens, chunk.start_position + chunk.num_tokens)
        flops, bytes_ = flops + step_cost.total_flops, bytes_ + step_cost.total_bytes
    measured = [
        (f"this prompt, parallel (1 step, N={num_tokens})", PARALLEL, cost.total_flops, cost.total_bytes, parallel.forward_time_s),
        (f"this prompt, token-by-token ({token_by_token.num_steps} steps together)", TOKEN_BY_TOKEN, flops, bytes_, token_by_token.forward_time_s),
    ]
    return [
        RooflinePoint(
            label=label,
            phase=phase,
            num_tokens=num_tokens,
            context_len=num_tokens,
            flops=step_flops,
            bytes=step_bytes,
            intensity=step_flops / step_bytes,
            measured_time_s=time_s,
            achieved_gflops=step_flops / time_s / 1e9,
        )
        for label, phase, step_flops, step_bytes, time_s in measured
    ]


def run_both_ways(
    loaded_or_pair: Any,
    prompt: str | list[int],
    max_tokens: int | None = None,
    parallel_timing_runs: int = 3,
    progress: FractionProgress | None = None,
) -> ParallelComparison:
    """Prefill one prompt in one step and token by token: timing passes, then inspection passes.

    Order: warm-up; ``parallel_timing_runs`` parallel timing runs (the median is kept) and
    one token-by-token timing run (N steps), all capture ``"none"``; then one inspection
    pass each way (capture ``"inspect"``), compared by ``compare_inspections``.

    Args:
        loaded_or_pair: a ``LoadedModel`` or a ``(model, tokenizer)`` pair (tokenizer may be
            None when the prompt is token ids).
        prompt: text, or token ids.
        max_tokens: use only the first ``max_tokens`` tokens (None: all).
        parallel_timing_runs: timed parallel runs (cheap: one step each).
        progress: called with (fraction done, what is running).

    Raises:
        RequestError: empty prompt, or too long for the model.
    """
    model, tokenizer, model_id = _model_and_tokenizer(loaded_or_pair)
    token_ids, length_before_cut = prompt_token_ids(tokenizer, prompt, max_tokens)
    n = len(token_ids)
    runs = max(1, parallel_timing_runs)
    total_units = 1 + runs + n + 1 + n
    done = 0

    def report(text: str, units: int = 1) -> None:
        nonlocal done
        done += units
        if progress is not None:
            progress(min(1.0, done / total_units), text)

    def step_progress(pass_name: str, offset: int):
        def update(steps_done: int, _record) -> None:
            if progress is not None:
                progress(min(1.0, (offset + steps_done) / total_units), f"{pass_name}: token-by-token step {steps_done} of {n}")

        return update

    if progress is not None:
        progress(0.0, "warming up")
    _warm_up(model, tokenizer, token_ids)
    report("warm-up done")

    parallel_traces = []
    with MachineLoad() as load:
        for run in range(runs):
            parallel_traces.append(_run_once(model, tokenizer, token_ids, token_budget=n))
            report(f"timing pass: parallel run {run + 1} of {runs}")
        sequential_timing = _run_once(model, tokenizer, token_ids, 1, "none", step_progress("timing pass", done))
    parallel_times = [t.requests[REQUEST_ID].time_to_first_token_s for t in parallel_traces]
    median_index = sorted(range(runs), key=parallel_times.__getitem__)[(runs - 1) // 2]
    done += n

    parallel_inspection = _run_once(model, tokenizer, token_ids, n, "inspect")
    report("inspection pass: parallel")
    sequential_inspection = _run_once(model, tokenizer, token_ids, 1, "inspect", step_progress("inspection pass", done))
    done += n
    report("comparing the KV caches", 0)

    parallel = WayRun(
        way=PARALLEL,
        token_budget=n,
        timing=parallel_traces[median_index],
        timing_runs_s=parallel_times,
        inspection_num_steps=parallel_inspection.num_steps,
        inspection_time_s=parallel_inspection.requests[REQUEST_ID].time_to_first_token_s,
    )
    token_by_token = WayRun(
        way=TOKEN_BY_TOKEN,
        token_budget=1,
        timing=sequential_timing,
        timing_runs_s=[sequential_timing.requests[REQUEST_ID].time_to_first_token_s],
        inspection_num_steps=sequential_inspection.num_steps,
        inspection_time_s=sequential_inspection.requests[REQUEST_ID].time_to_first_token_s,
    )
    device, dtype = _device_and_dtype(model)
    return ParallelComparison(
        model_id=model_id,
        device=device,
        dtype=dtype,
        prompt=prompt if isinstance(prompt, str) else "",
        token_ids=token_ids,
        num_prompt_tokens_before_cut=length_before_cut,
        parallel=parallel,
        token_by_token=token_by_token,
        equality=compare_inspections(parallel_inspection, sequential_inspection),
        roofline_points=_prompt_roofline_points(model, parallel, token_by_token, n),
        machine_load=load.reading,
    )


# ---------------------------------------------------------------- the N sweep
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
            {"way": way, "a_s": f.a_s, "b_s_per_token": f.b_s_per_token, "c_s_per_token2": f.c_s_per_token2, "r_squared": f.r_squared}
            for way, f in self.fits.items()
        ]


def _check_sizes(name: str, sizes: Sequence[int], limit: float) -> list[int]:
    sizes = sorted({int(n) for n in sizes})
    if len(sizes) < 3:
        raise ConfigError(f"The {name} sweep needs at least 3 different prompt lengths for the fit t = a + bN + cN²; pick more sizes.")
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

    Prompts are ``sweep_token_ids`` (real prose). Every run is a fresh request on a fresh
    engine with prefix caching off, capture ``"none"``; each parallel size gets one untimed
    warm-up run of its shape first; the median of the timed runs is fitted.

    Raises:
        ConfigError: fewer than 3 different sizes for a way, or a size outside the model's context.
    """
    model, tokenizer, model_id = _model_and_tokenizer(loaded_or_pair)
    info = model_info(model)
    limit = info.max_context or math.inf
    parallel_sizes = _check_sizes(PARALLEL, parallel_sizes, limit)
    sequential_sizes = _check_sizes(TOKEN_BY_TOKEN, sequential_sizes, limit)
    parallel_runs, sequential_runs = max(1, parallel_runs), max(1, sequential_runs)
    total_units = len(parallel_sizes) * (parallel_runs + 1) + sum(sequential_sizes) * sequential_runs
    done = 0

    def tell(text: str) -> None:
        if progress is not None:
            progress(min(1.0, done / total_units), text)

    tell("warming up")
    _warm_up(model, tokenizer, sweep_token_ids(tokenizer, info.vocab_size, 8))
    points: dict[str, list[LengthPoint]] = {PARALLEL: [], TOKEN_BY_TOKEN: []}
    for n in parallel_sizes:
        token_ids = sweep_token_ids(tokenizer, info.vocab_size, n)
        times = []
        for run in range(parallel_runs + 1):  # run 0 warms up this shape
            trace = _run_once(model, tokenizer, token_ids, token_budget=n)
            if run > 0:
                times.append(trace.requests[REQUEST_ID].time_to_first_token_s)
            done += 1
            tell(f"parallel N={n}: run {run + 1} of {parallel_runs + 1} (the first warms up)")
        points[PARALLEL].append(LengthPoint(PARALLEL, n, trace.num_steps, statistics.median(times), times))
    for n in sequential_sizes:
        token_ids = sweep_token_ids(tokenizer, info.vocab_size, n)
        times = []
        for run in range(sequential_runs):
            offset = done

            def update(steps_done: int, _record, n=n, run=run, offset=offset) -> None:
                if progress is not None:
                    progress(min(1.0, (offset + steps_done) / total_units), f"token-by-token N={n}, run {run + 1}: step {steps_done} of {n}")

            trace = _run_once(model, tokenizer, token_ids, 1, "none", update)
            times.append(trace.requests[REQUEST_ID].time_to_first_token_s)
            done += n
        points[TOKEN_BY_TOKEN].append(LengthPoint(TOKEN_BY_TOKEN, n, trace.num_steps, statistics.median(times), times))
    fits = {
        way: fit_quadratic([p.num_tokens for p in way_points], [p.time_to_first_token_s for p in way_points])
        for way, way_points in points.items()
    }
    device, dtype = _device_and_dtype(model)
    return SweepResult(model_id, device, dtype, points, fits)


# ---------------------------------------------------------------- the roofline
@dataclass
class RooflineResult:
    """The machine's measured roofs and measured engine steps placed under them."""

    model_id: str
    device: str
    dtype: str
    peaks: MachinePeaks
    points: list[RooflinePoint]

    def rows(self) -> list[dict]:
        return [
            {
                "label": p.label,
                "phase": p.phase,
                "num_tokens": p.num_tokens,
                "context_len": p.context_len,
                "gflop": p.flops / 1e9,
                "megabytes": p.bytes / 1e6,
                "intensity_flop_per_byte": p.intensity,
                "forward_time_ms": p.measured_time_s * 1e3,
                "achieved_gflops": p.achieved_gflops,
            }
            for p in self.points
        ]


def run_roofline(
    loaded_or_pair: Any,
    prefill_sizes: Sequence[int] = DEFAULT_ROOFLINE_PREFILL_SIZES,
    decode_contexts: Sequence[int] = DEFAULT_ROOFLINE_DECODE_CONTEXTS,
    runs: int = 2,
    peaks: MachinePeaks | None = None,
) -> RooflineResult:
    """Measured peaks for the model's device and dtype (cached per machine) and measured points.

    Args:
        loaded_or_pair: a ``LoadedModel`` or ``(model, tokenizer)``.
        prefill_sizes: N of the one-step prefill points.
        decode_contexts: contexts C of the decode points.
        runs: timed runs per point (median).
        peaks: use these peaks instead of ``machine_peaks`` (tests).

    Raises:
        ConfigError: no size or context given.
    """
    model, tokenizer, model_id = _model_and_tokenizer(loaded_or_pair)
    if not prefill_sizes and not decode_contexts:
        raise ConfigError("Pick at least one prefill size or decode context to measure.")
    device, dtype = _device_and_dtype(model)
    peaks = peaks or machine_peaks(device, dtype)
    points = measure_roofline_points((model, tokenizer), sorted(set(prefill_sizes)), sorted(set(decode_contexts)), runs=runs)
    return RooflineResult(model_id, device, dtype, peaks, points)
