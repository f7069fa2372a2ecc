"""Warm a freshly loaded model through the engine's own path, so no user sees a cold run.

The first forward after loading pays one-time costs that are not prefill: packing the
linear weights (``engine/packed_weights.py``), first-touch page faults, oneDNN building its
matmul primitives for each new shape, the capture hooks' first use. The app runs this once
per loaded model (inside ``st.cache_resource``), before any page measures anything: the
Prefill page's default prompt through a timing pass and an inspection pass, a few decode
steps, and a short token-by-token run, the shapes the pages use first.
"""

from __future__ import annotations

import time

from prefillviz.experiments.one_request import run_one
from prefillviz.experiments.prefill import run_prefill
from prefillviz.models import LoadedModel
from prefillviz.prompts import PRESETS


def warm_up(loaded: LoadedModel) -> float:
    """Run the engine on ``loaded`` as the pages first will; returns the seconds it took."""
    start = time.perf_counter()
    prompt = next(iter(PRESETS.values()))  # the Prefill page's default preset
    run_prefill(loaded, prompt, timing_runs=1)  # timing + inspection capture, one step
    run_one(loaded.model, loaded.tokenizer, prompt, 1, "timing", max_new_tokens=4, model_id=loaded.model_id)  # token by token, then decodes
    return time.perf_counter() - start
