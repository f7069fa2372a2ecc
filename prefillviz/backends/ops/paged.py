"""The paged attention versions the measured backend chooses from, beside the engine's two.

Every version takes (q, k_new, v_new, key_cache, value_cache, step, scale) and returns (H, T, D)
(``prefillviz/engine/paged_attention.py`` draws the signature). The engine holds v1 naive (the
oracle) and v2, its SDPA version (``paged_sdpa``); here are v3 packed and v6 loop with fp32
decodes, in plain torch, and the registry of versions by name. v7 and v8, the C++ kernels, are in
``engine_ops.py``. ``prefillviz/kernels/paged_attention.py`` says what each version changes and
times them side by side on the Kernel timings page.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from prefillviz.engine.paged_attention import PagedStep, context, gather, paged_naive, paged_sdpa


def packed_positions(step: PagedStep,
                     device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(query request, query position, key request, key position): (T,), (T,), (S,), (S,).

    S = the sum of the context lengths: the keys of every request, one after another,
    in the order ``step.packed_slots`` gathers them.
    """
    query_lens = torch.tensor([step.query_len(r) for r in range(step.num_requests)])
    context_lens = torch.tensor([step.context_len(r) for r in range(step.num_requests)])
    requests = torch.arange(step.num_requests)
    query_request = requests.repeat_interleave(query_lens)
    key_request = requests.repeat_interleave(context_lens)
    key_position = (torch.arange(int(context_lens.sum()))
                    - (context_lens.cumsum(0) - context_lens).repeat_interleave(context_lens))
    query_position = (torch.arange(len(query_request))
                      - (query_lens.cumsum(0) - query_lens).repeat_interleave(query_lens))
    query_position += torch.tensor(step.num_computed).repeat_interleave(query_lens)
    return tuple(t.to(device) for t in (query_request, query_position, key_request, key_position))


# ------------------------------------------------------------------------------ versions
def paged_loop_fp32_decodes(q, k_new, v_new, key_cache, value_cache, step: PagedStep, scale: float) -> torch.Tensor:
    """v6: v2, but a 16-bit decode on a CPU is two small fp32 matmuls instead of SDPA."""
    if (q.device.type != "cpu" or q.dtype not in (torch.bfloat16, torch.float16)
            or all(step.query_len(r) > 1 for r in range(step.num_requests))):
        return paged_sdpa(q, k_new, v_new, key_cache, value_cache, step, scale)
    outputs = []
    for r in range(step.num_requests):
        start, end = step.query_start_loc[r], step.query_start_loc[r + 1]
        if end - start == 1:
            k, v = ((k_new[:, start:end], v_new[:, start:end]) if step.num_computed[r] == 0
                    else (context(key_cache, step, r), context(value_cache, step, r)))
            outputs.append(decode_fp32(q[:, start:end], k, v, scale))
        else:
            one = step.kept(("one request", r), lambda: PagedStep([0, end - start], [step.num_computed[r]],
                                                                  step.slot_mapping[start:end],
                                                                  [step.context_slots[r]]))
            outputs.append(paged_sdpa(q[:, start:end], k_new[:, start:end], v_new[:, start:end], key_cache, value_cache,
                                      one, scale))
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=1)


def decode_fp32(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """One query row per head over all keys: q (H, 1, D), k and v (KVH, S, D) -> (H, 1, D).

    GQA without copies: the G query heads of one KV head become G rows of one matmul.
    Scores, softmax and P V in fp32 (as SDPA accumulates), the output in q's dtype.
    """
    num_kv_heads, groups = k.shape[0], q.shape[0] // k.shape[0]
    queries = q.reshape(num_kv_heads, groups, q.shape[-1]).float()  # head h = (h // G, h % G)
    probs = torch.softmax(torch.bmm(queries, k.float().transpose(1, 2)) * scale, dim=-1)  # (KVH, G, S)
    return torch.bmm(probs, v.float()).to(q.dtype).reshape(q.shape)


def packed_mask(step: PagedStep, device: torch.device) -> torch.Tensor:
    """(T, S) bool, True = attend: same request, and the key's position <= the query's."""
    query_request, query_position, key_request, key_position = packed_positions(step, device)
    return (query_request[:, None] == key_request[None, :]) & (key_position[None, :] <= query_position[:, None])


def packed_keys(k_new, v_new, key_cache, value_cache, step: PagedStep) -> tuple[torch.Tensor, torch.Tensor]:
    if step.num_requests == 1:
        return ((k_new, v_new) if step.num_computed[0] == 0
                else (context(key_cache, step, 0), context(value_cache, step, 0)))
    slots = step.packed_slots()
    return gather(key_cache, slots), gather(value_cache, slots)  # (KVH, S, D)


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

NAIVE = PagedKernel("v1 naive", 1, "the oracle: per request, gather, (H, q, ctx) scores, mask, softmax, times V",
                    paged_naive)
LOOP = PagedKernel("v2 loop", 2, "one torch SDPA call per request (is_causal, offset mask, or none): the engine's own",
                   paged_sdpa)
PACKED = PagedKernel("v3 packed", 3, "all requests in one SDPA call with a block-diagonal causal mask", paged_packed)
LOOP_FP32_DECODES = PagedKernel(
    "v6 loop, fp32 decodes", 6,
    "v2, but a 16-bit decode on a CPU is two fp32 matmuls (torch's bf16 SDPA is slow for one query row there)",
    paged_loop_fp32_decodes,
)
paged_loop = paged_sdpa  # v2: the engine's own version, by its name in the family
