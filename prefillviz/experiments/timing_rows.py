"""One prefill's measurements as table rows: per layer, per op, over time, and against the
roofline's prediction.

Pure functions of a run's traces and peaks (``experiments/kernels.py`` makes them); every row
carries plain numbers (ms, bytes) ready for a table or a figure (``figures/kernels.py``).
"""

from __future__ import annotations

import json
import re

from prefillviz.analysis.machine_peaks import MachinePeaks
from prefillviz.analysis.model_shape import ModelShape
from prefillviz.analysis.roofline import predict_layer_times
from prefillviz.engine.trace import Trace
from prefillviz.instrument.records import LayerTimes
from prefillviz.loading.models import LoadedModel

ATTENTION_OPS = ("q_proj", "k_proj", "v_proj", "attn_scores", "attn_values", "o_proj")  # inside the attention module
MLP_OPS = ("mlp_gate", "mlp_up", "mlp_down", "mlp_fc", "mlp_proj")
SCOPE_PATTERN = re.compile(r"^(embedding|final_norm|lm_head|layers\.(\d+)(?:\.(\w+))?)$")


def layer_rows(layer_times: LayerTimes) -> list[dict]:
    """One row per decoder layer: attention, MLP, norms, other and the whole layer, in ms."""
    return [
        {
            "layer": i,
            "attention_ms": attention * 1e3,
            "mlp_ms": mlp * 1e3,
            "norms_ms": norms * 1e3,
            "other_ms": other * 1e3,
            "layer_ms": layer * 1e3,
        }
        for i, (attention, mlp, norms, other, layer) in enumerate(
            zip(
                layer_times.attention_s, layer_times.mlp_s, layer_times.norms_s, layer_times.other_s,
                layer_times.layer_s,
            )
        )
    ]


def _is_scope(name: str) -> bool:
    return SCOPE_PATTERN.match(name) is not None


def op_rows(trace: Trace, top: int | None = None) -> list[dict]:
    """The profiler's op table in ms, by self time (torch ops and our layer scopes).

    A scope's self time is what ran inside it outside any torch op (Python, hooks).
    ``gflop`` is what the profiler counted (it counts matmuls, not attention; None when 0).
    """
    if trace.profile is None:
        raise ValueError("The trace has no profile: run it with capture_level='profile'.")
    rows = [
        {
            "op": row["op"],
            "kind": "our scope" if _is_scope(row["op"]) else "torch op",
            "calls": row["calls"],
            "self_ms": row["self_time_s"] * 1e3,
            "total_ms": row["total_time_s"] * 1e3,
            "device_ms": row["device_time_s"] * 1e3,
            "gflop": row["flops"] / 1e9 if row["flops"] else None,
        }
        for row in trace.profile.op_table
    ]
    rows.sort(key=lambda row: row["self_ms"] + row["device_ms"], reverse=True)
    return rows[:top] if top else rows


def timeline_events(chrome_trace: bytes) -> list[dict]:
    """Our ``record_function`` scopes of one prefill, from a Chrome trace, in ms.

    Reads ``traceEvents``, keeps complete ("X") CPU-side scope events named like
    ``layers.3``, ``layers.3.mlp``, ``embedding``, ``lm_head``, and the first occurrence of
    each name (one prefill). ``ts``/``dur`` are microseconds; times are returned relative to
    the earliest scope.

    Returns:
        Rows ``name``, ``layer`` (None for embedding / final_norm / lm_head), ``part``
        (``layer``, ``attention``, ``mlp``, ``norm``, ``embedding``, ``final_norm``,
        ``lm_head``), ``start_ms``, ``duration_ms``, sorted by start.
    """
    events = json.loads(chrome_trace)["traceEvents"]
    seen: dict[str, dict] = {}
    for event in events:
        name = event.get("name", "")
        if event.get("ph") != "X" or event.get("cat") != "user_annotation" or name in seen:
            continue
        match = SCOPE_PATTERN.match(name)
        if match is None:
            continue
        whole, layer, child = match.groups()
        if layer is None:
            part = whole
        elif child is None:
            part = "layer"
        else:
            part = "norm" if "norm" in child else child
        seen[name] = {
            "name": name, "layer": None if layer is None else int(layer), "part": part, "ts": float(event["ts"]),
            "dur": float(event["dur"]),
        }
    if not seen:
        return []
    origin = min(row["ts"] for row in seen.values())
    rows = [
        {
            "name": r["name"], "layer": r["layer"], "part": r["part"], "start_ms": (r["ts"] - origin) / 1e3,
            "duration_ms": r["dur"] / 1e3,
        }
        for r in seen.values()
    ]
    return sorted(rows, key=lambda row: row["start_ms"])


def predicted_vs_measured(
    info: ModelShape | LoadedModel, num_tokens: int, layer_times: LayerTimes, peaks: MachinePeaks,
    last_layer_rows: int | None = None,
) -> list[dict]:
    """Roofline prediction of each layer (every layer has the same shape) next to its measured time.

    The prediction sums ``predict_layer_times`` per op (max of FLOPs / peak matmul and
    bytes / bandwidth) grouped like the timers: attention = q/k/v/o projections + QK^T +
    PV (the attention module's clock also covers RoPE and the KV write), MLP = its
    matrices, norms = both norms. ``*_ratio`` = measured / predicted: the gap, shown.
    ``last_layer_rows``: the rows the last layer runs attention and what follows for (the engine's own
    forward keeps only the row it samples from there; None: every row, as the stock forward).
    """
    groups = {"attention": ATTENTION_OPS, "mlp": MLP_OPS, "norms": ("norms",)}

    def prediction(kept_rows: int | None) -> tuple[dict, dict]:
        ops = predict_layer_times(info, num_tokens, num_tokens, None, peaks, kept_rows)
        predicted, bound = {}, {}
        for group, names in groups.items():
            members = [op for op in ops if op["op"] in names]
            predicted[group] = sum(op["predicted_s"] for op in members)
            compute_s = sum(op["flops"] for op in members) / (peaks.matmul_gflops * 1e9)
            memory_s = sum(op["bytes"] for op in members) / (peaks.memory_gb_s * 1e9)
            bound[group] = "compute" if compute_s >= memory_s else "memory"
        return predicted, bound

    every, last = prediction(None), prediction(last_layer_rows)
    rows = []
    num_layers = len(layer_times.attention_s)
    for i, (attention, mlp, norms) in enumerate(zip(layer_times.attention_s, layer_times.mlp_s, layer_times.norms_s)):
        measured = {"attention": attention, "mlp": mlp, "norms": norms}
        predicted, bound = last if i == num_layers - 1 else every
        row = {"layer": i}
        for group in groups:
            row[f"predicted_{group}_ms"] = predicted[group] * 1e3
            row[f"measured_{group}_ms"] = measured[group] * 1e3
            row[f"{group}_ratio"] = measured[group] / predicted[group] if predicted[group] else float("nan")
            row[f"{group}_bound"] = bound[group]
        rows.append(row)
    return rows
