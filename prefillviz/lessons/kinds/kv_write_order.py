"""The ``kv_write_order`` action: which KV-cache cells one prefill step writes first, read from the
recorded KV write events of the Watch it happen replay (``experiments.replay_runs``), against the
same prompt token by token."""

from __future__ import annotations

import plotly.graph_objects as go

from prefillviz.experiments.replay_runs import record_replay
from prefillviz.figures.kv_write_order import KVWriteOrder, kv_write_order, write_order_figure
from prefillviz.figures.replay.build import replay_payload
from prefillviz.lessons.actions import ActionKind, ActionOutcome
from prefillviz.lessons.kinds.common import make_outcome
from prefillviz.machine.progress import FractionProgress


def order_numbers(order: KVWriteOrder, prefix: str = "") -> dict[str, float]:
    """What a run's KV write events say about its order, under ``prefix`` + the name."""
    return {
        f"{prefix}kv_write_events": order.num_events,
        f"{prefix}positions_before_next_layer": order.positions_before(1),
        f"{prefix}first_layer_done_ms": 1e3 * order.layer_done_s(0),
        f"{prefix}run_ms": 1e3 * order.run_s,
        f"{prefix}first_layer_done_percent": 100 * order.layer_done_s(0) / order.run_s,
    }


def _run_kv_write_order(
    loaded, parameters: dict, report: FractionProgress, scale: float | None = None
) -> ActionOutcome:
    runs = record_replay(loaded, parameters["num_tokens"], report)
    one_step, by_token = kv_write_order(runs.parallel), kv_write_order(runs.token_by_token)
    measured = {
        "num_tokens": runs.num_tokens,
        "num_layers": one_step.num_layers,
        **order_numbers(one_step),
        **order_numbers(by_token, "token_by_token_"),
    }
    facts = [
        ("Prompt tokens", f"{runs.num_tokens:,} ({runs.dtype}, inspection passes: KV write log and per-layer clocks)"),
        ("One step: KV write events", _events_text(one_step)),
        ("One step: positions layer 0 wrote before layer 1 wrote any", f"{one_step.positions_before(1):,}"),
        ("One step: layer 0's cells all written", _done_text(one_step, "step")),
        ("Token by token: KV write events", _events_text(by_token)),
        ("Token by token: positions layer 0 wrote before layer 1 wrote any", f"{by_token.positions_before(1):,}"),
        ("Token by token: layer 0's cells all written", _done_text(by_token, "run")),
    ]
    raw = {
        "one_step": one_step, "token_by_token": by_token,
        "watch": {"payload": replay_payload(runs), "record_s": runs.record_s},  # what the Watch page saves
    }
    return make_outcome("kv_write_order", loaded, parameters, measured, facts, raw)


def _events_text(order: KVWriteOrder) -> str:
    sizes = sorted({len(event.positions) for event in order.events})
    each = " or ".join(f"{size:,}" for size in sizes)
    return f"{order.num_events:,}, each one layer writing {each} position{'s' if sizes != [1] else ''}"


def _done_text(order: KVWriteOrder, what: str) -> str:
    done = order.layer_done_s(0)
    return f"{done * 1e3:,.2f} ms into the {order.run_s * 1e3:,.1f} ms {what} ({100 * done / order.run_s:.1f}%)"


def _write_order_figure(outcome: ActionOutcome) -> go.Figure:
    raw = outcome.raw
    return write_order_figure([("one step", raw["one_step"]), ("token by token", raw["token_by_token"])])


KIND = ActionKind(
    name="kv_write_order",
    parameters={"num_tokens": (int, 64)},
    scaled={"num_tokens": 8},
    measured=(
        "num_tokens", "num_layers", "kv_write_events", "positions_before_next_layer", "first_layer_done_ms", "run_ms",
        "first_layer_done_percent", "token_by_token_kv_write_events", "token_by_token_positions_before_next_layer",
        "token_by_token_first_layer_done_ms", "token_by_token_run_ms", "token_by_token_first_layer_done_percent",
    ),
    figures={"write_order": _write_order_figure},
    run=_run_kv_write_order,
    description="The Watch it happen replay: the order one prefill step wrote its KV cache, against token by token.",
    page_results=lambda run, label: {"watch": run.raw["watch"]},
)
