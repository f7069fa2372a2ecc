"""The paged attention the engine can run, over one step's packed requests and the paged KV cache.

Every version takes (q, k_new, v_new, key_cache, value_cache, step, scale) and returns (H, T, D):
the step's T new queries, packed request after request, each attending its own request's
context up to its position (``prefillviz/kernels/paged_attention.py`` draws the signature, says
what each version changes and times them side by side on the Kernel timings page).

Here: v1 naive (the oracle every other version is checked against), v2 loop, v3 packed and
v6 loop with fp32 decodes, plain torch. v7, the engine's C++ kernel, is in ``engine_ops.py``.
Which one a step runs is measured on the machine (``prefillviz/engine/dispatch.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


@dataclass
class PagedStep:
    """Where each request of a step sits in the packed batch and in the cache.

    Attributes:
        query_start_loc: R + 1 offsets: request r's new tokens are rows [s[r], s[r + 1]).
        num_computed: per request, tokens already cached before this step.
        slot_mapping: (T,) cache slot of every new token (slot = block * block_size + offset).
        context_slots: per request, slots of positions 0 .. context_len - 1, or None when
            nothing was cached (the context is then exactly the new tokens).
    """

    query_start_loc: list[int]
    num_computed: list[int]
    slot_mapping: torch.Tensor
    context_slots: list[torch.Tensor | None]
    _kept: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def kept(self, key: tuple, make: Callable[[], object]):
        """``make()``, made once per step and kept on it: every layer of the step asks for the same
        (a chunk's offset mask, where a request's consecutive slots start)."""
        if key not in self._kept:
            self._kept[key] = make()
        return self._kept[key]

    @property
    def num_requests(self) -> int:
        return len(self.num_computed)

    def query_len(self, r: int) -> int:
        return self.query_start_loc[r + 1] - self.query_start_loc[r]

    def context_len(self, r: int) -> int:
        return self.num_computed[r] + self.query_len(r)

    def slots(self, r: int) -> torch.Tensor:
        """Cache slots of request r's positions 0 .. context_len - 1."""
        slots = self.context_slots[r]
        return self.slot_mapping[self.query_start_loc[r] : self.query_start_loc[r + 1]] if slots is None else slots

    def packed_positions(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(query request, query position, key request, key position): (T,), (T,), (S,), (S,).

        S = the sum of the context lengths: the keys of every request, one after another,
        in the order ``packed_slots`` gathers them.
        """
        query_lens = torch.tensor([self.query_len(r) for r in range(self.num_requests)])
        context_lens = torch.tensor([self.context_len(r) for r in range(self.num_requests)])
        requests = torch.arange(self.num_requests)
        query_request = requests.repeat_interleave(query_lens)
        key_request = requests.repeat_interleave(context_lens)
        key_position = torch.arange(int(context_lens.sum())) - (context_lens.cumsum(0) - context_lens).repeat_interleave(context_lens)
        query_position = torch.arange(len(query_request)) - (query_lens.cumsum(0) - query_lens).repeat_interleave(query_lens)
        query_position += torch.tensor(self.num_computed).repeat_interleave(query_lens)
        return tuple(t.to(device) for t in (query_request, query_position, key_request, key_position))

    def packed_slots(self) -> torch.Tensor:
        """Slots of every request's whole context, request after request: (S,)."""
        return torch.cat([self.slots(r) for r in range(self.num_requests)])


def _gather(cache_tensor: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """(n, KVH, D) rows of a (num_blocks, block_size, KVH, D) cache at ``slots``, as (KVH, n, D)."""
    return cache_tensor.view(-1, *cache_tensor.shape[2:]).index_select(0, slots).transpose(0, 1)


def _context(cache_tensor: torch.Tensor, step: PagedStep, r: int) -> torch.Tensor:
    """Request r's keys (or values) as (KVH, ctx, D): read in place where its slots are one run of
    consecutive slots (its blocks follow each other in the pool, as a fresh engine allocates them),
    else gathered. The same numbers either way; in place spares a copy of the context per layer."""
    first = consecutive_from(step, r)
    if first is None:
        return _gather(cache_tensor, step.slots(r))
    return cache_tensor.view(-1, *cache_tensor.shape[2:])[first : first + step.context_len(r)].transpose(0, 1)


def consecutive_from(step: PagedStep, r: int) -> int | None:
    """The first slot of request r's context when its slots are consecutive, else None (once per step)."""
    def first() -> int | None:
        slots = step.slots(r)
        consecutive = len(slots) > 0 and int(slots[-1]) - int(slots[0]) == len(slots) - 1 and bool((slots.diff() == 1).all())
        return int(slots[0]) if consecutive else None

    return step.kept(("consecutive_from", r), first)


# ------------------------------------------------------------------------------ versions
def paged_naive(q, k_new, v_new, key_cache, value_cache, step: PagedStep, scale: float, row_block: int | None = None) -> torch.Tensor:
    """v1, the oracle: per request, the full (H, q, ctx) scores, masked, softmax, times V.

    ``row_block`` computes the same thing ``row_block`` query rows at a time (only the
    check uses it, so that long prompts fit in memory; the arithmetic of a row is the same).
    """
    num_heads = q.shape[0]
    outputs = []
    for r in range(step.num_requests):
        k = _gather(key_cache, step.slots(r))  # (KVH, ctx, D)
        v = _gather(value_cache, step.slots(r))
        groups = num_heads // k.shape[0]
        k, v = k.repeat_interleave(groups, dim=0), v.repeat_interleave(groups, dim=0)  # (H, ctx, D)
        start, q_len, ctx = step.query_start_loc[r], step.query_len(r), step.context_len(r)
        block = row_block or q_len
        for row in range(0, q_len, block):
            rows = min(block, q_len - row)
            scores = (q[:, start + row : start + row + rows] @ k.transpose(-1, -2)) * scale  # (H, rows, ctx)
            query_position = torch.arange(rows, device=q.device)[:, None] + (ctx - q_len + row)
            future = torch.arange(ctx, device=q.device)[None, :] > query_position  # key after the query
            probs = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
            outputs.append(probs @ v)  # (H, rows, D)
    return torch.cat(outputs, dim=1)


def paged_loop(q, k_new, v_new, key_cache, value_cache, step: PagedStep, scale: float) -> torch.Tensor:
    """v2: one SDPA call per request."""
    return _per_request(q, k_new, v_new, key_cache, value_cache, step, scale, fp32_decodes=False)


def paged_loop_fp32_decodes(q, k_new, v_new, key_cache, value_cache, step: PagedStep, scale: float) -> torch.Tensor:
    """v6: v2, but a 16-bit decode on a CPU is two small fp32 matmuls instead of SDPA."""
    fp32_decodes = q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16)
    return _per_request(q, k_new, v_new, key_cache, value_cache, step, scale, fp32_decodes)


def decode_fp32(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """One query row per head over all keys: q (H, 1, D), k and v (KVH, S, D) -> (H, 1, D).

    GQA without copies: the G query heads of one KV head become G rows of one matmul.
    Scores, softmax and P V in fp32 (as SDPA accumulates), the output in q's dtype.
    """
    num_kv_heads, groups = k.shape[0], q.shape[0] // k.shape[0]
    queries = q.reshape(num_kv_heads, groups, q.shape[-1]).float()  # head h = (h // G, h % G)
    probs = torch.softmax(torch.bmm(queries, k.float().transpose(1, 2)) * scale, dim=-1)  # (KVH, G, S)
    return torch.bmm(probs, v.float()).to(q.dtype).reshape(q.shape)


def _per_request(q, k_new, v_new, key_cache, value_cache, step: PagedStep, scale: float, fp32_decodes: bool) -> torch.Tensor:
    enable_gqa = q.shape[0] != k_new.shape[0]
    outputs = []
    for r, num_computed in enumerate(step.num_computed):
        start, end = step.query_start_loc[r], step.query_start_loc[r + 1]
        if num_computed == 0:  # nothing cached: the context is exactly the new tokens
            k, v = k_new[:, start:end], v_new[:, start:end]
        else:
            k, v = _context(key_cache, step, r), _context(value_cache, step, r)  # (KVH, ctx, D)
        q_len, kv_len = end - start, k.shape[1]
        if q_len == 1 and fp32_decodes:
            outputs.append(decode_fp32(q[:, start:end], k, v, scale))
            continue
        mask, is_causal = None, False
        if q_len > 1 and kv_len == q_len:
            is_causal = True
        elif q_len > 1:  # a chunk after cached context: causal, shifted by what was cached
            mask = _offset_mask(step, r, q.dtype, q.device)
        out = F.scaled_dot_product_attention(
            q[None, :, start:end], k[None], v[None], attn_mask=mask, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa
        )
        outputs.append(out[0])
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=1)


def _offset_mask(step: PagedStep, r: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Request r's chunk after its cached context: (q, kv), 0 where a query attends a key (its
    position or before), -inf elsewhere, in q's dtype (what SDPA makes of a bool mask); once per step."""
    def mask() -> torch.Tensor:
        q_len, kv_len = step.query_len(r), step.context_len(r)
        rows = torch.arange(q_len, device=device)[:, None] + (kv_len - q_len)
        attend = torch.arange(kv_len, device=device)[None, :] <= rows
        return torch.zeros(q_len, kv_len, dtype=dtype, device=device).masked_fill_(~attend, float("-inf"))

    return step.kept(("offset_mask", r, dtype, device), mask)


def packed_mask(step: PagedStep, device: torch.device) -> torch.Tensor:
    """(T, S) bool, True = attend: same request, and the key's position <= the query's."""
    query_request, query_position, key_request, key_position = step.packed_positions(device)
    return (query_request[:, None] == key_request[None, :]) & (key_position[None, :] <= query_position[:, None])


def packed_keys(k_new, v_new, key_cache, value_cache, step: PagedStep) -> tuple[torch.Tensor, torch.Tensor]:
    if step.num_requests == 1:
        return (k_new, v_new) if step.num_computed[0] == 0 else (_context(key_cache, step, 0), _context(value_cache, step, 0))
    slots = step.packed_slots()
    return _gather(key_cache, slots), _gather(value_cache, slots)  # (KVH, S, D)


def paged_packed(q, k_new, v_new, key_cache, value_cache, step: PagedStep, scale: float) -> torch.Tensor:
    """v3: one gather, one SDPA call, a block-diagonal causal mask."""
    k, v = packed_keys(k_new, v_new, key_cache, value_cache, step)
    fresh_prompt = step.num_requests == 1 and step.num_computed[0] == 0
    mask = None if fresh_prompt else packed_mask(step, q.device)  # one fresh prompt: the mask is plain causal
    out = F.scaled_dot_product_attention(
        q[None], k[None], v[None], attn_mask=mask, is_causal=fresh_prompt and q.shape[1] > 1, scale=scale,
        enable_gqa=q.shape[0] != k.shape[0],
    )
    return out[0]


# ------------------------------------------------------------------------------ registry
@dataclass(frozen=True)
class PagedKernel:
    """One version: its name, what it changes, the function, whether it can run on a device, and (``refuses``)
    why not in a dtype and head size there ('' when it can)."""

    name: str
    version: int
    changes: str
    forward: Callable[..., torch.Tensor]
    status: Callable[[str], tuple[bool, str]] = lambda device: (True, "plain torch")
    refuses: Callable[[torch.device, torch.dtype, int], str] = lambda device, dtype, head_dim: ""

    def __call__(self, q, k_new, v_new, key_cache, value_cache, step: PagedStep, scale: float) -> torch.Tensor:
        return self.forward(q, k_new, v_new, key_cache, value_cache, step, scale)

NAIVE = PagedKernel("v1 naive", 1, "the oracle: per request, gather, (H, q, ctx) scores, mask, softmax, times V", paged_naive)
LOOP = PagedKernel("v2 loop", 2, "one torch SDPA call per request (is_causal, offset mask, or none)", paged_loop)
PACKED = PagedKernel("v3 packed", 3, "all requests in one SDPA call with a block-diagonal causal mask", paged_packed)
LOOP_FP32_DECODES = PagedKernel(
    "v6 loop, fp32 decodes", 6,
    "v2, but a 16-bit decode on a CPU is two fp32 matmuls (torch's bf16 SDPA is slow for one query row there)",
    paged_loop_fp32_decodes,
)
