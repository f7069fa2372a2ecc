"""Warm a model through the engine's own path, so no timed run is a cold one.

The first forward after loading pays one-time costs that are not prefill: packing the
linear weights (``backends/packed_weights.py``), first-touch page faults, oneDNN building its
matmul primitives for each new shape, the capture hooks' first use. The app runs
``warm_up`` once per loaded model (inside ``st.cache_resource``), before any page measures
anything: the Prefill page's default prompt through a timing pass and an inspection pass, a
few decode steps, and a short token-by-token run, the shapes the pages use first. The
chunked and prefix experiments run ``short_warm_up`` before their timed runs.
"""

from __future__ import annotations

from prefillviz.backends.dispatch_tables import table_for
from prefillviz.experiments.one_request import run_one
from prefillviz.experiments.prefill import run_prefill
from prefillviz.loading.models import LoadedModel
from prefillviz.loading.prompts import PRESETS
from prefillviz.machine.progress import FractionProgress
from prefillviz.machine.timers import run_timed


def prepare_dispatch(loaded: LoadedModel, progress: FractionProgress | None = None,
                     buckets: tuple[str, ...] | None = None) -> None:
    """The measured backend's choice of kernels for the model: timed now (the first start on this machine),
    or read from where it was kept (``backends/dispatch_tables.py``); ``buckets``: a first start's first part."""
    table_for(loaded.model, progress=progress, buckets=buckets)


def warm_up(loaded: LoadedModel) -> float:
    """Run the engine on ``loaded`` as the pages first will; returns the seconds it took."""
    prompt = next(iter(PRESETS.values()))  # the Prefill page's default preset

    def first_runs() -> None:
        run_prefill(loaded, prompt, timing_runs=1)  # timing + inspection capture, one step
        # token by token, then decodes
        run_one(loaded.model, loaded.tokenizer, prompt, 1, "timing", max_new_tokens=4, model_id=loaded.model_id)

    return run_timed(first_runs, loaded.device)[0]


def short_warm_up(model) -> None:
    """A tiny run (32 prompt tokens, 2 new) so the first timed step doesn't pay for one-time allocations."""
    vocab_size = model.config.vocab_size
    run_one(model, None, [i % vocab_size for i in range(1, 33)], token_budget=64, max_new_tokens=2)
