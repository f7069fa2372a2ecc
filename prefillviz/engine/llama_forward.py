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
  ``QKVParallelLinear`` and ``MergedColumnParallelLinear``). Elsewhere (a GPU, a CPU that
  can't pack, ``pack_linear_weights=False``) each projection runs on the module's own weight,
  so no weight is copied.
- **RoPE once over q and k together**, with the cos/sin of the step's positions computed once per
  step by the model's own rotary module (so every RoPE variant it knows applies as it is).
- **Measured dispatch** (``dispatch.py``): each step's bucket (decode, mixed, a prefill's size)
  names the attention and the linears this machine ran fastest there, among those that passed
  their oracle here: the engine's C++ kernel (v7) or torch's SDPA for attention, oneDNN's matmul,
  torch's packed linear or the stock ``F.linear`` for the linears.

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
import os

import torch
import torch.nn.functional as F

from prefillviz.engine.attention import attend, compiled_attention_status
from prefillviz.engine.dispatch import V7, StepChoice
from prefillviz.engine.llama_weights import LlamaWeights, llama_weights
from prefillviz.engine.ops.engine_ops import engine_ops_status
from prefillviz.engine.ops.torch_ops import rms_norm, rope, silu_mul

STOCK_FORWARD_ENV = "PREFILLVIZ_STOCK_FORWARD"
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")

def own_forward_status(model: torch.nn.Module) -> tuple[bool, str]:
    """(whether the engine runs its own forward of this model, why not when it doesn't)."""
    if os.environ.get(STOCK_FORWARD_ENV, "").strip() not in ("", "0"):
        return False, f"{STOCK_FORWARD_ENV} is set: the stock transformers forward runs"
    config = model.config
    model_type = getattr(config, "model_type", "")
    if model_type not in SUPPORTED_MODEL_TYPES:
        return False, f"no engine forward for {model_type or type(model).__name__} models; the stock transformers forward runs"
    if getattr(config, "hidden_act", "silu") != "silu":
        return False, f"activation {config.hidden_act!r}: the stock transformers forward runs"
    if getattr(config, "use_sliding_window", False) or (model_type == "mistral" and getattr(config, "sliding_window", None)):
        return False, "sliding-window attention: the stock transformers forward runs"
    decoder = getattr(model, "model", None)
    if decoder is None or not hasattr(decoder, "layers") or not hasattr(decoder, "rotary_emb"):
        return False, "the model's modules are not laid out as transformers' Llama: the stock forward runs"
    layer = decoder.layers[0]
    if getattr(layer.mlp.gate_proj, "bias", None) is not None or getattr(layer.self_attn.o_proj, "bias", None) is not None:
        return False, "biased MLP or output projections: the stock transformers forward runs"
    return True, ""


def _hooked(modules: list[torch.nn.Module]) -> bool:
    """Whether an instrument hooked any module. transformers' own hooks don't count: once a call
    asked for ``output_attentions`` it leaves output-capturing hooks on the layers for good, which
    record nothing unless a call asks again (and the engine never does)."""
    from torch.nn.modules import module as module_globals

    def ours(hooks) -> bool:
        return any(not getattr(hook, "__module__", "").startswith("transformers.") for hook in hooks.values())

    if ours(module_globals._global_forward_hooks) or ours(module_globals._global_forward_pre_hooks):
        return True
    return any(ours(m._forward_hooks) or ours(m._forward_pre_hooks) for m in modules if m._forward_hooks or m._forward_pre_hooks)


def compiled_ops_for(weights: LlamaWeights, device: torch.device, dtype: torch.dtype):
    """The engine's C++ ops when they run this model here (a CPU, fp32 or bf16, a head size they take), else None."""
    return compiled_attention_status(device, dtype, weights.head_dim)[0]


