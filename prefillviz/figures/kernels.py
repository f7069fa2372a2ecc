"""Figures of the Kernel timings page: per-layer time, the profiler's top ops, the timeline
of one prefill, the roofline prediction against the clock, and the attention kernels.

Pure functions of the rows ``experiments/timing_rows.py`` and ``experiments/kernel_bench.py``
return (ms, MiB): no streamlit, no model. Every figure goes through ``style.apply_layout``
(axis titles with units).
"""

from __future__ import annotations

import plotly.graph_objects as go

from prefillviz.figures import style

LAYER_PARTS = [  # (row key, legend name, colour)
    ("attention_ms", "attention", style.ATTENTION),
    ("mlp_ms", "MLP", style.MLP),
    ("norms_ms", "norms", style.NORMS),
    ("other_ms", "other (residual adds, RoPE, hooks)", style.OTHER),
]
TIMELINE_LANES = [  # (part, lane, colour): top lane first
    ("layer", "decoder layer", style.PREFILL),
    ("attention", "attention", style.ATTENTION),
    ("mlp", "MLP", style.MLP),
    ("norm", "norms", style.NORMS),
    ("embedding", "embedding / final norm / lm_head", style.NEUTRAL),
    ("final_norm", "embedding / final norm / lm_head", style.NORMS),
    ("lm_head", "embedding / final norm / lm_head", style.DECODE),
]
# by version
KERNEL_COLOURS = {1: style.EVICTED, 2: style.PREFILL, 3: style.CACHE_HIT, 4: style.DECODE, 5: style.PARTIAL}


def _layout(fig: go.Figure, title: str, subtitle: str, x_title: str, y_title: str, height: int = 420) -> go.Figure:
    """``style.apply_layout`` with the pass and device as a subtitle, and the legend below
    the plot (where it can't cover a two-line title, even in a half-width column)."""
    full_title = f"{title}<br><sup>{subtitle}</sup>" if subtitle else title
    style.apply_layout(fig, full_title, x_title, y_title, height=height + 90)
    fig.update_layout(
        legend={"orientation": "h", "yanchor": "top", "y": -0.22, "xanchor": "left", "x": 0.0},
        margin={"t": 80, "b": 150},
    )
    return fig


def layer_time_figure(rows: list[dict], subtitle: str = "") -> go.Figure:
    """Stacked bars per decoder layer: attention, MLP, norms, other (ms)."""
    fig = go.Figure()
    layers = [row["layer"] for row in rows]
    for key, name, colour in LAYER_PARTS:
        fig.add_bar(
            x=layers, y=[row[key] for row in rows], name=name, marker_color=colour,
            hovertemplate="layer %{x}: %{y:.3f} ms",
        )
    fig.update_layout(barmode="relative")  # stacks (a negative part would show below zero)
    total = sum(row["layer_ms"] for row in rows)
    return _layout(
        fig, f"Time per decoder layer · {len(rows)} layers, {total:,.1f} ms in all", subtitle, "decoder layer",
        "time (ms)",
    )


def op_table_figure(rows: list[dict], top: int = 15, subtitle: str = "") -> go.Figure:
    """The ``top`` profiler rows by self time, as horizontal bars (ms); torch ops and our scopes coloured apart."""
    shown = sorted(rows, key=lambda row: row["self_ms"] + row["device_ms"], reverse=True)[:top][::-1]  # largest on top
    fig = go.Figure()
    for kind, colour in (("torch op", style.PREFILL), ("our scope", style.OTHER)):
        members = [row for row in shown if row["kind"] == kind]
        fig.add_bar(
            y=[row["op"] for row in members],
            x=[row["self_ms"] + row["device_ms"] for row in members],
            orientation="h",
            name=kind,
            marker_color=colour,
            customdata=[[row["calls"], row["total_ms"], row["gflop"] or 0.0] for row in members],
            hovertemplate="%{y}<br>self %{x:.3f} ms · %{customdata[0]} calls · "
            "total %{customdata[1]:.3f} ms · %{customdata[2]:.3f} GFLOP",
        )
    fig.update_yaxes(categoryorder="array", categoryarray=[row["op"] for row in shown])
    return _layout(
        fig, f"Top {len(shown)} ops by self time (under torch.profiler)", subtitle, "self time (ms)", "op", height=520
    )


