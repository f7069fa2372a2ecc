"""The inspect capture's buffers (``capture.py``): a request's q/k/v of every layer, and a step's per-token norms.

Made once and filled in place, not kept as a small tensor per layer and step: kept between the
forward's freed activations, those kept glibc's heap from reusing them (``StepNorms`` says what it cost).
"""

from __future__ import annotations

import numpy as np
import torch


class StepNorms:
    """One step's per-token norms (K and V per KV head and layer, the residual stream after the embedding
    and each layer), written into buffers made at the step's first call, before its layers' activations.

    Small tensors kept per layer, between the forward's freed activations, kept glibc's heap from
    reusing them: in a 4,096-token fp32 inspect pass its free memory grew ~16 MB a layer, and the peak
    RSS was 2.85-3.06 GB with the norms and the q/k/v copies kept per layer, 2.85-2.99 with the q/k/v
    in ``Rows``, 2.50-2.52 with the norms here too (the pass without capture: 2.11)."""

    def __init__(self, num_layers: int, num_kv_heads: int, tokens: int) -> None:
        self.keys = torch.zeros(num_layers, num_kv_heads, tokens)  # in call order: layers[i]'s (KVH, T)
        self.values = torch.zeros(num_layers, num_kv_heads, tokens)
        self.layers: list[int] = []
        self.hidden = torch.zeros(num_layers + 1, tokens)
        self.hidden_seen: set[int] = set()

    def keep_kv(self, layer: int, key_norms: torch.Tensor, value_norms: torch.Tensor) -> None:
        if len(self.layers) == self.keys.shape[0]:  # more calls than layers: room for as many again
            self.keys, self.values = (torch.cat([t, torch.zeros_like(t)]) for t in (self.keys, self.values))
        self.keys[len(self.layers)] = key_norms
        self.values[len(self.layers)] = value_norms
        self.layers.append(layer)

    def keep_hidden(self, index: int, norms: torch.Tensor) -> None:
        self.hidden[index] = norms
        self.hidden_seen.add(index)

    def kv_array(self, buffer: torch.Tensor) -> np.ndarray:
        """(calls, T, KVH), as the step's calls wrote it"""
        return np.ascontiguousarray(buffer[: len(self.layers)].transpose(1, 2).numpy())

    def hidden_array(self) -> np.ndarray:
        """(indices seen, T), in index order"""
        return self.hidden[sorted(self.hidden_seen)].numpy()


class Rows:
    """One request's captured q, k or v: every layer's (heads, tokens, D) in one buffer (layers, heads,
    capacity, D), filled in step order; a chunk's rows are copied in as each layer's observer sees them.

    One buffer, not a copy per layer and step: at 4,096 tokens in fp32 the copies (9.4 + 2 x 3.1 MB a
    layer, below glibc's mmap threshold: from the heap) sat between the forward's freed activations,
    as the norms did (``StepNorms`` says what that cost). A buffer this large (283 MB of q) is mapped
    on its own, outside the heap; a short prompt's is one block of it.
    """

    def __init__(self, num_layers: int, capacity: int) -> None:
        """``capacity``: the tokens the buffer is first made for (0: as many as the first chunk)."""
        self.num_layers, self.capacity = num_layers, capacity
        self.buffer: torch.Tensor | None = None
        self.filled: dict[int, int] = {}  # layer -> tokens kept

    def keep(self, layer: int, rows: torch.Tensor) -> None:
        """Append ``rows`` (heads, q, D) to ``layer``'s tokens (the buffer grows, doubling, when a run feeds
        more than its capacity: a recompute after preemption, say)."""
        start = self.filled.get(layer, 0)
        end = start + rows.shape[1]
        if self.buffer is None or end > self.buffer.shape[2]:
            grown = torch.empty(
                (self.num_layers, rows.shape[0], max(self.capacity, end, 2 * start), rows.shape[2]), dtype=rows.dtype
            )
            if self.buffer is not None:
                grown[:, :, : self.buffer.shape[2]] = self.buffer
            self.buffer = grown
        self.buffer[layer, :, start:end] = rows
        self.filled[layer] = end

    def arrays(self, layers: list[int]) -> list[np.ndarray]:
        """Each layer's (heads, tokens, D), contiguous: views of the buffer where it is full, else copies."""
        return [np.ascontiguousarray(_to_numpy(self.buffer[layer, :, : self.filled[layer]])) for layer in layers]


def _to_numpy(tensor: torch.Tensor) -> np.ndarray:
    if tensor.dtype == torch.bfloat16:  # numpy has no bfloat16: keep it exact in fp32
        tensor = tensor.float()
    return tensor.numpy()
