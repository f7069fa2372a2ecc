"""Captions that say which forward and which backend's ops an engine step runs on a model."""

from __future__ import annotations

import torch

from prefillviz.backends.ops.engine_ops import engine_ops_status
from prefillviz.engine.backend import Backend, backend_for
from prefillviz.engine.forward import own_forward_status


def forward_label(model: torch.nn.Module, backend: Backend | None = None, with_reason: bool = False) -> str:
    """Which forward the engine's steps run and with which backend, for captions next to their timings.

    Args:
        model: the loaded model.
        backend: the engine's backend (None: the one an engine on this model runs, ``backend_for``).
        with_reason: add why, where it is not the engine's forward with its C++ ops (the sidebar's card).
    """
    backend = backend or backend_for(model)
    available, why = own_forward_status(model)
    forward = "engine forward" if available else (f"stock transformers forward ({why})" if with_reason
                                                  else "stock transformers forward")
    if backend.name != "measured":
        return f"{forward}, textbook ops (plain torch)"
    parameter = next(model.parameters())
    ops, ops_why = engine_ops_status()
    if ops is not None and parameter.device.type == "cpu" and parameter.dtype in (torch.float32, torch.bfloat16):
        return f"{forward}, measured backend: {ops_why.removeprefix('the ')}"
    if parameter.device.type != "cpu":
        return f"{forward}, measured backend: torch ops"
    return (f"{forward}, measured backend: plain torch ops ({ops_why})" if with_reason
            else f"{forward}, measured backend: plain torch ops")
