"""A model's shape, as the cost formulas, the loader and the pages read it: layers, widths, heads, biases, dtype.

``model_shape`` reads it from whatever describes the model: a transformers config, a torch
model (which adds its parameter count and dtype) or a ``LoadedModel`` (its ``info``). Two
families:

* Llama-like: q/k/v/o projections, a gated MLP (gate/up/down), RMSNorm; Llama, Mistral,
  Qwen2 (q/k/v biases), SmolLM2, ...
* GPT-2: fused ``c_attn``, a 2-matrix MLP, LayerNorm, biases everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from prefillviz.engine.kv_cache import kv_bytes_per_token

_GPT2_MODEL_TYPES = {"gpt2"}
_QKV_BIAS_MODEL_TYPES = {"qwen2"}  # Qwen2 has q/k/v biases but no o_proj/MLP bias


@dataclass(frozen=True)
class ModelShape:
    """What the engine, the cost formulas and the pages need to know about a model."""

    architecture: str  # the model class ("LlamaForCausalLM"), or the config's model_type when read from a config
    family: str  # "llama" (gated MLP, RMSNorm) or "gpt2" (2-matrix MLP, LayerNorm)
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    max_context: int | None = None
    num_parameters: int | None = None  # known when read from a model (tied weights counted once)
    dtype_bytes: int | None = None  # known when read from a model
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False

    @property
    def norm(self) -> str:
        return "layernorm" if self.family == "gpt2" else "rmsnorm"

    @property
    def kv_bytes_per_token(self) -> int | None:
        """KV-cache bytes of one token over all layers in the model's dtype (None: dtype unknown)."""
        if self.dtype_bytes is None:
            return None
        return kv_bytes_per_token(self.num_layers, self.num_kv_heads, self.head_dim, self.dtype_bytes)


def model_shape(source: Any) -> ModelShape:
    """The shape of a ``ModelShape`` (as it is), a ``LoadedModel``, a torch model or a transformers config."""
    if isinstance(source, ModelShape):
        return source
    if isinstance(getattr(source, "info", None), ModelShape):  # LoadedModel
        return source.info
    if hasattr(source, "config") and hasattr(source, "parameters"):  # a torch model
        return replace(
            _shape_from_config(source.config), architecture=type(source).__name__,
            num_parameters=sum(p.numel() for p in source.parameters()),  # shared parameters appear once
            dtype_bytes=source.dtype.itemsize,
        )
    return _shape_from_config(source)


def _shape_from_config(config: Any) -> ModelShape:
    """Llama-style names (``num_hidden_layers``, ``num_key_value_heads``, ...) and GPT-2-style ones
    (``n_layer``, ``n_head``, ``n_embd``, ``n_positions``)."""
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    model_type = getattr(config, "model_type", "")

    def first(*names: str) -> Any:
        for name in names:
            value = getattr(config, name, None)
            if value is not None:
                return value
        return None

    num_heads = first("num_attention_heads", "n_head", "num_heads")
    hidden_size = first("hidden_size", "n_embd", "d_model")
    gpt2 = model_type in _GPT2_MODEL_TYPES
    attention_bias = bool(getattr(config, "attention_bias", False))
    return ModelShape(
        architecture=model_type,
        family="gpt2" if gpt2 else "llama",
        num_layers=first("num_hidden_layers", "n_layer", "num_layers"),
        num_heads=num_heads,
        num_kv_heads=first("num_key_value_heads", "num_kv_heads") or num_heads,
        head_dim=first("head_dim") or hidden_size // num_heads,
        hidden_size=hidden_size,
        # GPT-2: n_inner None means 4 * n_embd
        intermediate_size=first("intermediate_size", "n_inner", "ffn_dim") or 4 * hidden_size,
        vocab_size=config.vocab_size,
        max_context=first("max_position_embeddings", "n_positions"),
        qkv_bias=gpt2 or attention_bias or model_type in _QKV_BIAS_MODEL_TYPES,
        o_bias=gpt2 or attention_bias,
        mlp_bias=gpt2 or bool(getattr(config, "mlp_bias", False)),
    )
