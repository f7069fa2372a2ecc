"""The measured backend: the engine's ``Backend`` protocol with the fastest kernels this machine ran.

For each step, the step's bucket (decode, mixed, a prefill's size: ``dispatch_buckets.bucket_of``) names the
attention and the linears this machine ran fastest there, among those that passed their oracle
here (``dispatch_tables.table_for``: measured once per machine, model shape, dtype and thread
count, and cached). The other ops are the engine's C++ ops where they are built and pass their
check here (``ops/engine_ops.py``): each residual add fused with the norm after it, RoPE with the
K/V writes, SiLU with gate|up's linear where the pack computes it. Elsewhere they are the
textbook's plain torch ops.

    step  ->  bucket  ->  the table's choice  ->  linears (packed once) + attention + C++ ops
"""

from __future__ import annotations

from functools import cached_property

import torch

from prefillviz.backends import dispatch, dispatch_tables
from prefillviz.backends.attention import compiled_attention_status, step_attention
from prefillviz.backends.dispatch import STOCK, StepChoice
from prefillviz.backends.kv_spares import kept_kv_cache
from prefillviz.backends.llama_weights import llama_weights
from prefillviz.engine.backend import TorchStepOps, norm_eps, silu_mul


class MeasuredStepOps(TorchStepOps):
    """One step with the measured choice: its linears' packs, its attention, and the C++ ops where they run."""

    def __init__(self, model: torch.nn.Module, choice: StepChoice, compiled) -> None:
        super().__init__(model)
        self.model, self.choice, self.compiled = model, choice, compiled
        self.ran = {"backend": "measured", "bucket": choice.bucket, "attention": choice.attention,
                    "linears": choice.linears}
        self.rows = None  # the layer's q|k|v rows, which v7 and v8 read q from as they lie

    @cached_property
    def weights(self):
        """The model's linears as the step's choice packs them, found on first use (a stock forward, for a model
        the engine does not know, never asks)."""
        return llama_weights(self.model, self.choice.linears)

    def qkv_proj(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        return self.weights.layers[layer].qkv(x)

    def o_proj(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        return self.weights.layers[layer].o(x)

    def gate_up_silu(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.weights.layers[layer].gate_up
        out = gate_up(x)  # [gate | up], or silu(gate) * up where the pack fuses it
        if gate_up.activates:
            return out
        return self.compiled.silu_mul(out) if self.compiled is not None else silu_mul(out)

    def down_proj(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        return self.weights.layers[layer].down(x)

    def lm_head(self, x: torch.Tensor) -> torch.Tensor:
        return self.weights.lm_head(x)

    def add_rms_norm(self, residual: torch.Tensor | None, h: torch.Tensor, norm: torch.nn.Module) -> torch.Tensor:
        if self.compiled is None:
            return super().add_rms_norm(residual, h, norm)
        if residual is None:
            return self.compiled.rms_norm(h, norm.weight, norm_eps(norm))
        # the norm written over `residual` (a linear's output, dead after the add, still in L2),
        # as vLLM's fused_add_rms_norm
        return self.compiled.add_rms_norm(residual, h, norm.weight, norm_eps(norm), True)

    def rope_write_kv(self, layer: int, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, meta) -> tuple:
        if self.compiled is None:
            return super().rope_write_kv(layer, qkv, cos, sin, meta)
        H, KVH = self.num_heads, self.num_kv_heads
        cache = meta.kv_cache  # q and k rotated in place, k and v written to the cache in the same call
        self.compiled.rope_write_kv(qkv, cos.contiguous(), sin.contiguous(), meta.slot_mapping, cache.key_cache[layer],
                                    cache.value_cache[layer], H)
        self.rows = qkv
        rows = qkv.view(qkv.shape[0], H + 2 * KVH, -1)
        return rows[:, :H], rows[:, H : H + KVH], rows[:, H + KVH :]

    def attention(self, layer: int, q, k, v, scale: float, meta, keep: torch.Tensor | None = None) -> torch.Tensor:
        rows, self.rows = self.rows, None
        return step_attention(self.choice.attention, layer, q, k, v, scale, meta, rows, keep)


class MeasuredBackend:
    """The engine's ops as this machine ran them fastest (see the module's docstring).

    Args:
        pack_linear_weights: False runs the model's own linears (``F.linear``) in every bucket.
    """

    name = "measured"

    def __init__(self, pack_linear_weights: bool = True) -> None:
        self.pack_linear_weights = pack_linear_weights

    def prepare(self, model: torch.nn.Module) -> None:
        # measured now (once per machine, model shape and dtype), not inside a timed step; a first start's part will do
        dispatch_tables.table_for(model, part_will_do=True)

    def for_step(self, model: torch.nn.Module, meta) -> MeasuredStepOps:
        choice = dispatch.step_choice(dispatch_tables.table_for(model, part_will_do=True), meta.step,
                                      self.pack_linear_weights)
        keys = meta.kv_cache.key_cache[0]  # (blocks, block size, KVH, D): the model's device, dtype and head size
        compiled = compiled_attention_status(keys.device, keys.dtype, keys.shape[-1])[0]
        return MeasuredStepOps(model, choice, compiled)

    new_kv_cache = staticmethod(kept_kv_cache)

    @staticmethod
    def stock_forward(model: torch.nn.Module, inputs: dict, ops, observer=None) -> torch.Tensor:
        """A model the engine's own forward does not know: transformers' forward, the step's attention inside.
        Imported on first use: it registers the attention with transformers, whose modeling code loads slowly."""
        from prefillviz.backends.stock_forward import stock_forward

        return stock_forward(model, inputs, ops, observer)


MEASURED = MeasuredBackend()
"""The measured backend the product runs by default (``loading.models`` registers it for every model it loads)."""
STOCK_LINEARS = MeasuredBackend(pack_linear_weights=False)
"""The measured backend with the model's own linears: what the profiler's FLOP counts read (``aten::mm``)."""
__all__ = ["MEASURED", "STOCK", "STOCK_LINEARS", "MeasuredBackend", "MeasuredStepOps"]