def timeline_figure(events: list[dict], subtitle: str = "") -> go.Figure:
    """A Gantt chart of one prefill: each layer and sub-layer scope as a bar over time (ms)."""
    fig = go.Figure()
    lanes = []
    for part, lane, colour in TIMELINE_LANES:
        members = [event for event in events if event["part"] == part]
        if lane not in lanes:
            lanes.append(lane)
        if not members:
            continue
        fig.add_bar(
            base=[event["start_ms"] for event in members],
            x=[event["duration_ms"] for event in members],
            y=[lane] * len(members),
            orientation="h",
            name=part.replace("_", " "),
            marker_color=colour,
            customdata=[[event["name"], event["start_ms"] + event["duration_ms"]] for event in members],
            hovertemplate="%{customdata[0]}<br>%{base:.3f} → %{customdata[1]:.3f} ms (%{x:.3f} ms)<extra></extra>",
        )
    fig.update_layout(barmode="overlay", bargap=0.25)
    fig.update_yaxes(categoryorder="array", categoryarray=lanes[::-1])
    end = max((event["start_ms"] + event["duration_ms"] for event in events), default=0.0)
    return _layout(
        fig, f"Timeline of one prefill · {end:,.1f} ms from embedding to lm_head", subtitle,
        "time since the embedding started (ms)", "", height=440,
    )


def predicted_vs_measured_figure(rows: list[dict], subtitle: str = "") -> go.Figure:
    """Per layer: measured attention and MLP time (bars) and the roofline prediction (dashed), log scale."""
    layers = [row["layer"] for row in rows]
    fig = go.Figure()
    for group, name, colour in (("attention", "attention", style.ATTENTION), ("mlp", "MLP", style.MLP)):
        fig.add_bar(
            x=layers, y=[row[f"measured_{group}_ms"] for row in rows], name=f"{name} measured", marker_color=colour
        )
        fig.add_scatter(
            x=layers,
            y=[row[f"predicted_{group}_ms"] for row in rows],
            name=f"{name} predicted (roofline)",
            mode="lines+markers",
            line={"color": colour, "dash": "dash", "width": 3},
            marker={"symbol": "diamond", "size": 8},
        )
    fig.update_layout(barmode="group")
    fig.update_yaxes(type="log")
    return _layout(fig, "Predicted vs measured time per layer", subtitle, "decoder layer", "time (ms, log scale)")


def kernel_time_figure(rows: list[dict], subtitle: str = "") -> go.Figure:
    """One bar per kernel: median time (ms) with its min-max range; the check's max difference under its name."""
    fig = go.Figure()
    for row in rows:
        fig.add_bar(
            x=[f"{row['kernel']}<br>|Δ v1| {row['max_abs_diff_vs_v1']:.1e}"],
            y=[row["median_ms"]],
            name=row["kernel"],
            marker_color=KERNEL_COLOURS.get(row["version"], style.NEUTRAL),
            error_y={
                "type": "data", "symmetric": False, "array": [row["max_ms"] - row["median_ms"]],
                "arrayminus": [row["median_ms"] - row["min_ms"]],
            },
            hovertemplate=f"{row['kernel']}: median %{{y:.4f}} ms (min {row['min_ms']:.4f}, max {row['max_ms']:.4f}; "
            f"{row['runs']} runs)<extra></extra>",
        )
    n = rows[0]["N"] if rows else 0
    return _layout(
        fig, f"Attention kernels on N = {n:,} tokens: time", subtitle, "kernel (max |difference| from v1)",
        "median time per call (ms)",
    )


def kernel_memory_figure(rows: list[dict], subtitle: str = "") -> go.Figure:
    """Per kernel: measured peak memory and the analytic largest intermediate tensor (MiB)."""
    labels = [row["kernel"] for row in rows]
    fig = go.Figure()
    fig.add_bar(
        x=labels, y=[row["peak_memory_MiB"] for row in rows], name="measured peak (allocator, output included)",
        marker_color=style.PREFILL,
    )
    fig.add_bar(
        x=labels, y=[row["largest_intermediate_MiB"] for row in rows],
        name="largest intermediate (from shapes; v2: unknown)", marker_color=style.PARTIAL,
    )
    fig.update_layout(barmode="group")
    n = rows[0]["N"] if rows else 0
    return _layout(fig, f"Attention kernels on N = {n:,} tokens: memory", subtitle, "kernel", "memory (MiB)")


