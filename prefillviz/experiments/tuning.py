"""What tuning buys: one prompt's prefill on the engine's two backends, measured side by side.

The textbook backend runs every op in plain torch (``engine/backend.py``); the measured one runs
the kernels this machine ran fastest (``backends/measured.py``). Both run the same engine, the
same forward and the same prompt, one step each: timing passes in turns (textbook, measured,
textbook, ...), so a slow moment of the machine slows a pass of each rather than every pass of
one. Each side keeps its median pass's per-layer clocks and what its step ran.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from prefillviz.backends.measured import MEASURED
from prefillviz.engine.backend import Backend, TorchBackend
from prefillviz.experiments.one_request import OnePrompt
from prefillviz.machine.load import LoadReading, MachineLoad
from prefillviz.machine.progress import FractionProgress, ProgressCounter

BACKENDS: dict[str, Backend] = {"textbook": TorchBackend(), "measured": MEASURED}
PARTS = ("attention", "mlp", "norms", "other")


@dataclass
class BackendRun:
    """One backend's passes over the prompt."""

    name: str
    ttft_runs_s: list[float]  # every timing pass's time to first token, in run order
    # the median pass's time in attention, MLP, norms and the rest of the layers, summed over layers
    parts_ms: dict[str, float]
    ran: dict[str, str]  # what the step ran (``StepRecord.ran``)

    @property
    def ttft_s(self) -> float:
        return statistics.median(self.ttft_runs_s)


@dataclass
class BackendComparison:
    model_id: str
    device: str
    dtype: str
    num_tokens: int
    runs: dict[str, BackendRun]
    machine_load: LoadReading

    @property
    def speedup(self) -> float:
        """The textbook's median time to first token over the measured backend's."""
        return self.runs["textbook"].ttft_s / self.runs["measured"].ttft_s

    def rows(self) -> list[dict]:
        """One row per backend and part of the layers, in ms (a table and the figure's bars)."""
        return [
            {"backend": name, "part": part, "ms": run.parts_ms[part]}
            for name, run in self.runs.items() for part in PARTS
        ]

    def as_dict(self) -> dict:
        return {
            "model": self.model_id, "device": self.device, "dtype": self.dtype, "num_tokens": self.num_tokens,
            "speedup": self.speedup, "machine_load": self.machine_load.as_dict(),
            "runs": {
                name: {"ttft_runs_s": run.ttft_runs_s, "parts_ms": run.parts_ms, "ran": run.ran}
                for name, run in self.runs.items()
            },
        }


def compare_backends(
    loaded, prompt: str | list[int], timing_runs: int = 5, progress: FractionProgress | None = None
) -> BackendComparison:
    """One untimed pass of each backend, then ``timing_runs`` timing passes of each, in turns.

    Raises:
        RequestError: an empty prompt, or one too long for the model or the KV cache.
    """
    counter = ProgressCounter(progress, len(BACKENDS) * (timing_runs + 1))
    passes = {
        name: OnePrompt(
            loaded.model, loaded.tokenizer, prompt, capture_level="timing", model_id=loaded.model_id, backend=backend
        )
        for name, backend in BACKENDS.items()
    }
    traces: dict[str, list] = {name: [] for name in BACKENDS}
    with MachineLoad() as load:
        for name, one_pass in passes.items():
            counter.advance(f"warming up the {name} backend")
            one_pass()
        for index in range(timing_runs):
            for name, one_pass in passes.items():
                counter.advance(f"timing pass {index + 1} of {timing_runs}: the {name} backend")
                traces[name].append(one_pass())
    runs = {}
    for name, passes_of_backend in traces.items():
        ttfts = [trace.requests[request_id].time_to_first_token_s for trace, request_id in passes_of_backend]
        median_pass = sorted(range(len(ttfts)), key=ttfts.__getitem__)[(len(ttfts) - 1) // 2]
        trace, request_id = passes_of_backend[median_pass]
        # the pass's own steps: its engine keeps the earlier passes' too
        steps = [s for s in trace.steps if any(c.request_id == request_id for c in s.chunks)]
        parts = {part: 0.0 for part in PARTS}
        for step in steps:
            times = step.layer_times
            for part, values in zip(PARTS, (times.attention_s, times.mlp_s, times.norms_s, times.other_s)):
                parts[part] += 1e3 * sum(values)
        runs[name] = BackendRun(name, ttfts, parts, dict(steps[-1].ran or {}))
    trace = traces["measured"][0][0]
    num_tokens = len(trace.requests[traces["measured"][0][1]].prompt_token_ids)
    return BackendComparison(loaded.model_id, trace.device, trace.dtype, num_tokens, runs, load.reading)