def _observe(meta, index: int, module: torch.nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Show the instruments' attention observers a layer's q, k, v (T, heads, D) as the stock forward does: (1, heads, T, D)."""
    for observer in meta.observers:
        observer(index, module, q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], meta)


class _NoSpans:
    """Stands in for a ``SpanClock`` when nothing is timed: every span is a shared no-op."""

    @staticmethod
    def __call__(name: str) -> contextlib.nullcontext:
        return _NO_SPAN


_NO_SPAN = contextlib.nullcontext()


class _Spans:
    """Named spans on an ``instrument.timers.SpanClock``: the per-layer clocks of a timing pass."""

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
    """Runs one engine step (``ModelRunner.prepare``'s inputs) through the engine's own forward.

    With a ``SpanClock`` (a timing pass) it times the spans the module hooks of the stock forward
    would: ``embedding``, ``layers.i`` and, inside it, ``layers.i.input_layernorm``,
    ``layers.i.attention`` (q|k|v, RoPE, the K/V writes, attention, o), ``layers.i.post_attention_layernorm``
    (with the residual add before it), ``layers.i.mlp``; then ``final_norm`` and ``lm_head``.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.available, self.why_not = own_forward_status(model)
        self._modules = list(model.modules()) if self.available else []

    def usable(self) -> bool:
        """Whether this step can run here: a known model, and no instrument hooked onto its modules."""
        return self.available and not _hooked(self._modules)

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
        with span("embedding"):
            h = F.embedding(inputs["input_ids"][0], weights.embedding)  # (T, hidden)
        if hidden is not None:
            hidden(0, h)
        cos, sin = weights.rotary(h[None], inputs["position_ids"])  # (1, T, D) in the model's dtype
        ops = compiled_ops_for(weights, h.device, h.dtype)
        if ops is not None:
            h = self._compiled(ops, weights, h, cos[0].contiguous(), sin[0].contiguous(), inputs, choice.attention, span, hidden)
        else:
            h = self._torch(weights, h, cos[0, :, None], sin[0, :, None], inputs, choice.attention, span, hidden)
        with span("lm_head"):
            return weights.lm_head(h)

    def _torch(self, weights: LlamaWeights, h, cos, sin, inputs: dict, attention: str, span, hidden) -> torch.Tensor:
        """Plain torch ops, on any device and dtype; cos and sin (T, 1, D) broadcast over heads."""
        meta = inputs["prefillviz_metadata"]
        num_tokens = h.shape[0]
        H, KVH, D = weights.num_heads, weights.num_kv_heads, weights.head_dim
        cache, step = meta.kv_cache, meta.paged_step
        for index, (norm_in, qkv_proj, o_proj, norm_post, gate_up_proj, down_proj, scale) in enumerate(weights.layers):
            with span(f"layers.{index}"):
                with span(f"layers.{index}.input_layernorm"):
                    x = rms_norm(h, *norm_in)
                with span(f"layers.{index}.attention"):
                    qkv = qkv_proj(x)  # (T, (H + 2 KVH) D)
                    qk = rope(qkv[:, : (H + KVH) * D].view(num_tokens, H + KVH, D), cos, sin)
                    q, k = qk[:, :H], qk[:, H:]
                    v = qkv[:, (H + KVH) * D :].view(num_tokens, KVH, D)
                    cache.write(index, meta.slot_mapping, k, v)
                    _observe(meta, index, weights.attention_modules[index], q, k, v)
                    out = attend(attention, q, k, v, cache.key_cache[index], cache.value_cache[index], step, scale)  # (T, H D)
                    attended = o_proj(out)
                with span(f"layers.{index}.post_attention_layernorm"):
                    h = h + attended
                    x = rms_norm(h, *norm_post)
                with span(f"layers.{index}.mlp"):
                    h = h + down_proj(silu_mul(gate_up_proj(x)))
            if hidden is not None:
                hidden(index + 1, h)
        with span("final_norm"):
            return rms_norm(h.index_select(0, inputs["logits_to_keep"]), *weights.final_norm)

    def _compiled(self, ops, weights: LlamaWeights, h, cos, sin, inputs: dict, attention: str, span, hidden) -> torch.Tensor:
        """The engine's C++ ops (``prefillviz/engine/ops/engine_ops.py``): about ten calls a layer; cos and sin (T, D).

        Each residual add is fused with the norm after it: the MLP's into the next layer's input
        norm (``add_rms_norm``), the last one into the final norm.
        """
        meta = inputs["prefillviz_metadata"]
        cache = meta.kv_cache
        slots, step_rows = meta.compiled_meta
        H, KVH, D = weights.num_heads, weights.num_kv_heads, weights.head_dim
        num_tokens = h.shape[0]
        mlp_out = None  # the previous layer's MLP output, not yet added to h
        for index, (norm_in, qkv_proj, o_proj, norm_post, gate_up_proj, down_proj, scale) in enumerate(weights.layers):
            with span(f"layers.{index}"):
                with span(f"layers.{index}.input_layernorm"):
                    x = ops.rms_norm(h, *norm_in) if mlp_out is None else ops.add_rms_norm(mlp_out, h, *norm_in)
                if hidden is not None and index > 0:
                    hidden(index, h)  # the previous layer's output, now that its MLP is added
                with span(f"layers.{index}.attention"):
                    qkv = qkv_proj(x)  # (T, (H + 2 KVH) D): q and k rotated in place, k and v into the cache
                    ops.rope_write_kv(qkv, cos, sin, meta.slot_mapping, cache.key_cache[index], cache.value_cache[index], H)
                    heads = qkv.view(num_tokens, H + 2 * KVH, D)
                    if meta.observers:
                        _observe(meta, index, weights.attention_modules[index], heads[:, :H], heads[:, H : H + KVH], heads[:, H + KVH :])
                    if attention == V7:  # straight on the q|k|v rows
                        out = ops.paged_attention(qkv, cache.key_cache[index], cache.value_cache[index], slots, step_rows, H, scale)
                    else:
                        out = attend(attention, heads[:, :H], heads[:, H : H + KVH], heads[:, H + KVH :], cache.key_cache[index],
                                     cache.value_cache[index], meta.paged_step, scale)
                    attended = o_proj(out)
                with span(f"layers.{index}.post_attention_layernorm"):
                    x = ops.add_rms_norm(attended, h, *norm_post)  # h += attention; x = norm(h)
                with span(f"layers.{index}.mlp"):
                    mlp_out = down_proj(ops.silu_mul(gate_up_proj(x)))
        with span("final_norm"):
            x = ops.add_rms_norm(mlp_out, h, *weights.final_norm)
        if hidden is not None:
            hidden(len(weights.layers), h)
        return x.index_select(0, inputs["logits_to_keep"])


def forward_label(model: torch.nn.Module, capture: str = "none", with_reason: bool = False) -> str:
    """Which forward the engine's steps run at this capture level, for captions next to their timings.

    Args:
        model: the loaded model.
        capture: the run's capture level; ``profile`` hooks the modules, so the stock forward runs.
        with_reason: add why, where it is not the engine's forward with its C++ ops (the sidebar's card).
    """
    available, why = own_forward_status(model)
    if not available:
        return f"stock transformers forward ({why})" if with_reason else "stock transformers forward"
    if capture == "profile":
        return "stock transformers forward (the profiler's scopes hook its modules)" if with_reason else "stock transformers forward"
    parameter = next(model.parameters())
    ops, ops_why = engine_ops_status()
    if ops is not None and parameter.device.type == "cpu" and parameter.dtype in (torch.float32, torch.bfloat16):
        return f"engine forward, {ops_why.removeprefix('the ')}"
    if parameter.device.type != "cpu":
        return "engine forward, torch ops"
    return f"engine forward, plain torch ops ({ops_why})" if with_reason else "engine forward, plain torch ops"
