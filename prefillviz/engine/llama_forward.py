"""The engine's own forward of a Llama-shaped model (as vLLM's ``model_executor/models/llama.py``).

The stock ``transformers`` forward runs about 245 torch ops per decoder layer for one decode
step (module calls, dtype round trips, one linear per projection, ``rotate_half`` per tensor),
and on a small model those fixed costs weigh as much as the matmuls. Serving engines run their
own model code instead; this is ours, for the engine's steps only:

    per layer   h ─┬─ RMSNorm ─ [q|k|v] = x W_qkv ─ RoPE(q, k) ─ write K/V ─ paged attention ─ x W_o ─(+)─┐
                   └──────────────────────────────────────────────────────────────────────────────┘
                h ─┬─ RMSNorm ─ [gate|up] = x W_gate_up ─ silu(gate) * up ─ x W_down ─(+)─┐
                   └─────────────────────────────────────────────────────────────────────┘

- **Fused projections**: on a CPU that packs (``packed_weights``), q, k and v are one matmul
  over the three weights stacked and packed once for oneDNN, and so are gate and up (vLLM's
  ``QKVParallelLinear`` and ``MergedColumnParallelLinear``). The engine's brgemm linear
  (``csrc/linear_brgemm.h``) goes one step further: its gate|up call returns silu(gate) * up,
  computed on the fp32 sums, so [gate | up] is never written out. Elsewhere (a GPU, a CPU that
  can't pack, ``pack_linear_weights=False``) each projection runs on the module's own weight,
  so no weight is copied.
- **RoPE once over q and k together**, with the cos/sin of the step's positions computed once per
  step by the model's own rotary module (so every RoPE variant it knows applies as it is).
- **Measured dispatch** (``dispatch.py``): each step's bucket (decode, mixed, a prefill's size)
  names the attention and the linears this machine ran fastest there, among those that passed
  their oracle here: the engine's C++ kernels (v7, v8) or torch's SDPA for attention, oneDNN's
  matmul, the engine's brgemm linear, torch's packed linear or the stock ``F.linear`` for the linears.

The arithmetic of each op is the stock model's (RMSNorm in fp32 then cast, RoPE in the model's
dtype, SiLU): ``tests/model/test_llama_forward.py`` checks the logits against the plain HF
forward. The profiler's scopes hook the stock modules, so a step with a hook on any module
runs the stock forward instead (``ModelRunner.forward``); so does any model this
file does not know (``own_forward_status`` says why). A timing pass's per-layer clocks stay on
this forward: it times the same spans itself, and an inspection pass's observers see its
q/k/v and hidden states as the stock forward shows them (``LlamaForward``).
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from prefillviz.engine.attention import compiled_attention_status, step_attention
from prefillviz.engine.dispatch import StepChoice
from prefillviz.engine.forward_status import hooked, own_forward_status
from prefillviz.engine.llama_weights import LlamaWeights, llama_weights
from prefillviz.engine.ops.torch_ops import rms_norm, rope, silu_mul


def compiled_ops_for(weights: LlamaWeights, device: torch.device, dtype: torch.dtype):
    """The engine's C++ ops when they run this model here (a CPU, fp32 or bf16, a head size they take), else None."""
    return compiled_attention_status(device, dtype, weights.head_dim)[0]


