"""Which pass measured a number: the engine's capture levels as captions name them.

Capturing costs time, so a number shown always says which kind of run it came from
(``instrument.capture`` has the levels themselves):

    capture level   pass                    what it captured
    none            timing pass             nothing
    timing          timing pass             per-layer clocks
    inspect         inspection pass         KV write log, q/k/v (slower)
    profile         under torch.profiler    the profiler's own cost included (slowest)
"""

from __future__ import annotations

TIMING_PASS = "timing pass"
INSPECTION_PASS = "inspection pass"
PROFILER_PASS = "under torch.profiler"

PASSES = {  # capture level: (the pass, what it captured)
    "none": (TIMING_PASS, "nothing captured"),
    "timing": (TIMING_PASS, "per-layer clocks"),
    "inspect": (INSPECTION_PASS, "KV log, q/k captured; slower"),
    "profile": (PROFILER_PASS, "slowest: includes the profiler's own cost"),
}


def pass_label(capture_level: str, runs: int | None = None, short: bool = False) -> str:
    """The pass a number came from, for captions (long) and figure subtitles (short).

    Args:
        capture_level: the engine's capture level ("none", "timing", "inspect", "profile").
        runs: the number is a median over this many passes (None: one pass).
        short: only the pass, no detail of what it captured.

    ``pass_label("timing", 5)`` is ``"timing pass (per-layer clocks, median of 5)"``;
    ``pass_label("timing", 5, short=True)`` is ``"timing pass, median of 5"``.
    """
    name, detail = PASSES.get(capture_level, (capture_level, ""))
    median = f"median of {runs}" if runs is not None else ""
    if short:
        return ", ".join(part for part in (name, median) if part)
    inside = ", ".join(part for part in (detail, median) if part)
    return f"{name} ({inside})" if inside else name


def median_of_passes(runs: int, capture_level: str = "timing") -> str:
    """``"median of 5 timing passes"`` (``"median of 1 timing pass"``); a timing or inspection pass."""
    return f"median of {runs} {PASSES[capture_level][0]}{'es' if runs > 1 else ''}"


# by ``StepRecord.ran["backend"]``
OPS_LABELS = {"torch": "textbook ops (plain torch)", "measured": "the measured backend's ops"}


def ops_label(trace) -> str:
    """Which backend's ops a run's steps ran, for captions ('' for a trace that does not say: one saved before)."""
    backends = {step.ran["backend"] for step in trace.steps if step.ran}
    return ", ".join(OPS_LABELS.get(name, name) for name in sorted(backends))
