"""The modules of a decoder-only LM that a capture's hooks time: the embedding, each layer and its
attention, MLP and norms, the final norm and the LM head, found by their names."""

from __future__ import annotations

from dataclasses import dataclass

import torch

SUB_LAYER_KINDS = ("attention", "mlp", "norm")


@dataclass
class ModelParts:
    """The modules of a decoder-only LM that get a timing scope."""

    embedding: torch.nn.Module
    layers: torch.nn.ModuleList
    final_norm: torch.nn.Module | None
    lm_head: torch.nn.Module
    sub_layers: list[dict[str, tuple[str, torch.nn.Module]]]  # per layer: child name -> (kind, module)


def _kind(child_name: str) -> str | None:
    name = child_name.lower()
    if "norm" in name or name.startswith("ln"):  # before attention: post_attention_layernorm
        return "norm"
    if "attn" in name or "attention" in name:
        return "attention"
    if "mlp" in name or name in {"ffn", "feed_forward"}:
        return "mlp"
    return None


def model_parts(model: torch.nn.Module) -> ModelParts:
    """Find embeddings, decoder layers, final norm and lm_head (Llama, Qwen2, Mistral, Phi, GPT-2)."""
    num_layers = model.config.num_hidden_layers
    layers = next(
        m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) == num_layers
    )
    base = model.get_decoder() if hasattr(model, "get_decoder") else model.base_model
    final_norm = next(
        (m for name, m in base.named_children() if name in {"norm", "ln_f", "final_layernorm", "final_layer_norm"}),
        None,
    )
    sub_layers = []
    for layer in layers:
        children = {}
        for name, child in layer.named_children():
            kind = _kind(name)
            if kind is not None:
                children[name] = (kind, child)
        sub_layers.append(children)
    return ModelParts(model.get_input_embeddings(), layers, final_norm, model.get_output_embeddings(), sub_layers)