class TorchOps:
    """The forward's ops in plain torch, on any device and dtype: each residual add on its own."""

    @staticmethod
    def rotary(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return cos[:, None], sin[:, None]  # (T, 1, D): broadcast over heads

    @staticmethod
    def add_rms_norm(residual: torch.Tensor | None, h: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """h += residual (when there is one), then RMSNorm(h)."""
        if residual is not None:
            h.add_(residual)
        return rms_norm(h, weight, eps)

    @staticmethod
    def rope_qkv(qkv: torch.Tensor, cos, sin, meta, index: int, heads: tuple[int, int, int]):
        """(q, k, v, the q|k|v rows for v7 (None), whether the K/V are already in the cache)."""
        H, KVH, D = heads
        qk = rope(qkv[:, : (H + KVH) * D].view(qkv.shape[0], H + KVH, D), cos, sin)
        return qk[:, :H], qk[:, H:], qkv[:, (H + KVH) * D :].view(qkv.shape[0], KVH, D), None, False

    silu_mul = staticmethod(silu_mul)

    @staticmethod
    def final_norm(residual: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, eps: float, keep: torch.Tensor) -> torch.Tensor:
        h.add_(residual)
        return rms_norm(h.index_select(0, keep), weight, eps)  # only the rows whose logits are kept


class CompiledOps:
    """The forward's ops in the engine's C++ (``prefillviz/engine/ops/engine_ops.py``): about ten calls
    a layer. Each residual add is fused with the norm after it (``add_rms_norm``), RoPE with the K/V writes."""

    def __init__(self, ops) -> None:
        self.ops = ops
        self.silu_mul = ops.silu_mul

    @staticmethod
    def rotary(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return cos.contiguous(), sin.contiguous()  # (T, D)

    def add_rms_norm(self, residual: torch.Tensor | None, h: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        # the norm over `residual` (a linear's output, dead after the add, still in L2), as vLLM's fused_add_rms_norm
        return self.ops.rms_norm(h, weight, eps) if residual is None else self.ops.add_rms_norm(residual, h, weight, eps, True)

    def rope_qkv(self, qkv: torch.Tensor, cos, sin, meta, index: int, heads: tuple[int, int, int]):
        """q and k rotated in place, k and v written to the cache in the same call."""
        H, KVH, D = heads
        cache = meta.kv_cache
        self.ops.rope_write_kv(qkv, cos, sin, meta.slot_mapping, cache.key_cache[index], cache.value_cache[index], H)
        rows = qkv.view(qkv.shape[0], H + 2 * KVH, D)
        return rows[:, :H], rows[:, H : H + KVH], rows[:, H + KVH :], qkv, True

    def final_norm(self, residual: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, eps: float, keep: torch.Tensor) -> torch.Tensor:
        return self.ops.add_rms_norm(residual, h, weight, eps, True).index_select(0, keep)


class _NoSpans:
    """Stands in for a ``SpanClock`` when nothing is timed: every span is a shared no-op."""

    @staticmethod
    def __call__(name: str) -> contextlib.nullcontext:
        return _NO_SPAN


_NO_SPAN = contextlib.nullcontext()


class _Spans:
    """Named spans on a ``timers.SpanClock``: the per-layer clocks of a timing pass."""

    def __init__(self, clock) -> None:
        self.clock = clock

    @contextlib.contextmanager
    def __call__(self, name: str):
        self.clock.start(name)
        try:
            yield
        finally:
            self.clock.stop(name)


class LlamaForward:
    """Runs one engine step (``ModelRunner.prepare``'s inputs) through the engine's own forward:
    one loop over the layers, its ops from a backend (``CompiledOps`` where the C++ ops run the
    model here, else ``TorchOps``), its attention the step's (``attention.step_attention``).

    With a ``SpanClock`` (a timing pass) it times the spans the module hooks of the stock forward
    would: ``embedding``, ``layers.i`` and, inside it, ``layers.i.input_layernorm`` (with the
    previous MLP's residual add), ``layers.i.attention`` (q|k|v, RoPE, the K/V writes, attention,
    o), ``layers.i.post_attention_layernorm`` (with the residual add before it), ``layers.i.mlp``;
    then ``final_norm`` and ``lm_head``.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.available, self.why_not = own_forward_status(model)
        self._modules = list(model.modules()) if self.available else []

    def usable(self) -> bool:
        """Whether this step can run here: a known model, and no instrument hooked onto its modules."""
        return self.available and not hooked(self._modules)

    def __call__(self, inputs: dict, choice: StepChoice, clock=None, hidden=None) -> torch.Tensor:
        """Logits (num_kept, V) at the rows ``inputs['logits_to_keep']`` names.

        Args:
            inputs: ``ModelRunner.prepare``'s; its metadata's ``observers`` see each layer's
                (layer index, attention module, q (1, H, T, D), k, v (1, KVH, T, D), metadata)
                after the K/V writes, as the stock forward's attention function shows them.
            choice: the step's attention and linears (``dispatch_tables.choose``).
            clock: a ``SpanClock`` to time the spans on (a timing or inspection pass).
            hidden: called with (i, h) for the residual stream h (T, hidden) after the
                embedding (i = 0) and after each layer (i = layer + 1).
        """
        span = _Spans(clock) if clock is not None else _NoSpans()
        weights = llama_weights(self.model, choice.linears)
        meta = inputs["prefillviz_metadata"]
        with span("embedding"):
            h = F.embedding(inputs["input_ids"][0], weights.embedding)  # (T, hidden)
        if hidden is not None:
            hidden(0, h)
        compiled = compiled_ops_for(weights, h.device, h.dtype)
        ops = CompiledOps(compiled) if compiled is not None else TorchOps
        cos, sin = weights.rotary(h[None], inputs["position_ids"])  # (1, T, D) in the model's dtype
        cos, sin = ops.rotary(cos[0], sin[0])
        heads = (weights.num_heads, weights.num_kv_heads, weights.head_dim)
        keep = inputs["logits_to_keep"]
        # past the last layer's K/V writes only the rows whose logits are kept are needed, its attention included:
        # the rest of the step's rows feed nothing (as llama.cpp's last layer), unless an instrument reads them
        prune_at = len(weights.layers) - 1 if hidden is None and keep.numel() < h.shape[0] else None
        mlp_out = None  # the previous layer's MLP output, not yet added to h
        for index, (norm_in, qkv_proj, o_proj, norm_post, gate_up_proj, down_proj, scale) in enumerate(weights.layers):
            with span(f"layers.{index}"):
                with span(f"layers.{index}.input_layernorm"):
                    x = ops.add_rms_norm(mlp_out, h, *norm_in)  # h += the previous MLP's output; x = norm(h)
                if hidden is not None and index > 0:
                    hidden(index, h)  # the previous layer's output, now that its MLP is added
                with span(f"layers.{index}.attention"):
                    q, k, v, rows, written = ops.rope_qkv(qkv_proj(x), cos, sin, meta, index, heads)
                    kept = keep if index == prune_at else None  # the last layer: attention at the kept rows only
                    out = step_attention(meta, index, weights.attention_modules[index], q, k, v, scale, rows, written, kept)  # (T or kept, H D)
                    if index == prune_at:
                        h = h.index_select(0, keep)  # (kept, ...) from here on
                        keep = torch.arange(keep.numel(), device=keep.device)
                    attended = o_proj(out)
                with span(f"layers.{index}.post_attention_layernorm"):
                    x = ops.add_rms_norm(attended, h, *norm_post)  # h += attention; x = norm(h)
                with span(f"layers.{index}.mlp"):
                    gate_up = gate_up_proj(x)  # [gate | up], or silu(gate) * up where the pack fuses it
                    mlp_out = down_proj(gate_up if gate_up_proj.activates else ops.silu_mul(gate_up))
        with span("final_norm"):
            x = ops.final_norm(mlp_out, h, *weights.final_norm, keep)
        if hidden is not None:
            hidden(len(weights.layers), h)
        with span("lm_head"):
            return weights.lm_head(x)
