"""The ``ttft_ratio`` action: the time to first token of a short and a long prompt of real prose."""

from __future__ import annotations

import statistics

import plotly.graph_objects as go

from prefillviz.analysis import flop_facts
from prefillviz.experiments.one_request import OnePrompt
from prefillviz.figures import style
from prefillviz.lessons.actions import ActionKind, ActionOutcome
from prefillviz.lessons.kinds.common import make_outcome
from prefillviz.lessons.spec import LessonError
from prefillviz.loading.prompts import bench_token_ids
from prefillviz.machine.progress import FractionProgress


def _run_ttft_ratio(loaded, parameters: dict, report: FractionProgress, scale: float | None = None) -> ActionOutcome:
    short_n, long_n, runs = parameters["short_tokens"], parameters["long_tokens"], parameters["runs"]
    if long_n <= short_n:
        raise LessonError(f"ttft_ratio: long_tokens ({long_n}) must be larger than short_tokens ({short_n}).")
    times: dict[int, list[float]] = {short_n: [], long_n: []}
    done, total = 0, 2 * (runs + 1)
    for n in (short_n, long_n):
        token_ids = bench_token_ids(loaded.tokenizer, n)
        for run in range(runs + 1):  # run 0 warms up this shape
            report(done / total, f"{n}-token prompt: run {run + 1} of {runs + 1} (the first warms up)")
            ttft = OnePrompt(
                loaded.model, loaded.tokenizer, token_ids, max(len(token_ids), 16), model_id=loaded.model_id
            ).ttft_s()
            if run > 0:
                times[n].append(ttft)
            done += 1
    short_s, long_s = statistics.median(times[short_n]), statistics.median(times[long_n])
    flop_ratio = flop_facts.flop_ttft_ratio(loaded, short_n, long_n)  # the FLOP model, this model's shapes
    measured = {
        "short_tokens": short_n,
        "long_tokens": long_n,
        "token_ratio": long_n / short_n,
        "short_ttft_ms": short_s * 1e3,
        "long_ttft_ms": long_s * 1e3,
        "ttft_ratio": long_s / short_s,
        "flop_ttft_ratio": flop_ratio,
        "ttft_over_flop_ratio": long_s / short_s / flop_ratio,
        "attention_share_percent": 100 * flop_facts.attention_share(loaded, long_n),
        "attention_crossover_tokens": flop_facts.attention_crossover_tokens(loaded),
    }
    facts = [
        (f"TTFT, {short_n} tokens", f"{short_s * 1e3:,.1f} ms"),
        (f"TTFT, {long_n} tokens", f"{long_s * 1e3:,.1f} ms"),
        ("Tokens: long / short", f"{long_n / short_n:,.1f}×"),
        ("TTFT: long / short", f"{long_s / short_s:,.1f}×"),
        ("FLOPs: long / short (time ∝ FLOPs would give this)", f"{flop_ratio:,.1f}×"),
    ]
    return make_outcome("ttft_ratio", loaded, parameters, measured, facts, {"times": times})


def _ttft_bars_figure(outcome: ActionOutcome) -> go.Figure:
    times = outcome.raw["times"]
    labels = [f"{n} tokens" for n in times]
    values = [statistics.median(t) * 1e3 for t in times.values()]
    bars = go.Bar(
        x=labels, y=values, marker_color=style.PREFILL, text=[f"{v:,.1f} ms" for v in values], textposition="outside"
    )
    fig = go.Figure(bars)
    fig.update_yaxes(range=[0, max(values) * 1.2])
    runs = len(next(iter(times.values())))
    title = f"Time to first token (median of {runs} runs after a warm-up)"
    return style.apply_layout(fig, title, "prompt of real prose", "time to first token (ms)", height=380)


KIND = ActionKind(
    name="ttft_ratio",
    parameters={"short_tokens": (int, 32), "long_tokens": (int, 512), "runs": (int, 3)},
    scaled={"short_tokens": 4, "long_tokens": 8},
    measured=(
        "short_tokens", "long_tokens", "token_ratio", "short_ttft_ms", "long_ttft_ms", "ttft_ratio", "flop_ttft_ratio",
        "ttft_over_flop_ratio", "attention_share_percent", "attention_crossover_tokens",
    ),
    figures={"ttft_bars": _ttft_bars_figure},
    run=_run_ttft_ratio,
    description="Time to first token of a short and a long prompt of real prose (median of runs after a warm-up).",
)
