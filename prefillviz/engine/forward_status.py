"""Whether the engine runs its own forward of a model (``llama_forward``), whether an instrument
hooked the model's modules (then the stock forward runs), and the caption that says which forward ran."""

from __future__ import annotations

import os

import torch
from torch.nn.modules import module as module_globals

from prefillviz.engine.ops.engine_ops import engine_ops_status

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


def hooked(modules: list[torch.nn.Module]) -> bool:
    """Whether an instrument hooked any module. transformers' own hooks don't count: once a call
    asked for ``output_attentions`` it leaves output-capturing hooks on the layers for good, which
    record nothing unless a call asks again (and the engine never does)."""
    def ours(hooks) -> bool:
        return any(not getattr(hook, "__module__", "").startswith("transformers.") for hook in hooks.values())

    if ours(module_globals._global_forward_hooks) or ours(module_globals._global_forward_pre_hooks):
        return True
    return any(ours(m._forward_hooks) or ours(m._forward_pre_hooks) for m in modules if m._forward_hooks or m._forward_pre_hooks)


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
