"""The inspection run behind the KV-cache and Attention views, and what its trace recorded.

One request, run on a fresh engine at capture level ``inspect``: in one step (parallel
prefill) or in chunks of ``chunk_size`` tokens (``EngineConfig(token_budget=chunk_size)``).
The Prefill page's result carries the same kind of inspection trace, so
``from_prefill_result`` turns it into the same ``InspectionRun`` and both views read either.

The helpers below only read the trace (no model, no Streamlit; the blocks and the KV
memory they add up to are ``kv_memory``'s):

    step:       0                 1                 2          (chunk size 7, N = 20)
    packed:     [p0 .. p6]        [p7 .. p13]       [p14 .. p19]
    KV writes:  7 slots x L       7 slots x L       6 slots x L     -> (L, N) per position
    blocks:     allocate [b0]     (b0 has room)     allocate [b1]   -> b0 full, b1 4/16
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from prefillviz.analysis.attention_maps import all_head_summaries
from prefillviz.engine.errors import RequestError
from prefillviz.engine.request import SamplingParams
from prefillviz.engine.trace import StepRecord, Trace
from prefillviz.experiments.one_request import one_request_engine
from prefillviz.experiments.prefill import PrefillResult
from prefillviz.experiments.prompt_run import PromptRun, prompt_fields
from prefillviz.instrument.capture import run_captured
from prefillviz.loading.models import LoadedModel
from prefillviz.machine.progress import StepProgress

ONE_STEP_BUDGET = 1 << 20  # more tokens than any prompt: the whole prompt runs in one step
KV_QUANTITIES = {"key_norm": "key norm", "value_norm": "value norm", "bytes": "bytes written"}


@dataclass
class InspectionRun(PromptRun):
    """One prompt's inspection trace, wherever it came from (``PromptRun`` names the prompt).

    Attributes:
        trace: the run at capture level ``inspect`` (KV write log, captured q/k/v).
        chunk_size: tokens per step, or None for the whole prompt in one step.
        source: where it came from ("the Prefill page" or "this page").
    """

    trace: Trace
    chunk_size: int | None
    source: str

    @property
    def num_steps(self) -> int:
        return self.trace.num_steps


def run_inspection(
    loaded: LoadedModel,
    prompt: str,
    chunk_size: int | None = None,
    make_progress: Callable[[int], StepProgress] | None = None,
    source: str = "this page",
) -> InspectionRun:
    """Prefill ``prompt`` on a fresh engine at capture level ``inspect``.

    Args:
        loaded: the model to run.
        prompt: the prompt text.
        chunk_size: tokens per step (the engine's ``token_budget``); None or 0 runs the whole
            prompt in one step.
        make_progress: called once with the number of steps the run will take; returns the
            engine's per-step progress callback (a progress bar).
        source: recorded in the result, for captions.

    Returns:
        The ``InspectionRun``.

    Raises:
        RequestError: empty prompt, too long for the model or the KV cache.
        ConfigError: a chunk size that is not a positive whole number.
    """
    chunk_size = chunk_size or None
    token_budget = chunk_size or ONE_STEP_BUDGET
    engine = one_request_engine(loaded.model, loaded.tokenizer, token_budget, model_id=loaded.model_id)
    request = engine.add_request(prompt, SamplingParams(max_new_tokens=1))
    progress = make_progress(math.ceil(request.num_prompt_tokens / token_budget)) if make_progress else None
    trace = run_captured(engine, progress=progress, capture_level="inspect")
    return InspectionRun(
        **prompt_fields(loaded.model_id, loaded.tokenizer, prompt, request), trace=trace, chunk_size=chunk_size,
        source=source,
    )


def from_prefill_result(result: PrefillResult | None) -> InspectionRun | None:
    """The inspection pass of a ``PrefillResult`` (the Prefill page's run); None without one."""
    if result is None or result.inspection is None:
        return None
    return InspectionRun(**result.prompt_fields(), trace=result.inspection, chunk_size=None, source="the Prefill page")


# ---------------------------------------------------------------- reading the trace
def request_token_indices(step: StepRecord, request_id: str) -> np.ndarray:
    """Indices into the step's packed batch (and its KV write log) of one request's tokens."""
    offset = 0
    for chunk in step.chunks:
        if chunk.request_id == request_id:
            return np.arange(offset, offset + chunk.num_tokens)
        offset += chunk.num_tokens
    return np.arange(0)


def chunk_boundaries(trace: Trace, request_id: str) -> list[int]:
    """Start position of every prefill chunk the request ran, in step order ([0] for one step)."""
    return [
        chunk.start_position
        for step in trace.steps
        for chunk in step.chunks
        if chunk.request_id == request_id and chunk.is_prefill
    ]


def kv_write_matrix(trace: Trace, request_id: str, quantity: str = "key_norm") -> tuple[np.ndarray, np.ndarray]:
    """What each layer wrote for each position of one request, from the KV write log.

    Args:
        trace: an inspection trace.
        request_id: the request.
        quantity: ``"key_norm"`` / ``"value_norm"`` (L2 norm of the written vector, mean over
            KV heads) or ``"bytes"`` (K + V bytes written for that token in that layer).

    Returns:
        ``(positions, matrix)``: positions (N,) sorted, matrix (L, N) float64, row = layer.
    """
    if quantity not in KV_QUANTITIES:
        raise ValueError(f"quantity must be one of {', '.join(KV_QUANTITIES)}, got {quantity!r}")
    positions, columns = [], []
    for step in trace.steps:
        writes = step.kv_writes
        if writes is None:
            continue
        tokens = request_token_indices(step, request_id)
        if len(tokens) == 0:
            continue
        order = np.argsort(writes.layers_written)  # rows of the norms are in the order layers wrote
        if quantity == "bytes":
            per_token = writes.bytes_per_layer / len(writes.positions)
            column = np.full((len(writes.layers_written), len(tokens)), per_token)
        else:
            norms = writes.key_norms if quantity == "key_norm" else writes.value_norms  # (L, T, KVH)
            column = norms[order][:, tokens].mean(axis=2)
        positions.append(writes.positions[tokens])
        columns.append(column)
    if not columns:
        raise RequestError("This run has no KV write log: it was not run at capture level 'inspect'.")
    positions_all = np.concatenate(positions)
    sort = np.argsort(positions_all, kind="stable")
    return positions_all[sort], np.concatenate(columns, axis=1)[:, sort].astype(np.float64)


def kv_write_table(trace: Trace, request_id: str, quantity: str = "key_norm") -> pd.DataFrame:
    """``kv_write_matrix`` as one row per (layer, position), for downloads."""
    positions, matrix = kv_write_matrix(trace, request_id, quantity)
    num_layers = matrix.shape[0]
    return pd.DataFrame(
        {
            "layer": np.repeat(np.arange(num_layers), len(positions)), "position": np.tile(positions, num_layers),
            quantity: matrix.ravel(),
        }
    )


def attention_summaries(
    run: InspectionRun, progress: Callable[[int, int], None] | None = None
) -> dict[str, np.ndarray]:
    """Entropy, sink score and mean look-back of every head, rebuilt from the captured q/k.

    Args:
        run: an inspection run.
        progress: called with (layers done, layers) after each layer.

    Returns:
        ``all_head_summaries`` output: ``{"entropy", "sink", "mean_lookback"}`` -> (layers, heads).
    """
    captured = run.trace.captured_qk.get(run.request_id)
    if captured is None or not captured.queries:
        raise RequestError("This run has no captured queries and keys: it was not run at capture level 'inspect'.")
    layers = []
    for layer, (q, k, scaling) in enumerate(zip(captured.queries, captured.keys, captured.scaling)):
        layers.append(all_head_summaries([q], [k], [scaling]))
        if progress is not None:
            progress(layer + 1, len(captured.queries))
    return {name: np.concatenate([summary[name] for summary in layers]) for name in layers[0]}
