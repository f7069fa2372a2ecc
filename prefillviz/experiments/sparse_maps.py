"""Which tiles block-sparse prefill keeps, over the attention the model really computes.

One dense prefill of the first N tokens of the bundled book, watched by an observer that keeps one
layer's post-RoPE q and k. From them, per head:

    the real map     each tile's share of its query block's attention: softmax(q k^T) summed over the
                     tile's keys, averaged over its queries (computed 256 query rows at a time)
    the selection    ``sparse_attention``'s own scoring and selection at the keep fraction
    mass kept        how much of the real attention the kept tiles hold (1.0: nothing lost)
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np
import torch

from prefillviz.engine.request import SamplingParams
from prefillviz.engine.sparse_attention import SPARSE_BLOCK_SIZE, antidiagonal_block_scores, select_blocks
from prefillviz.experiments.long_text import long_prompt_ids
from prefillviz.experiments.model_setup import model_tokenizer_and_id
from prefillviz.experiments.one_request import one_request_engine
from prefillviz.experiments.op_timing import TimedBackend
from prefillviz.experiments.sparse_work import BlockSelection


class OneLayerQK:
    """A run observer that keeps one layer's q (H, N, D) and k (KVH, N, D) of a prefill (``engine/observer.py``)."""

    sees_tensors = True

    def __init__(self, layer: int) -> None:
        self.layer, self.q, self.k = layer, None, None

    def installed(self):
        return contextlib.nullcontext()

    def span(self, name: str):
        return contextlib.nullcontext()

    def attention(self, layer: int, module, q, k, v, meta) -> None:
        if layer == self.layer and self.q is None:
            self.q, self.k = q.transpose(0, 1).float().clone(), k.transpose(0, 1).float().clone()

    def hidden(self, index: int, h) -> None:
        pass

    def end_step(self, record) -> None:
        pass

    def attach(self, trace) -> None:
        pass


@dataclass
class BlockMaps:
    """One layer's real tile attention and the tiles block-sparse prefill keeps there."""

    num_tokens: int
    layer: int
    keep_fraction: float
    block_size: int
    real: np.ndarray  # (H, nb, nb): each tile's share of its query block's attention (rows sum to 1)
    kept: np.ndarray  # (H, nb, nb) bool
    selection: BlockSelection

    def mass_kept_per_head(self) -> list[float]:
        """Per head: the real attention the kept tiles hold, averaged over query blocks."""
        return (self.real * self.kept).sum(-1).mean(-1).tolist()


def real_block_attention(q: torch.Tensor, k: torch.Tensor, scale: float, block_size: int,
                         rows_at_once: int = 256) -> torch.Tensor:
    """(H, nb, nb): softmax(q k^T) (causal) summed over each tile's keys, averaged over its queries."""
    heads, n, _ = q.shape
    k = k.repeat_interleave(heads // k.shape[0], dim=0)
    nb = -(-n // block_size)
    key_block = torch.arange(n) // block_size
    totals = torch.zeros(heads, n, nb)
    for start in range(0, n, rows_at_once):
        rows = torch.arange(start, min(start + rows_at_once, n))
        scores = (q[:, rows] @ k.transpose(-1, -2)) * scale  # (H, rows, N)
        probs = torch.softmax(scores.masked_fill(torch.arange(n)[None, :] > rows[:, None], float("-inf")), dim=-1)
        totals[:, rows] = torch.zeros(heads, len(rows), nb).index_add_(2, key_block, probs)
    counts = torch.bincount(key_block, minlength=nb).float()
    return torch.zeros(heads, nb, nb).index_add_(1, key_block, totals) / counts[None, :, None]


def block_maps(loaded_or_pair, num_tokens: int, layer: int, keep_fraction: float,
               block_size: int = SPARSE_BLOCK_SIZE) -> BlockMaps:
    """Prefill the book's first ``num_tokens`` tokens densely, keep ``layer``'s q and k, and compare."""
    model, tokenizer, _ = model_tokenizer_and_id(loaded_or_pair)
    num_layers = model.config.num_hidden_layers
    if not 0 <= layer < num_layers:
        raise ValueError(f"layer must be in 0..{num_layers - 1}, got {layer}.")
    token_ids = long_prompt_ids(tokenizer, num_tokens)
    engine = one_request_engine(model, None, num_tokens, num_tokens + 1, backend=TimedBackend())
    engine.add_request(token_ids, SamplingParams(max_new_tokens=1))
    observer = OneLayerQK(layer)
    engine.run(observer=observer)
    attention = model.model.layers[layer].self_attn
    head_dim = observer.q.shape[-1]
    scale = getattr(attention, "scaling", head_dim**-0.5)
    scores = antidiagonal_block_scores(observer.q, observer.k, scale, block_size)
    selection = BlockSelection(select_blocks(scores, keep_fraction), scores, num_tokens, block_size)
    real = real_block_attention(observer.q, observer.k, scale, block_size)
    return BlockMaps(num_tokens, layer, keep_fraction, block_size, real.numpy(), selection.kept.numpy(), selection)
