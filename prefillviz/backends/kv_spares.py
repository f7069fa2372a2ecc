"""The measured backend's KV cache memory, kept between engines (CPU only).

A CPU commits a page of a fresh allocation when it is first written, and on these machines each
such page fault costs microseconds: a new engine's first 512-token prefill wrote ~3,000 fresh
pages of cache and ran ~40 ms slower than the same step on memory already touched. vLLM allocates
(and zeroes) its cache once at start-up and keeps it. Ours is per engine, so a dropped engine's
tensors go back to a small pool, and the next engine of the same cache shape takes them. As with
``torch.empty`` (whose memory the allocator may hand back from any freed tensor), a slot holds
garbage until this engine writes it, and nothing reads a slot its own step did not write. A set is
taken only when no view of it is left, and the pool holds at most ``SPARE_BYTES``.
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections import OrderedDict, deque

import torch

from prefillviz.backends.host_memory import keep_freed_memory

SPARE_BYTES = 1024 * 1024 * 1024  # the most cache memory kept for the next engine (1 GiB: two default caches)
_spares: OrderedDict[tuple, list[tuple[list[torch.Tensor], list[torch.Tensor]]]] = OrderedDict()
_spares_lock = threading.Lock()
# sets a finalizer gave back, pooled at the next take (a finalizer takes no lock: it may run inside one)
_returned: deque = deque()


class _Layers(list):
    """A cache's list of per-layer tensors; when the cache drops it, its tensors go back to the pool."""


def kept_kv_cache(num_layers: int, shape: tuple, dtype: torch.dtype, device: torch.device) -> tuple[list, list]:
    """Per layer, a K and a V tensor of ``shape``: a dropped engine's where one of this shape is free, else new."""
    key = (num_layers, shape, dtype, device)
    spare = _take_spare(key)
    if spare is None:  # torch.empty: pages are only committed when a block is first written
        spare = tuple([torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)] for _ in "kv")
    keys, values = _Layers(spare[0]), _Layers(spare[1])
    if device.type == "cpu":
        keep_freed_memory()  # once per process: a step's tensors reuse freed memory, not fresh pages (host_memory)
        weakref.finalize(keys, _give_back, key, tuple(keys), tuple(values)).atexit = False
    return keys, values


def _bytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.nelement() * t.element_size() for t in tensors)


def _unshared(tensors: list[torch.Tensor]) -> bool:
    """Whether nothing outside the pool holds any of these tensors or their memory: no tensor object
    kept (a list of a dropped engine's layers, say) and no view of one (one layer's keys in a figure);
    False where this torch can't tell."""
    use_count = getattr(torch._C, "_storage_Use_Count", None)
    if use_count is None:
        return False
    held_by_a_list_only = [torch.empty(0)]
    # this Python's count for a tensor only a list holds, seen from here
    baseline = [sys.getrefcount(t) for t in held_by_a_list_only][0]
    # 2: the tensor and this call's storage
    return all(sys.getrefcount(t) <= baseline and use_count(t.untyped_storage()._cdata) <= 2 for t in tensors)


def _give_back(key: tuple, keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
    """A dropped engine's cache, for the pool: in new lists, so that whoever still holds the engine's own lists
    holds the tensors too (``_unshared`` sees it)."""
    if _bytes(keys) + _bytes(values) <= SPARE_BYTES:
        _returned.append((key, list(keys), list(values)))


def _pool_returned() -> None:
    """The sets given back since the last take into the pool, the oldest out past ``SPARE_BYTES`` (under the lock)."""
    while _returned:
        key, keys, values = _returned.popleft()
        _spares.setdefault(key, []).append((keys, values))
        _spares.move_to_end(key)
    total = sum(_bytes(k) + _bytes(v) for sets in _spares.values() for k, v in sets)
    while total > SPARE_BYTES:
        oldest = next(iter(_spares))
        k, v = _spares[oldest].pop(0)
        total -= _bytes(k) + _bytes(v)
        if not _spares[oldest]:
            del _spares[oldest]


def _take_spare(key: tuple) -> tuple[list[torch.Tensor], list[torch.Tensor]] | None:
    """A kept set of this cache shape that nothing else holds, or None."""
    with _spares_lock:
        _pool_returned()
        sets = _spares.get(key, [])
        for i in range(len(sets)):
            if _unshared(sets[i][0]) and _unshared(sets[i][1]):
                keys, values = sets.pop(i)
                if not sets:
                    del _spares[key]
                return keys, values
    return None
