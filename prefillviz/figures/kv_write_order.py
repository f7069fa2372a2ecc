"""The order a run wrote its KV cache, cell by cell, and the figure of when each cell was written.

A cell is one layer's K/V slot for one position of a request. The replay's KV write events
(``replay.frames``: one layer writing one step's positions, at the end of that layer's span) are
expanded into the cells each one wrote, so the order is the recorded one, never assumed:

    one step (budget N):        event 1 = layer 0, positions 0..N-1   event 2 = layer 1, ...   L events
    token by token (budget 1):  event 1 = layer 0, position 0  ...  event L = layer L-1, position 0
                                event L+1 = layer 0, position 1  ...                          L x N events

Only an inspection pass (capture level ``inspect``) has a KV write log and so events to order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from prefillviz.engine.trace import Trace
from prefillviz.experiments.inspect_run import request_token_indices
from prefillviz.figures import style
from prefillviz.figures.replay.frames import trace_frames


@dataclass(frozen=True)
class KVWriteEvent:
    """One layer writing one step's positions of the request (a ``kv_write`` frame of the replay)."""

    step: int
    layer: int
    positions: tuple[int, ...]
    time_s: float  # since the run's first step


@dataclass(frozen=True)
class KVWriteOrder:
    """A request's KV write events in the order they happened.

    Attributes:
        events: the events, in order.
        num_layers: layers that wrote.
        num_positions: positions written (0 .. num_positions - 1).
        run_s: the run's wall time, from its first step's start to the end of its last.
    """

    events: tuple[KVWriteEvent, ...]
    num_layers: int
    num_positions: int
    run_s: float

    @property
    def num_events(self) -> int:
        return len(self.events)

    def written_at_s(self) -> np.ndarray:
        """(layers, positions): when each cell was written, seconds since the run's first step (NaN: never)."""
        times = np.full((self.num_layers, self.num_positions), np.nan)
        for event in self.events:
            times[event.layer, list(event.positions)] = event.time_s
        return times

    def positions_before(self, layer: int, first_layer: int = 0) -> int:
        """How many positions ``first_layer`` had written before ``layer`` wrote any: all of them when a
        layer's whole row goes first (layer by layer), 1 when each position runs through every layer first."""
        written: set[int] = set()
        for event in self.events:
            if event.layer == layer:
                break
            if event.layer == first_layer:
                written.update(event.positions)
        return len(written)

    def layer_done_s(self, layer: int) -> float:
        """When the layer's last cell was written (seconds since the run's first step)."""
        return max(event.time_s for event in self.events if event.layer == layer)


def kv_write_order(trace: Trace, request_id: str | None = None) -> KVWriteOrder:
    """The KV write events of one request of an inspection trace (default: its first request).

    Raises:
        ValueError: the trace has no KV write log (not an inspection pass).
    """
    request_id = request_id if request_id is not None else next(iter(trace.requests))
    events = []
    for frame in trace_frames(trace):
        if frame.kind != "kv_write":
            continue
        step = trace.steps[frame.step]
        rows = request_token_indices(step, request_id)
        if len(rows):
            positions = tuple(int(p) for p in step.kv_writes.positions[rows])
            events.append(KVWriteEvent(frame.step, frame.layer, positions, frame.time_s))
    if not events:
        raise ValueError(f"The trace has no KV write events of {request_id!r}: it is not an inspection pass.")
    last = trace.steps[-1]
    return KVWriteOrder(
        tuple(events), 1 + max(e.layer for e in events), 1 + max(max(e.positions) for e in events),
        last.start_time_s + last.wall_time_s,
    )


def write_order_figure(runs: list[tuple[str, KVWriteOrder]]) -> go.Figure:
    """Side by side, one heatmap a run: layers x positions, coloured by when the cell was written (as a share
    of that run's time, so runs of different lengths share one scale; the hover gives the milliseconds)."""
    fig = make_subplots(rows=1, cols=len(runs), shared_yaxes=True, horizontal_spacing=0.05,
                        subplot_titles=[f"{name}: {order.num_events:,} write events" for name, order in runs])
    for column, (name, order) in enumerate(runs, start=1):
        written = order.written_at_s()
        fig.add_heatmap(
            z=100 * written / order.run_s, customdata=1e3 * written, zmin=0, zmax=100,
            colorscale=style.HEATMAP_SCALE, showscale=column == 1,
            colorbar={"title": {"text": "written at<br>(% of the run)"}},
            hovertemplate=f"{name}<br>layer %{{y}}, position %{{x}}<br>written at %{{customdata:,.2f}} ms "
                          "(%{z:.1f}% of the run)<extra></extra>",
            row=1, col=column,
        )
    return style.apply_layout(fig, "When each KV-cache cell was written (recorded KV write events)",
                              "position (token)", "layer", height=480)
