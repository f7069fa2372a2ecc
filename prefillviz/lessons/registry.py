"""``ACTION_KINDS``, every action a step may run (each kind a module of ``lessons/kinds/``), and running one:
``resolve_parameters`` (defaults, the spec, then ``scale``) and ``run_action``.
"""

from __future__ import annotations

import time

from prefillviz.lessons.actions import ActionKind, ActionOutcome, check_parameters
from prefillviz.lessons.kinds import (
    chunked,
    class_burst,
    disagg,
    kv_memory,
    kv_write_order,
    papers_chunk_cost,
    papers_interference,
    papers_knee,
    papers_piggyback,
    papers_prefix_blocks,
    parallel_vs_sequential,
    prefill,
    prefix,
    roofline,
    sparse_speedup,
    ttft_ratio,
)
from prefillviz.lessons.spec import _require
from prefillviz.machine.progress import FractionProgress

ACTION_KINDS: dict[str, ActionKind] = {
    module.KIND.name: module.KIND
    for module in (
        prefill, ttft_ratio, parallel_vs_sequential, roofline, kv_memory, chunked, disagg, prefix,  # one line a kind
        sparse_speedup, kv_write_order,  # long prompts; the Watch it happen replay
        class_burst,  # a class room's Send, all at once
        # lesson 6: the papers' results
        papers_piggyback, papers_chunk_cost, papers_knee, papers_prefix_blocks, papers_interference,
    )
}


def resolve_parameters(action: dict, scale: float | None = None) -> tuple[ActionKind, dict]:
    """The action's kind and full parameters: defaults, then the spec, then token counts x ``scale``.

    Raises:
        LessonError: an unknown kind or parameter, or a scale outside (0, 1].
    """
    kind = ACTION_KINDS.get(action.get("kind"))
    _require(
        kind is not None, "action", f"unknown action kind {action.get('kind')!r} (known: {', '.join(ACTION_KINDS)})."
    )
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


def run_action(
    loaded, action: dict, scale: float | None = None, progress: FractionProgress | None = None
) -> ActionOutcome:
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