def _sweep_lines(rows: list[dict], key: str, dash: str | None = None, suffix: str = "") -> list[go.Scatter]:
    lines, versions = [], set()
    for name in dict.fromkeys(row["kernel"] for row in rows):
        members = sorted(
            (row for row in rows if row["kernel"] == name and row[key] is not None), key=lambda row: row["N"]
        )
        if not members:
            continue
        version = members[0]["version"]
        # a second kernel of one version (v7 and v7 tiles): its colour, dotted
        line_dash = dash or ("dot" if version in versions else None)
        versions.add(version)
        lines.append(
            go.Scatter(
                x=[row["N"] for row in members],
                y=[row[key] for row in members],
                name=f"{name}{suffix}",
                mode="lines+markers",
                line={"color": KERNEL_COLOURS.get(version, style.NEUTRAL), "width": 3, "dash": line_dash},
            )
        )
    return lines


def _log_axes(fig: go.Figure, rows: list[dict]) -> None:
    sizes = sorted({row["N"] for row in rows})
    fig.update_xaxes(type="log", tickvals=sizes, ticktext=[f"{n:,}" for n in sizes])
    fig.update_yaxes(type="log")


def sweep_time_figure(
    rows: list[dict], subtitle: str = "", title: str = "Attention time vs prompt length"
) -> go.Figure:
    """Median time per call vs N for each kernel (log-log)."""
    fig = go.Figure(_sweep_lines(rows, "median_ms"))
    _log_axes(fig, rows)
    return _layout(fig, title, subtitle, "tokens N (log scale)", "median time per call (ms, log scale)")


def sweep_memory_figure(
    rows: list[dict], subtitle: str = "", title: str = "Attention memory vs prompt length"
) -> go.Figure:
    """Measured peak memory (solid) and analytic largest intermediate (dotted) vs N (log-log, MiB)."""
    fig = go.Figure(
        _sweep_lines(rows, "peak_memory_MiB", suffix=" measured")
        + _sweep_lines(rows, "largest_intermediate_MiB", "dot", " largest intermediate")
    )
    _log_axes(fig, rows)
    return _layout(fig, title, subtitle, "tokens N (log scale)", "memory (MiB, log scale)")


def dispatch_figure(rows: list[dict], family: str, subtitle: str = "") -> go.Figure:
    """The measured dispatch of one family (``DispatchTable.rows``): each candidate's ms per layer in
    every bucket, log scale; the one the engine runs there is outlined and marked."""
    rows = [row for row in rows if row["family"] == family]
    buckets = list(dict.fromkeys(row["bucket"] for row in rows))
    palette = [style.PREFILL, style.CACHE_HIT, style.DECODE, style.PARTIAL, style.EVICTED]
    fig = go.Figure()
    for index, candidate in enumerate(dict.fromkeys(row["candidate"] for row in rows)):
        mine = {row["bucket"]: row for row in rows if row["candidate"] == candidate}
        fig.add_bar(
            name=candidate,
            x=[bucket.replace("_", " ") for bucket in buckets],
            y=[mine[b]["ms_per_layer"] if b in mine else None for b in buckets],
            marker={
                "color": palette[index % len(palette)],
                "line": {"width": [4 if mine.get(b, {}).get("chosen") else 0 for b in buckets], "color": "black"},
            },
            text=["chosen" if mine.get(b, {}).get("chosen") else "" for b in buckets],
            textposition="outside",
            hovertemplate="%{x}: %{y:.3f} ms a layer<extra>" + candidate + "</extra>",
        )
    _layout(
        fig, f"Measured dispatch: {family}, one layer per step shape", subtitle, "step shape (bucket)",
        "ms per layer (log)",
    )
    fig.update_layout(barmode="group")
    fig.update_yaxes(type="log")
    return fig


def backends_figure(rows: list[dict], subtitle: str = "") -> go.Figure:
    """What tuning buys: the layers' time in each part, the textbook backend's bar beside the measured one's
    (``experiments/tuning.BackendComparison.rows``)."""
    fig = go.Figure()
    backends = list(dict.fromkeys(row["backend"] for row in rows))
    for key, name, colour in LAYER_PARTS:
        part = key.removesuffix("_ms")
        values = {row["backend"]: row["ms"] for row in rows if row["part"] == part}
        fig.add_trace(go.Bar(x=backends, y=[values.get(b, 0.0) for b in backends], name=name, marker_color=colour,
                             hovertemplate="%{x}: %{y:,.2f} ms<extra>" + name + "</extra>"))
    fig.update_layout(barmode="stack")
    return _layout(
        fig, "The same prefill on the textbook and the measured backend", subtitle, "backend", "time in the layers (ms)"
    )
