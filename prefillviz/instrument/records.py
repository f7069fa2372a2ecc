"""What a capture level adds to a trace (``instrument/capture.py`` fills them on its steps and trace)."""

from __future__ import annotations

import gzip
from dataclasses import dataclass, field

import numpy as np

CAPTURE_LEVELS = ("none", "timing", "inspect", "profile")
"""none: step times only. timing: + per-layer and sub-layer times. inspect: + KV write log,
queries and keys, hidden-state norms. profile: timing under torch.profiler (slower; its
numbers are labelled as such)."""


@dataclass
class LayerTimes:
    """Wall time of each part of one forward (one step), per decoder layer.

    ``other_s`` per layer is the layer's total minus attention, MLP and norms (residual
    adds, rotary embedding). ``clock`` says how it was read.
    """

    clock: str  # "perf_counter" (CPU) or "cuda events"
    attention_s: list[float]  # (L,) attention module: projections, RoPE, KV write, SDPA
    mlp_s: list[float]  # (L,)
    norms_s: list[float]  # (L,)
    layer_s: list[float]  # (L,) whole decoder layer
    embedding_s: float
    final_norm_s: float
    lm_head_s: float

    @property
    def other_s(self) -> list[float]:
        return [t - a - m - n for t, a, m, n in zip(self.layer_s, self.attention_s, self.mlp_s, self.norms_s)]


@dataclass
class KVWriteRecord:
    """What one step wrote into the paged KV cache (the same slots in every layer)."""

    positions: np.ndarray  # (T,) token position within its request
    slots: np.ndarray  # (T,) cache slot = block * block_size + offset
    blocks: np.ndarray  # (T,) physical block
    layers_written: list[int]  # layer indices, in the order they wrote
    bytes_per_layer: int  # K and V bytes written per layer
    key_norms: np.ndarray  # (L, T, KVH) L2 norm of each written key vector
    value_norms: np.ndarray  # (L, T, KVH)


@dataclass
class CapturedQK:
    """Post-RoPE queries, keys and values of one request, every layer: what attention saw
    and what was written to the KV cache, for rebuilding attention maps and comparing caches."""

    dtype: str  # what they are stored in
    positions: np.ndarray  # (N,) positions covered, in order
    scaling: list[float]  # (L,) the softmax scale each layer used
    queries: list[np.ndarray]  # L x (H, N, D)
    keys: list[np.ndarray]  # L x (KVH, N, D)
    values: list[np.ndarray] = field(default_factory=list)  # L x (KVH, N, D)


@dataclass
class ProfileRecord:
    """torch.profiler output: one row per op, and the Chrome trace (opens in Perfetto).

    The Chrome trace is kept in memory, gzip-compressed (``chrome_trace_json`` gives the
    JSON); ``chrome_trace_path`` names a file only when the caller asked for one.
    """

    op_table: list[dict]  # op, calls, self_time_s, total_time_s, device_time_s (self), device_total_s, flops
    chrome_trace_path: str
    activities: list[str]
    chrome_trace_gz: bytes = b""

    def chrome_trace_json(self) -> bytes:
        """The Chrome trace as JSON bytes (empty when the run kept none)."""
        return gzip.decompress(self.chrome_trace_gz) if self.chrome_trace_gz else b""
