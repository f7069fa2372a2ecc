"""The engine's own forward of a Llama-shaped model (as vLLM's ``model_executor/models/llama.py``).

One step's tokens, every request packed into one (T, hidden) batch, through the layers:

    per layer   h ─┬─ RMSNorm ─ [q|k|v] = x W_qkv ─ RoPE(q, k) ─ write K/V ─ paged attention ─ x W_o ─(+)─┐
                   └──────────────────────────────────────────────────────────────────────────────┘
                h ─┬─ RMSNorm ─ silu(x W_gate) * (x W_up) ─ x W_down ─(+)─┐
                   └──────────────────────────────────────────────────────┘

Each op comes from the step's ``StepOps`` (``backend.py``): the textbook's plain torch, or the
measured backend's kernels. The arithmetic is the stock model's (RMSNorm in fp32 then cast, RoPE
in the model's dtype, SiLU): ``tests/model/test_llama_forward.py`` checks the logits against the
plain HF forward. Each residual add waits for the norm after it, so a backend can fuse the two.

A run observer (``observer.py``) sees named spans (``embedding``, ``layers.i`` and its parts,
``final_norm``, ``lm_head``), each layer's q, k and v, and the residual stream: the timing,
inspection and profile passes all observe this forward, so what is inspected is what is timed.

A model this file does not know runs the stock ``transformers`` forward with the engine's
attention inside it (``attention.py``); ``own_forward_status`` says why.
"""

from __future__ import annotations

import contextlib
import os

import torch
import torch.nn.functional as F

STOCK_FORWARD_ENV = "PREFILLVIZ_STOCK_FORWARD"
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")


def own_forward_status(model: torch.nn.Module) -> tuple[bool, str]:
    """(whether the engine runs its own forward of this model, why not when it doesn't)."""
    if os.environ.get(STOCK_FORWARD_ENV, "").strip() not in ("", "0"):
        return False, f"{STOCK_FORWARD_ENV} is set: the stock transformers forward runs"
    config = model.config
    model_type = getattr(config, "model_type", "")
    if model_type not in SUPPORTED_MODEL_TYPES:
        name = model_type or type(model).__name__
        return False, f"no engine forward for {name} models; the stock transformers forward runs"
    if getattr(config, "hidden_act", "silu") != "silu":
        return False, f"activation {config.hidden_act!r}: the stock transformers forward runs"
    mistral_window = model_type == "mistral" and getattr(config, "sliding_window", None)
    if getattr(config, "use_sliding_window", False) or mistral_window:
        return False, "sliding-window attention: the stock transformers forward runs"
    decoder = getattr(model, "model", None)
    if decoder is None or not hasattr(decoder, "layers") or not hasattr(decoder, "rotary_emb"):
        return False, "the model's modules are not laid out as transformers' Llama: the stock forward runs"
    layer = decoder.layers[0]
    if any(getattr(linear, "bias", None) is not None for linear in (layer.mlp.gate_proj, layer.self_attn.o_proj)):
        return False, "biased MLP or output projections: the stock transformers forward runs"
    return True, ""


_NO_SPAN = contextlib.nullcontext()  # reusable: the span of a step nobody observes


def _no_span(name: str) -> contextlib.nullcontext:
    return _NO_SPAN


class LlamaForward:
    """Runs one engine step (``ModelRunner.prepare``'s inputs) through the layers with a step's ops."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.decoder = model.model
        config = model.config
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads

    def __call__(self, inputs: dict, ops, observer=None) -> torch.Tensor:
        """Logits (num_kept, V) at the rows ``inputs['logits_to_keep']`` names, with the step's ``StepOps``,
        telling ``observer`` (a ``RunObserver`` or None) of spans, q/k/v and the residual stream."""
        span = observer.span if observer is not None else _no_span
        inspect = observer if observer is not None and observer.sees_tensors else None  # q/k/v and the residual stream
        meta = inputs["prefillviz_metadata"]
        keep = inputs["logits_to_keep"]
        decoder = self.decoder
        with span("embedding"):
            h = F.embedding(inputs["input_ids"][0], decoder.embed_tokens.weight)  # (T, hidden)
        if inspect is not None:
            inspect.hidden(0, h)
        cos, sin = decoder.rotary_emb(h[None], inputs["position_ids"])  # (1, T, D) in the model's dtype
        cos, sin = cos[0], sin[0]
        # past the last layer's K/V writes only the rows whose logits are kept are needed, its attention
        # included: the other rows feed nothing (as llama.cpp's last layer), unless an inspection reads them
        prune_at = len(decoder.layers) - 1 if inspect is None and keep.numel() < h.shape[0] else None
        mlp_out = None  # the previous layer's MLP output, not yet added to h
        for i, layer in enumerate(decoder.layers):
            with span(f"layers.{i}"):
                with span(f"layers.{i}.input_layernorm"):
                    x = ops.add_rms_norm(mlp_out, h, layer.input_layernorm)  # h += the last MLP's output; x = norm(h)
                if inspect is not None and i > 0:
                    inspect.hidden(i, h)  # the previous layer's output, now that its MLP is added
                with span(f"layers.{i}.attention"):
                    q, k, v = ops.rope_write_kv(i, ops.qkv_proj(i, x), cos, sin, meta)  # (T, heads, D); K/V in cache
                    if inspect is not None:
                        inspect.attention(i, layer.self_attn, q, k, v, meta)
                    scale = getattr(layer.self_attn, "scaling", self.head_dim**-0.5)
                    if i == prune_at:  # the last layer: attention at the kept rows only, and h cut to them
                        out = ops.attention(i, q, k, v, scale, meta, keep)
                        h, keep = h.index_select(0, keep), torch.arange(keep.numel(), device=keep.device)
                    else:
                        out = ops.attention(i, q, k, v, scale, meta)  # (T, H D)
                    attended = ops.o_proj(i, out)
                with span(f"layers.{i}.post_attention_layernorm"):
                    x = ops.add_rms_norm(attended, h, layer.post_attention_layernorm)  # h += attention; x = norm(h)
                with span(f"layers.{i}.mlp"):
                    mlp_out = ops.down_proj(i, ops.gate_up_silu(i, x))
        with span("final_norm"):
            x = ops.add_rms_norm(mlp_out, h, decoder.norm).index_select(0, keep)  # only the rows whose logits are kept
        if inspect is not None:
            inspect.hidden(len(decoder.layers), h)
        with span("lm_head"):
            return ops.lm_head(x)
