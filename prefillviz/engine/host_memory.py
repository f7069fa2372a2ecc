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
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading

STOCK_ENV = "PREFILLVIZ_STOCK_MALLOC"
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024  # glibc's largest: HEAP_MAX_SIZE / 2 on 64-bit
TRIM_THRESHOLD_BYTES = 256 * 1024 * 1024  # 64 MiB was enough for no faults at 2,048 tokens; the most a peak RSS can grow by

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
        f"glibc {version} malloc keeps freed memory for reuse (blocks up to {MMAP_THRESHOLD_BYTES >> 20} MiB from its heap, "
        f"up to {TRIM_THRESHOLD_BYTES >> 20} MiB of it kept), so a step's tensors don't fault in fresh pages"
    )
