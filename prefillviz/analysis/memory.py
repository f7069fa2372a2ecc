"""KV-cache memory accounting: the formula, the engine's real tensors, and what GQA saves.

Every token leaves one key and one value vector per KV head in every layer:

    bytes per token = 2 (K and V) x layers x kv_heads x head_dim x dtype bytes
    SmolLM2-135M fp32: 2 x 30 x 3 x 64 x 4 = 46,080 B  (MHA, kv_heads = heads = 9: 138,240 B)

Grouped-query attention (Ainslie et al. 2023) shares each KV head among
``heads / kv_heads`` query heads, which divides the cache by that factor. The engine's
paged cache (``engine/kv_cache.py``) holds ``num_blocks x block_size`` token slots in
per-layer K and V tensors; ``kv_memory_report`` checks the formula against their size.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import psutil
import torch

from prefillviz.analysis.model_shape import ModelShape, model_shape
from prefillviz.engine.kv_cache import kv_bytes_per_token
from prefillviz.machine.devices import dtype_name

try:
    import resource
except ImportError:  # Windows
    resource = None


@dataclass
class KVMemoryReport:
    """KV-cache sizes of one model in one dtype.

    Attributes:
        dtype: element type of K/V (``"float32"``, ``"bfloat16"``, ...).
        dtype_bytes: bytes per element.
        num_layers, num_heads, num_kv_heads, head_dim: the model shape the formula uses.
        bytes_per_token: ``2 x layers x kv_heads x head_dim x dtype_bytes``.
        num_tokens: tokens the ``total_bytes`` is for.
        total_bytes: ``bytes_per_token x num_tokens``.
        mha_bytes_per_token: the same with ``kv_heads = heads`` (no GQA).
        gqa_saving_factor: ``heads / kv_heads`` = ``mha_bytes_per_token / bytes_per_token``.
        block_size: tokens per block (engine only, else None).
        num_blocks: blocks in the engine's cache (engine only).
        bytes_per_block: ``block_size x bytes_per_token`` over all layers (engine only).
        bytes_per_block_per_layer: K + V of one block in one layer (engine only).
        cache_num_bytes: measured size of the engine's K/V tensors (``kv_cache.num_bytes``);
            allocated with ``torch.empty``, so pages become resident only once written.
        capacity_tokens: token slots of the engine's cache (engine only).
    """

    dtype: str
    dtype_bytes: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    bytes_per_token: int
    num_tokens: int
    total_bytes: int
    mha_bytes_per_token: int
    gqa_saving_factor: float
    block_size: int | None = None
    num_blocks: int | None = None
    bytes_per_block: int | None = None
    bytes_per_block_per_layer: int | None = None
    cache_num_bytes: int | None = None
    capacity_tokens: int | None = None

    @property
    def formula(self) -> str:
        """The per-token formula with this model's numbers filled in."""
        return (
            f"2 x {self.num_layers} layers x {self.num_kv_heads} kv_heads x {self.head_dim} head_dim "
            f"x {self.dtype_bytes} B = {self.bytes_per_token:,} B/token"
        )


def _dtype_of(dtype: str | torch.dtype | None, default: torch.dtype | None) -> torch.dtype:
    if dtype is None:
        if default is None:
            raise ValueError("Give a dtype: a ModelShape alone only knows its dtype's size.")
        return default
    return dtype if isinstance(dtype, torch.dtype) else getattr(torch, dtype_name(dtype))


def kv_memory_report(
    engine_or_info: Any, dtype: str | torch.dtype | None = None, num_tokens: int = 1
) -> KVMemoryReport:
    """Accounts the KV cache of a model, and of an engine's real cache tensors.

    Args:
        engine_or_info: an ``LLMEngine`` (adds its blocks and measured tensor bytes) or a
            ``ModelShape``.
        dtype: K/V dtype; None takes the engine's (an engine's measured bytes are always
            in its own dtype). With a ``ModelShape`` and no dtype, ``info.dtype_bytes`` is used.
        num_tokens: tokens to size ``total_bytes`` for.

    Returns:
        The ``KVMemoryReport``.
    """
    engine = None if isinstance(engine_or_info, ModelShape) else engine_or_info
    info: ModelShape = engine_or_info if engine is None else model_shape(engine.model)
    if engine is None and dtype is None:
        dtype_bytes = info.dtype_bytes
        kv_dtype = {4: "float32", 2: "16-bit", 1: "8-bit"}.get(dtype_bytes, f"{dtype_bytes}-byte")
    else:
        torch_dtype = _dtype_of(dtype, engine.dtype if engine is not None else None)
        dtype_bytes = torch.empty((), dtype=torch_dtype).element_size()
        kv_dtype = dtype_name(torch_dtype)
    per_token = kv_bytes_per_token(info.num_layers, info.num_kv_heads, info.head_dim, dtype_bytes)
    # one KV head per query head
    mha_per_token = kv_bytes_per_token(info.num_layers, info.num_heads, info.head_dim, dtype_bytes)
    report = KVMemoryReport(
        dtype=kv_dtype,
        dtype_bytes=dtype_bytes,
        num_layers=info.num_layers,
        num_heads=info.num_heads,
        num_kv_heads=info.num_kv_heads,
        head_dim=info.head_dim,
        bytes_per_token=per_token,
        num_tokens=num_tokens,
        total_bytes=per_token * num_tokens,
        mha_bytes_per_token=mha_per_token,
        gqa_saving_factor=info.num_heads / info.num_kv_heads,
    )
    if engine is not None:
        block_size = engine.config.block_size
        report.block_size = block_size
        report.num_blocks = engine.num_blocks
        report.bytes_per_block = block_size * per_token
        report.bytes_per_block_per_layer = block_size * per_token // info.num_layers
        report.cache_num_bytes = engine.kv_cache.num_bytes
        report.capacity_tokens = engine.num_blocks * block_size
    return report


def peak_rss_bytes() -> int:
    """Peak resident memory of this process so far, in bytes.

    On Linux reads VmHWM from /proc/self/status (the high-water mark of this process's own
    memory, reset at exec). Elsewhere reads ``resource.getrusage(RUSAGE_SELF).ru_maxrss``, the kernel's high-water mark
    (Linux reports KiB, macOS bytes). Linux updates that mark lazily, so it can trail the
    current RSS by a few hundred KiB: the larger of the two (psutil ``memory_info().rss``)
    is returned. Without ``resource`` (Windows) psutil's ``peak_wset`` is used.

    Returns:
        Bytes.
    """
    memory = psutil.Process().memory_info()
    high_water = _vm_hwm_bytes()
    if high_water is not None:
        return max(memory.rss, high_water)
    if resource is None:
        return getattr(memory, "peak_wset", memory.rss)
    max_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return max(memory.rss, max_rss if sys.platform == "darwin" else max_rss * 1024)


def _vm_hwm_bytes() -> int | None:
    """Linux's per-process RSS high-water mark (VmHWM). Unlike ``ru_maxrss`` it starts afresh
    at exec, so a child started from a big parent reports only its own peak."""
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def current_rss_bytes() -> int:
    """Resident memory of this process now, in bytes (psutil ``memory_info().rss``)."""
    return psutil.Process().memory_info().rss
