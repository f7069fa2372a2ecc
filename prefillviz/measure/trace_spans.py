"""Per-layer spans out of a profiler's Chrome trace, and the medians ``gpu_check``'s clocks check takes of them."""

from __future__ import annotations

import json
import statistics


def scope_spans_s(chrome_trace: bytes, num_layers: int) -> tuple[list[float], str]:
    """Each ``layers.i`` scope's span in the profiler's Chrome trace of one step: (seconds per layer, which span).

    On a GPU, the device-side span of the scope: from the first kernel of ``layers.i`` or of any
    scope nested in it (``layers.i.attention``, ...) to the last one's end, launch gaps included, as
    CUDA events count them. The trace's own ``gpu_user_annotation`` of ``layers.i`` is not that: it
    spans only the kernels launched in the scope itself, outside its nested scopes (on an H200 it
    began after the attention's kernels, with the residual add). Where there is no device side (a
    CPU), the scope's CPU span, which holds its nested scopes.
    """
    events = json.loads(chrome_trace).get("traceEvents", [])
    extents: dict[str, dict[int, tuple[float, float]]] = {"gpu_user_annotation": {}, "user_annotation": {}}
    for event in events:
        category, name = event.get("cat"), event.get("name", "")
        if category not in extents or not name.startswith("layers.") or "dur" not in event:
            continue
        layer = name.split(".")[1]
        if not layer.isdigit():
            continue
        start = float(event["ts"])
        end = start + float(event["dur"])
        low, high = extents[category].get(int(layer), (start, end))
        extents[category][int(layer)] = (min(low, start), max(high, end))
    category = "gpu_user_annotation" if extents["gpu_user_annotation"] else "user_annotation"
    spans = extents[category]
    return [(spans[i][1] - spans[i][0]) / 1e6 if i in spans else 0.0 for i in range(num_layers)], category


def median_per_layer(passes: list[list[float]]) -> list[float]:
    """Each layer's median over the passes (each a list of per-layer values)."""
    return [statistics.median(values) for values in zip(*passes)]


def median_ratio(numerators: list[float], denominators: list[float]) -> float:
    """The median of numerator / denominator over the layers with a positive denominator (nan: none)."""
    ratios = [a / b for a, b in zip(numerators, denominators) if b > 0]
    return statistics.median(ratios) if ratios else float("nan")
