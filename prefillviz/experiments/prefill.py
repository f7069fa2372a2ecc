"""One prefill of one prompt, twice: a timing pass and an inspection pass.

The timing pass gives the times (TTFT and its parts, per-layer clocks); the inspection pass
records the KV writes, queries and keys that the KV-cache and attention views draw. They
are separate because capturing tensors costs time: a number shown always says which pass
it came from.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from prefillviz.config import EngineConfig
from prefillviz.engine.engine import LLMEngine
from prefillviz.engine.request import SamplingParams
from prefillviz.errors import PrefillVizError
from prefillviz.instrument.bundle import bundle_bytes, read_bundle
from prefillviz.instrument.trace import Trace
from prefillviz.models import LoadedModel


@dataclass
class PrefillResult:
    model_id: str
    prompt: str
    token_ids: list[int]
    token_texts: list[str]
    request_id: str
    timing: Trace  # capture level "timing"
    inspection: Trace | None  # capture level "inspect" (None if not asked)
    params: SamplingParams

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


def run_prefill(
    loaded: LoadedModel,
    prompt: str,
    params: SamplingParams | None = None,
    inspect: bool = True,
    config: EngineConfig | None = None,
) -> PrefillResult:
    """Prefill ``prompt`` in one step (a timing pass, then optionally an inspection pass).

    Raises:
        RequestError: empty prompt, or too long for the model or the KV memory budget.
    """
    params = params or SamplingParams()
    traces = []
    for level in ["timing", "inspect"] if inspect else ["timing"]:
        engine = LLMEngine(loaded.model, loaded.tokenizer, config or EngineConfig(token_budget=8192), model_id=loaded.model_id)
        request = engine.add_request(prompt, params)
        traces.append(engine.run(capture_level=level))
    token_ids = request.prompt_token_ids
    return PrefillResult(
        model_id=loaded.model_id,
        prompt=prompt,
        token_ids=token_ids,
        token_texts=[loaded.tokenizer.decode([t]) for t in token_ids],
        request_id=request.request_id,
        timing=traces[0],
        inspection=traces[1] if inspect else None,
        params=params,
    )


def prefill_bundle(result: PrefillResult) -> bytes:
    """The whole run as a .zip (both passes' traces and what the run was)."""
    traces = {"timing": result.timing}
    if result.inspection is not None:
        traces["inspection"] = result.inspection
    meta = {
        "kind": "prefill",
        "model_id": result.model_id,
        "prompt": result.prompt,
        "token_ids": result.token_ids,
        "token_texts": result.token_texts,
        "request_id": result.request_id,
        "params": dataclasses.asdict(result.params),
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
        model_id=meta["model_id"],
        prompt=meta["prompt"],
        token_ids=meta["token_ids"],
        token_texts=meta["token_texts"],
        request_id=meta["request_id"],
        timing=traces["timing"],
        inspection=traces.get("inspection"),
        params=SamplingParams(**params),
    )
