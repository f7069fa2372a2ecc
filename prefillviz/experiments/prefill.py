"""One prefill of one prompt: a few timing passes and an inspection pass.

The timing passes give the times (TTFT and its parts, per-layer clocks); the headline TTFT
is their median, shown with its spread, and the trace kept is the median run's. The
inspection pass records the KV writes, queries and keys that the KV-cache and attention
views draw. They are separate because capturing tensors costs time: a number shown always
says which pass it came from (``instrument.passes``). How busy the machine was during the
timing passes (``instrument.machine_load``) is kept beside them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from prefillviz.engine.config import EngineConfig
from prefillviz.engine.errors import PrefillVizError
from prefillviz.engine.request import SamplingParams
from prefillviz.engine.trace import Trace
from prefillviz.experiments.one_request import one_request_engine
from prefillviz.experiments.prompt_run import PROMPT_FIELDS, PromptRun, prompt_fields
from prefillviz.instrument.bundle import bundle_bytes, read_bundle
from prefillviz.instrument.capture import run_captured
from prefillviz.instrument.passes import median_of_passes, ops_label
from prefillviz.loading.models import LoadedModel
from prefillviz.machine.load import LoadReading, MachineLoad

TIMING_RUNS = 5  # timing passes per prefill; the headline is their median
TIMING_BUDGET_S = 4.0  # ...fewer when they would take longer than this (a long prompt on a CPU)


@dataclass
class PrefillResult(PromptRun):
    """One prompt's prefill: its timing passes and its inspection pass (``PromptRun`` names the prompt)."""

    timing: Trace  # capture level "timing": the run with the median TTFT
    inspection: Trace | None  # capture level "inspect" (None if not asked)
    params: SamplingParams
    ttft_runs_s: list[float] = dataclasses.field(default_factory=list)  # every timing pass's TTFT, in run order
    machine_load: LoadReading | None = None  # other processes' CPU use during the timing passes

    @property
    def ttft_s(self) -> float:
        """The headline TTFT: the median timing pass's (tokenize + engine + detokenize)."""
        return self.timing.requests[self.request_id].ttft_breakdown_s["total_s"]

    def ttft_label(self) -> str:
        """What the headline TTFT is: how many timing passes, their spread, how busy the machine was."""
        runs = self.ttft_runs_s or [self.ttft_s]
        spread = f", spread {min(runs) * 1000:,.1f}-{max(runs) * 1000:,.1f} ms" if len(runs) > 1 else ""
        load = f"; {self.machine_load.label()}" if self.machine_load is not None else ""
        ops = f", {ops_label(self.timing)}" if ops_label(self.timing) else ""
        return f"{median_of_passes(len(runs))}{spread} ({self.timing.device}{ops}){load}"


def one_step_budget(loaded: LoadedModel) -> int:
    """The token budget that prefills any prompt the model takes in one step: its context (from its config),
    or the engine's default ``EngineConfig.token_budget`` for a model whose config names none."""
    return loaded.info.max_context or EngineConfig.token_budget


def run_prefill(
    loaded: LoadedModel,
    prompt: str,
    params: SamplingParams | None = None,
    inspect: bool = True,
    token_budget: int | None = None,
    timing_runs: int = TIMING_RUNS,
) -> PrefillResult:
    """Prefill ``prompt`` in one step: an untimed pass, ``timing_runs`` timing passes, then optionally an
    inspection pass.

    Args:
        loaded: the model.
        prompt: the prompt text.
        params: sampling settings of the first token.
        inspect: also run the inspection pass (KV write log, q/k for attention maps).
        token_budget: tokens per step; None: ``one_step_budget`` (the whole prompt in one step).
        timing_runs: timing passes; fewer when they would take over ``TIMING_BUDGET_S`` (at least one).

    Raises:
        RequestError: empty prompt, or too long for the model or the KV memory budget.
    """
    params = params or SamplingParams()
    token_budget = token_budget or one_step_budget(loaded)

    def one_pass(level: str):
        engine = one_request_engine(loaded.model, loaded.tokenizer, token_budget, model_id=loaded.model_id)
        request = engine.add_request(prompt, params)
        return request, run_captured(engine, capture_level=level)

    timings = []
    with MachineLoad() as load:
        one_pass("none")  # untimed: the first pass after a pause or a page rerun runs on cold caches and a busy browser
        while len(timings) < max(1, timing_runs) and (not timings or load.elapsed_s < TIMING_BUDGET_S):
            request, trace = one_pass("timing")
            timings.append(trace)
    ttfts = [t.requests[request.request_id].ttft_breakdown_s["total_s"] for t in timings]
    median_run = sorted(range(len(timings)), key=ttfts.__getitem__)[(len(timings) - 1) // 2]
    inspection = one_pass("inspect")[1] if inspect else None
    return PrefillResult(
        **prompt_fields(loaded.model_id, loaded.tokenizer, prompt, request),
        timing=timings[median_run],
        inspection=inspection,
        params=params,
        ttft_runs_s=ttfts,
        machine_load=load.reading,
    )


def prefill_bundle(result: PrefillResult) -> bytes:
    """The whole run as a .zip (both passes' traces and what the run was)."""
    traces = {"timing": result.timing}
    if result.inspection is not None:
        traces["inspection"] = result.inspection
    meta = {
        "kind": "prefill",
        **result.prompt_fields(),
        "params": dataclasses.asdict(result.params),
        "ttft_runs_s": result.ttft_runs_s,
        "machine_load": dataclasses.asdict(result.machine_load) if result.machine_load is not None else None,
    }
    return bundle_bytes(traces, meta)


def load_prefill_bundle(data: bytes) -> PrefillResult:
    """A ``PrefillResult`` from a bundle made by ``prefill_bundle`` (no model needed).

    Raises:
        PrefillVizError: not a prefill bundle.
    """
    traces, meta = read_bundle(data)
    if meta.get("kind") != "prefill" or "timing" not in traces:
        raise PrefillVizError("This bundle is not a prefill run.")
    params = meta["params"]
    params["stop_token_ids"] = tuple(params.get("stop_token_ids", ()))
    return PrefillResult(
        **{name: meta[name] for name in PROMPT_FIELDS},
        timing=traces["timing"],
        inspection=traces.get("inspection"),
        params=SamplingParams(**params),
        ttft_runs_s=list(meta.get("ttft_runs_s", [])),  # bundles saved before these were kept have neither
        machine_load=LoadReading(**meta["machine_load"]) if meta.get("machine_load") else None,
    )
