"""A model's shape as the cost formulas see it: layers, widths, heads, biases, dtype.

``model_shape`` reads it from whatever describes the model: a ``ModelInfo``, a
transformers config, a torch model or a ``LoadedModel``. Two families:

* Llama-like: q/k/v/o projections, a gated MLP (gate/up/down), RMSNorm; Llama, Mistral,
  Qwen2 (q/k/v biases), SmolLM2, ...
* GPT-2: fused ``c_attn``, a 2-matrix MLP, LayerNorm, biases everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from prefillviz.models import ModelInfo

_GPT2_ARCHITECTURES = ("GPT2LMHeadModel", "GPT2Model")
_QKV_BIAS_MODEL_TYPES = {"qwen2"}  # Qwen2 has q/k/v biases but no o_proj/MLP bias


@dataclass(frozen=True)
class ModelShape:
    """What the cost formulas need to know about a model, whatever described it."""

    family: str  # "llama" (gated MLP, RMSNorm) or "gpt2" (2-matrix MLP, LayerNorm)
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    dtype_bytes: int | None = None  # known when read from a model or ModelInfo

    @property
    def norm(self) -> str:
        return "layernorm" if self.family == "gpt2" else "rmsnorm"



def model_shape(source: Any) -> ModelShape:
    """Reads the shape from a ``ModelInfo``, a transformers config, a model or a ``LoadedModel``.

    Args:
        source: any of the above; ``ModelShape`` passes through.

    Returns:
        The ``ModelShape`` (``dtype_bytes`` set when the source knows its dtype).
    """
    if isinstance(source, ModelShape):
        return source
    if isinstance(source, ModelInfo):
        return _shape_from_info(source)
    if hasattr(source, "info") and isinstance(source.info, ModelInfo):  # LoadedModel
        return _shape_from_info(source.info)
    if hasattr(source, "config") and hasattr(source, "parameters"):  # a torch model
        return replace(_shape_from_config(source.config), dtype_bytes=next(source.parameters()).element_size())
    return _shape_from_config(source)


def _shape_from_info(info: ModelInfo) -> ModelShape:
    family = "gpt2" if info.architecture in _GPT2_ARCHITECTURES else "llama"
    gpt2 = family == "gpt2"
    return ModelShape(
        family=family,
        num_layers=info.num_layers,
        hidden_size=info.hidden_size,
        num_heads=info.num_heads,
        num_kv_heads=info.num_kv_heads,
        head_dim=info.head_dim,
        intermediate_size=info.intermediate_size or 4 * info.hidden_size,
        vocab_size=info.vocab_size,
        qkv_bias=gpt2 or info.architecture.startswith("Qwen2"),
        o_bias=gpt2,
        mlp_bias=gpt2,
        dtype_bytes=info.dtype_bytes,
    )


def _shape_from_config(config: Any) -> ModelShape:
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    model_type = getattr(config, "model_type", "")
    if model_type == "gpt2":
        hidden = config.n_embd
        return ModelShape(
            family="gpt2",
            num_layers=config.n_layer,
            hidden_size=hidden,
            num_heads=config.n_head,
            num_kv_heads=config.n_head,
            head_dim=hidden // config.n_head,
            intermediate_size=config.n_inner or 4 * hidden,
            vocab_size=config.vocab_size,
            qkv_bias=True,
            o_bias=True,
            mlp_bias=True,
        )
    heads = config.num_attention_heads
    attention_bias = bool(getattr(config, "attention_bias", False))
    return ModelShape(
        family="llama",
        num_layers=config.num_hidden_layers,
        hidden_size=config.hidden_size,
        num_heads=heads,
        num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
        head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
        intermediate_size=config.intermediate_size,
        vocab_size=config.vocab_size,
        qkv_bias=attention_bias or model_type in _QKV_BIAS_MODEL_TYPES,
        o_bias=attention_bias,
        mlp_bias=bool(getattr(config, "mlp_bias", False)),
    )
