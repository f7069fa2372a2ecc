"""``ACTION_KINDS``, every action a step may run, and running one: ``resolve_parameters``
(defaults, the spec, then ``scale``) and ``run_action``.
"""

from __future__ import annotations

import time

from prefillviz.engine.progress import FractionProgress
from prefillviz.lessons.actions import ActionKind, ActionOutcome, check_parameters
from prefillviz.lessons.disagg_step import DISAGG_MEASURED, _disagg_gaps_figure, _disagg_latency_figure, _run_disagg
from prefillviz.lessons.runs import (
    SMALLEST_SCALED_PREFIX_TOKENS,
    _run_chunked,
    _run_kv_memory,
    _run_parallel,
    _run_prefill,
    _run_prefix,
    _run_roofline,
    _run_ttft_ratio,
)
from prefillviz.lessons.spec import _require
from prefillviz.lessons.step_figures import (
    _chunked_latency_figure,
    _gqa_figure,
    _kv_difference_figure,
    _memory_growth_figure,
    _prefix_ttft_figure,
    _roofline_figure,
    _step_latency_figure,
    _ttft_bars_figure,
    _ttft_breakdown_figure,
)

PROMPT_PARAMETERS = {"preset": (str, "Chat with a system prompt"), "prompt": (str, None)}  # a spec's "prompt" wins

ACTION_KINDS: dict[str, ActionKind] = {
    kind.name: kind
    for kind in [
        ActionKind(
            name="prefill",
            parameters=PROMPT_PARAMETERS,
            scaled={},
            measured=("num_tokens", "num_steps", "ttft_ms", "forward_ms", "forward_share_percent", "prefill_tokens_per_s"),
            figures={"ttft_breakdown": _ttft_breakdown_figure},
            run=_run_prefill,
            description="One parallel prefill of the prompt (timing pass, then inspection pass); the Prefill page shows it.",
        ),
        ActionKind(
            name="ttft_ratio",
            parameters={"short_tokens": (int, 32), "long_tokens": (int, 512), "runs": (int, 3)},
            scaled={"short_tokens": 4, "long_tokens": 8},
            measured=("short_tokens", "long_tokens", "token_ratio", "short_ttft_ms", "long_ttft_ms", "ttft_ratio"),
            figures={"ttft_bars": _ttft_bars_figure},
            run=_run_ttft_ratio,
            description="Time to first token of a short and a long prompt of real prose (median of runs after a warm-up).",
        ),
        ActionKind(
            name="parallel_vs_sequential",
            parameters={**PROMPT_PARAMETERS, "preset": (str, "Long document"), "num_tokens": (int, 400), "parallel_timing_runs": (int, 3)},
            scaled={"num_tokens": 8},
            measured=(
                "num_tokens", "parallel_ttft_ms", "token_by_token_ttft_ms", "ratio", "token_by_token_steps", "max_kv_diff",
                "kv_diff_over_tolerance", "logits_max_abs_diff", "same_top_token",
            ),
            figures={"step_latency": _step_latency_figure, "kv_difference": _kv_difference_figure},
            run=_run_parallel,
            description="The prompt's first N tokens in one step and in N one-token steps: timed, then their KV caches compared.",
        ),
        ActionKind(
            name="roofline",
            parameters={"prefill_sizes": (list, [16, 64, 256]), "decode_contexts": (list, [64]), "runs": (int, 2)},
            scaled={"prefill_sizes": 4, "decode_contexts": 4},
            measured=(
                "prefill_tokens", "prefill_intensity", "decode_intensity", "intensity_ratio", "ridge_intensity", "prefill_over_ridge",
                "prefill_gflops", "decode_gflops", "gflops_ratio", "prefill_percent_of_peak",
            ),
            figures={"roofline": _roofline_figure},
            run=_run_roofline,
            description="Prefill and decode steps, timed and placed under this machine's measured roofs.",
        ),
        ActionKind(
            name="kv_memory",
            parameters=PROMPT_PARAMETERS,
            scaled={},
            measured=(
                "num_tokens", "kv_bytes_per_token", "kv_bytes_per_token_formula", "kv_total_mb", "num_blocks", "block_size",
                "mha_bytes_per_token", "gqa_saving_factor",
            ),
            figures={"memory_growth": _memory_growth_figure, "gqa_bars": _gqa_figure},
            run=_run_kv_memory,
            description="One prefill read as KV-cache memory: the bytes the layers wrote, the blocks, what GQA saves.",
        ),
        ActionKind(
            name="chunked",
            parameters={
                "num_short_requests": (int, 3), "short_prompt_tokens": (int, 16), "short_max_new_tokens": (int, 12),
                "long_prompt_tokens": (int, 512), "long_max_new_tokens": (int, 2), "arrival_step": (int, 2), "token_budget": (int, 64),
            },
            scaled={"short_max_new_tokens": 4, "long_prompt_tokens": 16, "token_budget": 8},
            measured=(
                "itl_max_off_ms", "itl_max_on_ms", "itl_max_ratio", "long_ttft_off_ms", "long_ttft_on_ms", "long_ttft_ratio",
                "num_steps_off", "num_steps_on", "outputs_identical",
            ),
            figures={"latency": _chunked_latency_figure},
            run=_run_chunked,
            description="A long prompt arriving while short requests decode, with chunked prefill off and on.",
        ),
        ActionKind(
            name="disagg",
            parameters={
                "num_short_requests": (int, 3), "short_prompt_tokens": (int, 16), "short_max_new_tokens": (int, 12),
                "long_prompt_tokens": (int, 512), "long_max_new_tokens": (int, 2), "arrival_step": (int, 2), "token_budget": (int, 64),
            },
            scaled={"short_max_new_tokens": 4, "long_prompt_tokens": 16, "token_budget": 8},
            measured=DISAGG_MEASURED,
            figures={"gaps": _disagg_gaps_figure, "latency": _disagg_latency_figure},
            run=_run_disagg,
            description="The chunked workload on one engine (chunking off, on), then on a prefill worker and a decode worker.",
        ),
        ActionKind(
            name="prefix",
            parameters={
                "shared_prefix": (str, "Questions about one long document"), "num_questions": (int, 3),
                "max_new_tokens": (int, 2), "prefix_tokens": (int, None),
            },
            scaled={"prefix_tokens": SMALLEST_SCALED_PREFIX_TOKENS},
            measured=(
                "num_shared_prefix_tokens", "later_cached_percent", "hit_rate_percent", "later_ttft_on_ms", "later_ttft_off_ms",
                "ttft_speedup", "outputs_identical",
            ),
            figures={"ttft": _prefix_ttft_figure},
            run=_run_prefix,
            description="Questions sharing a prefix, one after another on one engine, with the prefix cache on and off.",
        ),
    ]
}


