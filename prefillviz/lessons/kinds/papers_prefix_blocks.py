"""The ``papers_prefix_blocks`` action: a shared prefix one token short of a block, one block, and
around the next block edges, at two block sizes; then what a hit saves when the output is long."""

from __future__ import annotations

import plotly.graph_objects as go

from prefillviz.experiments.papers_prefix_blocks import run_block_hits, run_long_output_saving
from prefillviz.figures import papers as figures
from prefillviz.lessons.actions import ActionKind, ActionOutcome
from prefillviz.lessons.kinds.common import make_outcome
from prefillviz.machine.progress import FractionProgress


def _run(loaded, parameters: dict, report: FractionProgress, scale: float | None = None) -> ActionOutcome:
    small, large = sorted((parameters["block_size"], parameters["second_block_size"]))
    lengths = sorted({small - 1, small, small + 1, 2 * small - 1, 2 * small, large - 1, large, large + 1} - {0})
    hits = run_block_hits(loaded, [small, large], lengths, lambda f, text: report(0.3 * f, text))
    saving = run_long_output_saving(
        loaded.model, loaded.tokenizer, parameters["prefix_tokens"], parameters["output_tokens"], loaded.model_id,
        lambda done, record: report(
            min(1.0, 0.3 + 0.7 * done / (4 * parameters["output_tokens"] + 4)),
            f"the same request with the cache on and off, {parameters['output_tokens']} new tokens each: step {done}",
        ),
    )
    measured = {
        "block_size": small, "one_short_cached": hits.cached(small, small - 1) if small > 1 else 0.0,
        "one_block_cached": hits.cached(small, small),
        "second_block_size": large, "large_block_cached_at_small_block": hits.cached(large, small),
        "ttft_saved_percent": saving.ttft_saved_percent, "total_saved_percent": saving.total_saved_percent,
        "output_tokens": saving.output_tokens, "prompt_tokens": saving.prompt_tokens,
        "cached_tokens": saving.cached_tokens,
    }
    facts = [
        (f"Block size {small}: shared prefix of {small - 1} / {small} tokens",
         f"{measured['one_short_cached']:.0f} / {measured['one_block_cached']:.0f} tokens from the cache"),
        (f"Block size {large}: shared prefix of {small} tokens",
         f"{measured['large_block_cached_at_small_block']:.0f} tokens from the cache"),
        (f"A {saving.prompt_tokens}-token request with {saving.cached_tokens} tokens cached, "
         f"{saving.output_tokens} new tokens",
         f"TTFT {saving.ttft_off_ms:,.0f} → {saving.ttft_on_ms:,.0f} ms ({saving.ttft_saved_percent:.0f}% saved); "
         f"whole request {saving.total_off_ms:,.0f} → {saving.total_on_ms:,.0f} ms "
         f"({saving.total_saved_percent:.0f}% saved)"),
        ("vLLM's rule",
         "only full blocks are hashed and shared (vllm-project/vllm#3942: token-level reuse is not feasible)"),
    ]
    raw = {"papers_block_hits": hits, "papers_long_output": saving}
    return make_outcome("papers_prefix_blocks", loaded, parameters, measured, facts, raw)


def _hits_figure(outcome: ActionOutcome) -> go.Figure:
    title = "Share of the shared prefix served from the cache"
    return figures.block_hits_figure([outcome.raw["papers_block_hits"]], title)


def _saving_figure(outcome: ActionOutcome) -> go.Figure:
    title = "What a prefix hit saves, by the number of tokens generated"
    return figures.long_output_figure(outcome.raw["papers_long_output"], title)


KIND = ActionKind(
    name="papers_prefix_blocks",
    parameters={
        "block_size": (int, 16), "second_block_size": (int, 32), "prefix_tokens": (int, 256), "output_tokens": (int, 32)
    },
    scaled={"prefix_tokens": 40, "output_tokens": 4},
    measured=(
        "block_size", "one_short_cached", "one_block_cached", "second_block_size", "large_block_cached_at_small_block",
        "ttft_saved_percent", "total_saved_percent", "output_tokens", "prompt_tokens", "cached_tokens",
    ),
    figures={"hits": _hits_figure, "saving": _saving_figure},
    run=_run,
    description=(
        "Shared prefixes around block edges at two block sizes: cached tokens; "
        "then a hit's saving when outputs are long."
    ),
    page_results=lambda run, label: {
        "papers_prefix_blocks": {
            "hits": run.raw["papers_block_hits"], "saving": run.raw["papers_long_output"], "label": label
        }
    },
)
