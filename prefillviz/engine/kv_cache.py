"""Paged K/V storage: one pair of tensors per layer, addressed by slot.

    layer l:  K[l], V[l]  shape (num_blocks, block_size, num_kv_heads, head_dim)
    slot = block_id * block_size + offset_in_block

The runner turns each scheduled token's position into a slot through the request's block
table (the *slot mapping*); the attention function writes the new K/V there, and the
kernels in ``prefillviz/kernels/paged_attention.py`` gather a request's whole context back through
the same table.

**Memory kept between engines** (CPU only). A CPU commits a page of a fresh allocation when it is
first written, and on these machines each such page fault costs microseconds: a new engine's first
512-token prefill wrote ~3,000 fresh pages of cache and ran ~40 ms slower than the same step on
memory already touched. vLLM allocates (and zeroes) its cache once at start-up and keeps it. Ours
is per engine, so a dropped engine's tensors go back to a small pool, and the next engine of the
same cache shape takes them. As with ``torch.empty`` (whose memory the allocator may hand back
from any freed tensor), a slot holds garbage until this engine writes it, and nothing reads a slot
its own step did not write. A set is taken only when no view of it is left, and the pool holds at
most ``SPARE_BYTES``.
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections import OrderedDict, deque

import torch

from prefillviz.engine.host_memory import keep_freed_memory

SPARE_BYTES = 1024 * 1024 * 1024  # the most cache memory kept for the next engine (1 GiB: two default caches)
_spares: OrderedDict[tuple, list[tuple[list[torch.Tensor], list[torch.Tensor]]]] = OrderedDict()
_spares_lock = threading.Lock()
_returned: deque = deque()  # sets a finalizer gave back, pooled at the next take (a finalizer takes no lock: it may run inside one)


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """The KV cache of one token: 2 (K and V) x layers x kv_heads x head_dim x bytes per element.

    The one place this formula is written (``ModelShape``, the memory report and the KV write log use it).
    """
    return 2 * num_layers * num_kv_heads * head_dim * dtype_bytes


class PagedKVCache:
    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.num_layers = num_layers
        self.num_blocks = num_blocks
        self.block_size = block_size
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        key = (num_layers, shape, dtype, torch.device(device))
        spare = _take_spare(key)
        if spare is None:  # torch.empty: pages are only committed when a block is first written
            spare = tuple([torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)] for _ in "kv")
        self.key_cache, self.value_cache = spare
        if key[3].type == "cpu":
            keep_freed_memory()  # once per process: a step's tensors reuse freed memory, not fresh pages (host_memory)
            weakref.finalize(self, _give_back, key, self.key_cache, self.value_cache).atexit = False

    @property
    def num_bytes(self) -> int:
        return sum(t.nelement() * t.element_size() for t in self.key_cache + self.value_cache)

    def write(self, layer_idx: int, slot_mapping: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
        """Store new K/V. ``key``/``value``: (T, num_kv_heads, head_dim); ``slot_mapping``: (T,)."""
        self.key_cache[layer_idx].view(-1, *key.shape[1:]).index_copy_(0, slot_mapping, key)
        self.value_cache[layer_idx].view(-1, *value.shape[1:]).index_copy_(0, slot_mapping, value)


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
    baseline = [sys.getrefcount(t) for t in held_by_a_list_only][0]  # this Python's count for a tensor only a list holds, seen from here
    return all(sys.getrefcount(t) <= baseline and use_count(t.untyped_storage()._cdata) <= 2 for t in tensors)  # 2: the tensor and this call's storage


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