def resolve_parameters(action: dict, scale: float | None = None) -> tuple[ActionKind, dict]:
    """The action's kind and full parameters: defaults, then the spec, then token counts x ``scale``.

    Raises:
        LessonError: an unknown kind or parameter, or a scale outside (0, 1].
    """
    kind = ACTION_KINDS.get(action.get("kind"))
    _require(kind is not None, "action", f"unknown action kind {action.get('kind')!r} (known: {', '.join(ACTION_KINDS)}).")
    check_parameters(kind, action, "action")
    parameters = {name: default for name, (_, default) in kind.parameters.items()}
    parameters.update({name: value for name, value in action.items() if name != "kind"})
    if scale is not None:
        _require(0 < scale <= 1, "action", f"scale must be in (0, 1], got {scale}.")
        for name, smallest in kind.scaled.items():
            value = parameters[name]
            if isinstance(value, list):
                parameters[name] = sorted({max(smallest, round(v * scale)) for v in value})
            elif value is not None:
                parameters[name] = max(smallest, round(value * scale))
    return kind, parameters


def run_action(loaded, action: dict, scale: float | None = None, progress: FractionProgress | None = None) -> ActionOutcome:
    """Run one step's action on the real model and return what it measured.

    Args:
        loaded: the ``LoadedModel`` to run.
        action: ``{"kind": ..., parameters}`` from a step spec.
        scale: multiply the action's token counts by this, in (0, 1] (tests run small); None: as written.
        progress: called with (fraction done, what is running).

    Returns:
        The ``ActionOutcome``; ``measured`` has every name in ``ACTION_KINDS[kind].measured``.

    Raises:
        LessonError: an unknown kind or parameter.
        PrefillVizError: the run itself failed (e.g. a prompt too long for the model).
    """
    kind, parameters = resolve_parameters(action, scale)
    report = progress or (lambda fraction, text: None)
    start = time.perf_counter()
    outcome = kind.run(loaded, parameters, report, scale)
    outcome.elapsed_s = time.perf_counter() - start
    return outcome
