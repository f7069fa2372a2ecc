"""Figures of disaggregated prefill: a Gantt with a lane per worker and each request's KV transfer
drawn between the lanes, and the decoding users' gaps between tokens in the three set-ups.
Every number drawn comes from the runs passed in (times: ms since the prefill worker's first step)."""

from __future__ import annotations

import plotly.graph_objects as go

from prefillviz.disagg.experiment import SETUPS, DisaggComparison
from prefillviz.disagg.launch import DisaggRun
from prefillviz.experiments.chunked import LONG_REQUEST_ID, short_request_ids
from prefillviz.figures import style

PREFILL_LANE, DECODE_LANE = "prefill worker", "decode worker"
SETUP_COLORS = dict(zip(SETUPS, (style.NEUTRAL, style.PREFILL, style.CACHE_HIT)))


def gantt_figure(run: DisaggRun, title: str) -> go.Figure:
    """One lane per worker, one bar per engine step (blue: a prefill step, with its requests;
    orange: a decode step, with its batch size), and a line per KV transfer from the moment the
    prefill worker starts sending to the moment the decode worker holds the payload."""
    fig = go.Figure()
    for lane, result in ((PREFILL_LANE, run.prefill), (DECODE_LANE, run.decode)):
        offset = (result.engine_start_time - run.origin) * 1000
        for is_prefill, name, color in [(True, "prefill step", style.PREFILL), (False, "decode step", style.DECODE)]:
            steps = [s for s in result.trace.steps if bool(s.num_prefill_tokens) == is_prefill]
            if not steps:
                continue
            fig.add_bar(
                y=[lane] * len(steps), base=[offset + s.start_time_s * 1000 for s in steps],
                x=[s.wall_time_s * 1000 for s in steps], orientation="h", name=f"{name} ({lane})",
                marker={"color": color, "line": {"color": "white", "width": 1}},
                text=[" + ".join(c.request_id for c in s.chunks) if is_prefill else str(len(s.chunks)) for s in steps],
                textposition="inside", insidetextanchor="middle",
                hovertext=[
                    f"{lane}, step {s.step_index}: {s.num_scheduled_tokens} token(s) of "
                    f"{', '.join(f'{c.request_id} ({c.num_tokens})' for c in s.chunks)}"
                    f"<br>{s.wall_time_s * 1000:,.1f} ms"
                    for s in steps
                ],
                hoverinfo="text",
            )
    for i, transfer in enumerate(run.transfers):
        start, end = (transfer.send_start_time - run.origin) * 1000, (transfer.recv_end_time - run.origin) * 1000
        fig.add_scatter(
            x=[start, end], y=[PREFILL_LANE, DECODE_LANE], mode="lines+markers",
            line={"color": style.CACHE_HIT, "width": 3}, marker={"size": 9, "symbol": ["circle", "triangle-down"]},
            name="KV transfer", legendgroup="transfer", showlegend=i == 0,
            hovertext=f"{transfer.request_id}: {transfer.num_bytes:,} bytes of K/V ({transfer.num_tokens} tokens) in "
            f"{transfer.transfer_s * 1000:,.2f} ms = {transfer.num_bytes / transfer.transfer_s / 1e9:,.2f} GB/s",
            hoverinfo="text",
        )
    long = run.decode.trace.requests.get(LONG_REQUEST_ID)
    if long is not None:
        arrival = (run.decode.engine_start_time - run.origin) * 1000 + long.arrival_time_s * 1000
        fig.add_vline(x=arrival, line={"color": style.NEUTRAL, "dash": "dash", "width": 2})
        fig.add_annotation(
            x=arrival, y=1.0, yref="paper", text="long prompt arrives", showarrow=False,
            xanchor="left", yanchor="bottom",
        )
    fig.update_layout(barmode="overlay", bargap=0.35)
    fig.update_yaxes(categoryorder="array", categoryarray=[DECODE_LANE, PREFILL_LANE])
    return style.apply_layout(fig, title, "time since the prefill worker's first step (ms)", "worker", height=340)


def gaps_figure(comparison: DisaggComparison, title: str) -> go.Figure:
    """Each decoding user's gap before every token it received, against when it came (ms since
    the long prompt arrived), one colour per set-up: a spike is a step that made them wait."""
    fig = go.Figure()
    for setup, trace in comparison.traces.items():
        arrival = trace.requests[LONG_REQUEST_ID].arrival_time_s
        x, y, hover = [], [], []
        for request_id in short_request_ids(trace):
            record = trace.requests[request_id]
            t = record.arrival_time_s + record.time_to_first_token_s
            for index, gap in enumerate(record.inter_token_times_s, start=2):
                t += gap
                x.append((t - arrival) * 1000)
                y.append(gap * 1000)
                hover.append(f"{setup}<br>{request_id}, token {index}: {gap * 1000:,.1f} ms after the one before")
        fig.add_scatter(
            x=x, y=y, mode="markers", name=setup, marker={"color": SETUP_COLORS[setup], "size": 9, "opacity": 0.8},
            hovertext=hover, hoverinfo="text",
        )
    fig.add_vline(x=0, line={"color": style.NEUTRAL, "dash": "dash", "width": 2})
    fig.add_annotation(
        x=0, y=1.0, yref="paper", text="long prompt arrives", showarrow=False, xanchor="left", yanchor="bottom"
    )
    return style.apply_layout(fig, title, "when the token came, ms since the long prompt arrived", "gap before it (ms)")
