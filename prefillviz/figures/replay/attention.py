"""The prefill scene's attention maps: a few heads' softmax over the prompt, from the inspection pass, one byte a cell.

The one-step prefill's inspection pass captured every layer's post-RoPE queries and keys; each map
is rebuilt from them the way the Attention page rebuilds its maps
(``analysis.attention_maps.attention_probs``: softmax(q kᵀ × scale + causal mask)), nothing is
computed a second way. Which maps: the first, middle and last layer, and as many heads (from head 0
on, the same heads in each layer) as ``MAX_MAP_BYTES`` holds; head 0 always.

    cells   the lower triangle, row-major, base64: row q holds keys 0..q (N (N + 1) / 2 bytes);
            above the diagonal is masked (p = 0) and not stored

              keys k ->
      query   0                    byte index of (q, k): q (q + 1) / 2 + k
        q     1 2
        |     3 4 5
              6 7 8 9

    value   round(255 × sqrt(p)): the sqrt scale lifts the small probabilities a sink drowns out;
            p = (value / 255)² back, within half a step of sqrt(p) (``decode_cells``)
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

from prefillviz.analysis.attention_maps import attention_probs
from prefillviz.engine.trace import Trace

MAX_MAP_BYTES = 4 << 20  # the maps' cells together, before base64 (head 0 of each layer is kept past it)
SCALE = "sqrt"  # how a byte maps to a probability (the legend says it)


def map_layers(num_layers: int) -> list[int]:
    """The layers whose maps a replay keeps: the first, the middle and the last."""
    return sorted({0, num_layers // 2, num_layers - 1})


def map_heads(num_heads: int, num_layers: int, num_tokens: int, max_bytes: int = MAX_MAP_BYTES) -> list[int]:
    """Heads 0, 1, ... while ``num_layers`` maps of each (N (N + 1) / 2 bytes a map) fit ``max_bytes``; head 0
    always."""
    per_head = num_layers * num_tokens * (num_tokens + 1) // 2
    return list(range(max(1, min(num_heads, max_bytes // per_head))))


def encode_cells(probs: np.ndarray) -> str:
    """An (N, N) causal map as ``cells``: its lower triangle, row-major, round(255 sqrt(p)) a byte, base64."""
    lower = probs[np.tril_indices(probs.shape[0])]
    quantized = np.clip(np.rint(np.sqrt(np.clip(lower, 0.0, 1.0)) * 255), 0, 255).astype(np.uint8)
    return base64.b64encode(quantized.tobytes()).decode("ascii")


def decode_cells(cells: str, num_tokens: int) -> np.ndarray:
    """``cells`` back to the (N, N) map of probabilities, zero above the diagonal (what the player draws)."""
    quantized = np.frombuffer(base64.b64decode(cells), dtype=np.uint8)
    probs = np.zeros((num_tokens, num_tokens), dtype=np.float32)
    probs[np.tril_indices(num_tokens)] = (quantized.astype(np.float32) / 255) ** 2
    return probs


def attention_payload(trace: Trace, max_bytes: int = MAX_MAP_BYTES) -> dict[str, Any] | None:
    """The maps of the trace's first request, from its captured q/k (None without them: not an inspection pass).

    Args:
        trace: the one-step prefill run, capture level ``inspect``.
        max_bytes: how many bytes of cells the heads beyond head 0 may take (``map_heads``).

    Returns:
        num_tokens, num_heads, num_kv_heads, layers, heads, scale, and maps: one per (layer, head),
        layer by layer, each ``{"layer", "head", "scaling", "cells"}``.
    """
    request_id = next(iter(trace.requests))
    captured = trace.captured_qk.get(request_id)
    if captured is None or not captured.queries:
        return None
    num_heads, num_tokens = captured.queries[0].shape[:2]  # (H, N, D)
    layers = map_layers(len(captured.queries))
    heads = map_heads(num_heads, len(layers), num_tokens, max_bytes)
    maps = [
        {"layer": layer, "head": head, "scaling": captured.scaling[layer],
         "cells": encode_cells(attention_probs(captured.queries[layer], captured.keys[layer], head,
                                               captured.scaling[layer]).numpy())}
        for layer in layers for head in heads
    ]
    return {
        "num_tokens": int(num_tokens), "num_heads": int(num_heads), "num_kv_heads": int(captured.keys[0].shape[0]),
        "layers": layers, "heads": heads, "scale": SCALE, "maps": maps,
    }
