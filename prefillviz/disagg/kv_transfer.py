"""One request's KV cache, out of the prefill worker's blocks, over ``torch.distributed``, and
into the decode worker's blocks.

The sender gathers the K and V of every layer at the prompt's positions through its own block
table; the receiver allocates blocks of its own and scatters the same tensor through *its*
table, so the physical block ids differ and only the logical order survives:

    prefill worker  block_table [4, 9]        decode worker  block_table [0, 1]
    slots           4*16+0 .. 9*16+3   -->   slots          0*16+0 .. 1*16+3     (T = 20 tokens)

    payload (2, L, T, KVH, D): [K, V] x layers x the prompt's T tokens x kv heads x head dim
    bytes = 2 * L * KVH * D * dtype bytes * T = kv_bytes_per_token * T    (no padding of the last block)

Each request is two point-to-point messages: a small float64 header (which request, its
length, its first token and the sender's clock) and the payload. Every ``wait`` has a timeout,
so a dead or stalled peer becomes an error, never a hang.
"""

from __future__ import annotations

import datetime
import re
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from prefillviz.engine.kv_cache import PagedKVCache

HEADER_TAG, PAYLOAD_TAG = 1, 2
HEADER_FIELDS = ("request_index", "num_tokens", "first_token_id", "arrival_time", "first_token_time", "send_start_time")


class TransferTimeout(RuntimeError):
    """A send or receive did not complete within its timeout (a stalled or dead peer)."""


@dataclass
class KVHeader:
    request_index: int  # the request's place in the workload's request list
    num_tokens: int  # prompt tokens whose K/V follow
    first_token_id: int  # sampled by the prefill worker
    arrival_time: float  # host perf_counter seconds (one clock for both processes on one machine)
    first_token_time: float
    send_start_time: float

    def tensor(self) -> torch.Tensor:
        return torch.tensor([float(getattr(self, name)) for name in HEADER_FIELDS], dtype=torch.float64)

    @classmethod
    def from_tensor(cls, values: torch.Tensor) -> KVHeader:
        row = values.tolist()
        return cls(int(row[0]), int(row[1]), int(row[2]), row[3], row[4], row[5])


@dataclass
class TransferRecord:
    """One request's KV transfer, as each side saw it (host seconds, perf_counter)."""

    request_id: str
    num_tokens: int
    num_bytes: int
    send_start_time: float  # the prefill worker starts sending the header
    send_end_time: float | None = None  # its sends completed (prefill worker)
    recv_end_time: float | None = None  # the payload is in the decode worker's memory
    written_time: float | None = None  # ... and written into its blocks
    sent_sha256: str = ""  # of the payload bytes each side held, computed after the run (off the clock)
    received_sha256: str = ""

    @property
    def bit_identical(self) -> bool:
        return bool(self.sent_sha256) and self.sent_sha256 == self.received_sha256

    @property
    def transfer_s(self) -> float | None:
        """Header sent to payload received: what the request waited for its KV to move."""
        return None if self.recv_end_time is None else self.recv_end_time - self.send_start_time


def prompt_slots(block_table: list[int], num_tokens: int, block_size: int, device: torch.device) -> torch.Tensor:
    positions = torch.arange(num_tokens)
    table = torch.tensor(block_table, dtype=torch.long)
    return (table[positions // block_size] * block_size + positions % block_size).to(device)


def gather_request_kv(kv_cache: PagedKVCache, block_table: list[int], num_tokens: int) -> torch.Tensor:
    """The K/V of positions 0..num_tokens-1 of a request, every layer: (2, L, T, KVH, D)."""
    slots = prompt_slots(block_table, num_tokens, kv_cache.block_size, kv_cache.key_cache[0].device)
    keys = [k.view(-1, *k.shape[2:]).index_select(0, slots) for k in kv_cache.key_cache]  # L x (T, KVH, D)
    values = [v.view(-1, *v.shape[2:]).index_select(0, slots) for v in kv_cache.value_cache]
    return torch.stack([torch.stack(keys), torch.stack(values)])


def write_request_kv(kv_cache: PagedKVCache, block_table: list[int], payload: torch.Tensor) -> None:
    """Scatter a received (2, L, T, KVH, D) payload into this cache through ``block_table``."""
    num_tokens = payload.shape[2]
    slots = prompt_slots(block_table, num_tokens, kv_cache.block_size, kv_cache.key_cache[0].device)
    payload = payload.to(kv_cache.key_cache[0].device)
    for layer in range(kv_cache.num_layers):
        kv_cache.write(layer, slots, payload[0, layer], payload[1, layer])


def payload_shape(kv_cache: PagedKVCache, num_tokens: int) -> tuple[int, ...]:
    return (2, kv_cache.num_layers, num_tokens, *kv_cache.key_cache[0].shape[2:])


def _wait(work, timeout_s: float, what: str) -> None:
    try:
        work.wait(datetime.timedelta(seconds=timeout_s))
    except RuntimeError as error:  # gloo: "Timed out waiting ...", or the peer's connection closed
        # gloo's own words, without its source path
        reason = re.sub(r"\[[^\]]*\]\s*", "", str(error)).split(". ")[0].strip()
        if "timed out" in reason.lower():
            raise TransferTimeout(
                f"{what} did not complete within {timeout_s:g} s: the other worker stalled."
            ) from error
        raise TransferTimeout(f"{what} failed: {reason} (the other worker is gone).") from error


def send_request_kv(
    header: KVHeader, payload: torch.Tensor, peer: int, wire_device: torch.device, timeout_s: float, before_payload=None
) -> float:
    """Send a header and its payload to ``peer``; returns when both sends completed (perf_counter).

    Args:
        wire_device: where the tensors go over the wire from (the GPU for NCCL, the CPU for gloo).
        before_payload: called between the two messages (the fault tests kill the worker there).
    """
    header_work = dist.isend(header.tensor().to(wire_device), peer, tag=HEADER_TAG)
    if before_payload is not None:
        before_payload()
    payload_work = dist.isend(payload.contiguous().to(wire_device), peer, tag=PAYLOAD_TAG)
    _wait(header_work, timeout_s, f"Sending the header of request {header.request_index}")
    _wait(
        payload_work, timeout_s,
        f"Sending {payload.nelement() * payload.element_size():,} bytes of KV for request {header.request_index}",
    )
    return time.perf_counter()


def receive_header(peer: int, wire_device: torch.device, timeout_s: float) -> KVHeader:
    values = torch.empty(len(HEADER_FIELDS), dtype=torch.float64, device=wire_device)
    _wait(dist.irecv(values, peer, tag=HEADER_TAG), timeout_s, "Waiting for the next prefilled request")
    return KVHeader.from_tensor(values.cpu())


def receive_payload(
    shape: tuple[int, ...], dtype: torch.dtype, peer: int, wire_device: torch.device, timeout_s: float
) -> torch.Tensor:
    payload = torch.empty(shape, dtype=dtype, device=wire_device)
    _wait(
        dist.irecv(payload, peer, tag=PAYLOAD_TAG), timeout_s,
        f"Receiving a KV payload of {payload.nelement() * payload.element_size():,} bytes",
    )
    return payload


def payload_bytes(payload: torch.Tensor):
    """The payload's raw bytes as a numpy uint8 array (any dtype, bf16 too)."""
    return payload.detach().cpu().contiguous().flatten().view(torch.uint8).numpy()


def payload_digest(payload: torch.Tensor) -> str:
    """sha256 of the payload's raw bytes: equal digests on both sides = bit-identical K/V."""
    import hashlib

    return hashlib.sha256(payload_bytes(payload).tobytes()).hexdigest()
