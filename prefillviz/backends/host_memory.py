"""The host allocator, set once per process as a CPU serving engine sets it: freed memory kept for reuse.

On a CPU, torch's tensors come from the C library's ``malloc``. glibc serves a large block with a
fresh ``mmap`` (above a threshold it adapts as blocks are freed) and hands freed memory at the
top of its heap back to the system (``M_TRIM_THRESHOLD``). Each fresh page is then committed on
its first write, a page fault of a few microseconds on these machines. Measured here (Xeon, 2
cores, bf16, warm): a 2,048-token prefill took ~6,000-35,000 page faults per forward and varied
from 0.55 to 0.65 s; with both settings below, none, 0.54-0.60 s. (Setting the trim threshold
alone is worse: it stops glibc adapting the mmap threshold, every block over 128 KiB is mapped
fresh, ~270,000 faults, 0.87 s.) vLLM's CPU backend asks for tcmalloc (``LD_PRELOAD``) for the
same reason; this is the same policy, set through glibc's ``mallopt``:

- ``M_MMAP_THRESHOLD`` at its largest (32 MiB on 64 bits): the forward's activations come from the heap;
- ``M_TRIM_THRESHOLD`` 256 MiB: up to that much freed memory stays in the process for the next step.

Elsewhere (macOS, musl, a GPU's memory) nothing is changed; ``PREFILLVIZ_STOCK_MALLOC=1`` leaves
glibc's defaults (to measure the difference). ``status()`` says what was done.

``huge_page_arena`` and ``huge_page_empty`` put the brgemm and slab linears' packed weights on memory
of their own, advised for transparent huge pages (``madvise(MADV_HUGEPAGE)``, Linux): a model's packs
carved side by side out of 2 MiB-aligned regions, so packs under 2 MiB lie on huge pages too. A
forward reads every layer's weights once, from beyond L2. Measured on the Xeon with AMX, the packs
moved between huge-page and plain memory in one process (alternating pairs, paired medians): bf16 512
tokens -1.65 to -2.35 ms of 75-84 in four runs, a one-token step -2.0 of 15.6; bf16 2,048 tokens and
fp32 512 within their noise (quartiles from -5 to +12 ms). In separate processes, with the weights
undisturbed between prefills, no difference within a ±3 ms spread. Where the kernel has THP off
(``never``), or the system has no such advice, the memory is plain pages. ``PREFILLVIZ_NO_HUGE_PAGES=1``
leaves the packs on the heap (to measure the difference).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import math
import mmap
import os
import threading

import torch

STOCK_ENV = "PREFILLVIZ_STOCK_MALLOC"
NO_HUGE_PAGES_ENV = "PREFILLVIZ_NO_HUGE_PAGES"
HUGE_PAGE_BYTES = 2 << 20  # x86-64's and arm64's (4 KiB granule) transparent huge page
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024  # glibc's largest: HEAP_MAX_SIZE / 2 on 64-bit
# 64 MiB was enough for no faults at 2,048 tokens; the most a peak RSS can grow by
TRIM_THRESHOLD_BYTES = 256 * 1024 * 1024

_lock = threading.Lock()
_status: str | None = None


def keep_freed_memory() -> str:
    """Set the allocator once per process (the first CPU engine's KV cache calls it); returns ``status()``."""
    global _status
    with _lock:
        if _status is None:
            _status = _apply()
        return _status


def status() -> str:
    """What the host allocator does here, in words ('' before any CPU engine started)."""
    return _status or ""


def _apply() -> str:
    if os.environ.get(STOCK_ENV, "").strip() not in ("", "0"):
        return f"the C library's default malloc ({STOCK_ENV} is set)"
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
        mallopt = libc.mallopt
        gnu_get_libc_version = libc.gnu_get_libc_version  # glibc only: musl's mallopt does nothing
    except (OSError, AttributeError):
        return "the C library's default malloc (not glibc: its settings are left as they are)"
    gnu_get_libc_version.restype = ctypes.c_char_p
    version = gnu_get_libc_version().decode()
    # mmap's threshold first: setting the trim threshold alone would also fix the mmap threshold at its default
    if not (mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)):
        return f"the C library's default malloc (glibc {version} refused mallopt)"
    return (
        f"glibc {version} malloc keeps freed memory for reuse (blocks up to {MMAP_THRESHOLD_BYTES >> 20} MiB "
        f"from its heap, up to {TRIM_THRESHOLD_BYTES >> 20} MiB of it kept), so a step's tensors don't fault in "
        "fresh pages"
    )


_arena = threading.local()  # .room: [the region (uint8), its next free offset, its size] while huge_page_arena runs


@contextlib.contextmanager
def huge_page_arena(region_bytes: int = 32 << 20):
    """While active in this thread, ``huge_page_empty`` carves tensors one after another (4 KiB apart)
    out of shared 2 MiB-aligned regions of ``region_bytes``, a new region when one is full: weights
    of 0.6-2 MiB then lie on huge pages too, without a huge page each. A region lives while any
    tensor carved from it does (the engine's packs of one model: made, used and freed together)."""
    outer = getattr(_arena, "room", None)
    _arena.room = [None, 0, region_bytes]
    try:
        yield
    finally:
        _arena.room = outer


def _advised_region(nbytes: int) -> torch.Tensor | None:
    """nbytes of fresh memory (uint8) starting on a 2 MiB boundary, advised MADV_HUGEPAGE; None where refused."""
    try:
        region = mmap.mmap(-1, nbytes + HUGE_PAGE_BYTES, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        region.madvise(mmap.MADV_HUGEPAGE)
    except (OSError, ValueError):
        return None
    raw = torch.frombuffer(region, dtype=torch.uint8)  # keeps `region` mapped as long as a view of it lives
    start = -raw.data_ptr() % HUGE_PAGE_BYTES
    return raw[start : start + nbytes]  # the untouched rest of the map is never committed


def huge_page_empty(shape: tuple[int, ...], dtype: torch.dtype) -> tuple[torch.Tensor, bool]:
    """(an uninitialised CPU tensor, whether its memory is advised for transparent huge pages).

    Inside ``huge_page_arena``: carved from the thread's current region. Outside: a region of its
    own when it is at least a huge page's worth. Elsewhere (smaller tensors outside an arena, a
    system without the advice, a refused map, ``PREFILLVIZ_NO_HUGE_PAGES=1``): ``torch.empty``, and False.
    """
    nbytes = math.prod(shape) * dtype.itemsize
    raw = None
    if hasattr(mmap, "MADV_HUGEPAGE") and os.environ.get(NO_HUGE_PAGES_ENV, "").strip() in ("", "0"):
        room = getattr(_arena, "room", None)
        if room is not None and nbytes <= room[2]:
            raw = _carve(room, nbytes)
        elif nbytes >= HUGE_PAGE_BYTES:
            raw = _advised_region(nbytes)
    if raw is None:
        return torch.empty(shape, dtype=dtype), False
    return raw.view(dtype).view(shape), True


def _carve(room: list, nbytes: int) -> torch.Tensor | None:
    """nbytes (uint8) from the arena's current region, on a 4 KiB boundary; a new region when it is full."""
    if room[0] is None or room[1] + nbytes > room[2]:
        room[0], room[1] = _advised_region(room[2]), 0
        if room[0] is None:
            return None
    start = room[1]
    room[1] = start + -(-nbytes // 4096) * 4096
    return room[0][start : start + nbytes]
