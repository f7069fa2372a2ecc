"""Where one forward's time goes, per layer: the attention itself, the linears, and the rest.

``TimedBackend`` wraps a backend (the textbook ``TorchBackend`` by default) and clocks each op its
steps run, reading the device-synchronised clock before and after:

    attention    QK^T, softmax, PV over the paged cache (dense, or block-sparse)
    linears      q|k|v, o, gate|up, down, lm_head
    the rest     what is left of the time to first token: norms, RoPE and the K/V write, the
                 embedding, sampling, Python (time to first token - attention - linears)

The ops are the backend's own; the wrapper adds two clock reads per op (microseconds a layer).
"""

from __future__ import annotations

from collections import defaultdict

import torch

from prefillviz.engine.backend import Backend, TorchBackend
from prefillviz.engine.clock import synchronized_time

LINEAR_OPS = ("qkv_proj", "o_proj", "gate_up_silu", "down_proj", "lm_head")
ATTENTION_OPS = ("attention",)


class TimedOps:
    """A step's ops, each call of a linear or of attention clocked into ``OpTimes`` by layer."""

    def __init__(self, ops, times: OpTimes, device: torch.device) -> None:
        self._ops, self._times, self._device = ops, times, device

    def __getattr__(self, name: str):
        op = getattr(self._ops, name)
        kind = "linears" if name in LINEAR_OPS else "attention" if name in ATTENTION_OPS else None
        if kind is None:
            return op

        def timed(*args, **kwargs):
            start = synchronized_time(self._device)
            out = op(*args, **kwargs)
            layer = args[0] if name != "lm_head" else -1  # the lm_head counts as no layer's
            self._times.add(kind, layer, synchronized_time(self._device) - start)
            return out

        return timed


class OpTimes:
    """Seconds per kind ("attention", "linears") and layer (-1: outside the layers), summed over the steps."""

    def __init__(self) -> None:
        self.seconds: dict[str, dict[int, float]] = {"attention": defaultdict(float), "linears": defaultdict(float)}

    def add(self, kind: str, layer: int, seconds: float) -> None:
        self.seconds[kind][layer] += seconds

    def total(self, kind: str) -> float:
        return sum(self.seconds[kind].values())

    def per_layer(self, kind: str, num_layers: int) -> list[float]:
        return [self.seconds[kind].get(i, 0.0) for i in range(num_layers)]


class TimedBackend:
    """``inner``'s ops, clocked: ``times`` sums every step since it was made or ``reset``."""

    def __init__(self, inner: Backend | None = None) -> None:
        self.inner = inner or TorchBackend()
        self.name = self.inner.name  # the same backend, only watched
        self.times = OpTimes()

    def reset(self) -> OpTimes:
        self.times = OpTimes()
        return self.times

    def prepare(self, model: torch.nn.Module) -> None:
        self.inner.prepare(model)

    def for_step(self, model: torch.nn.Module, meta) -> TimedOps:
        return TimedOps(self.inner.for_step(model, meta), self.times, next(model.parameters()).device)

    def new_kv_cache(self, num_layers: int, shape: tuple, dtype: torch.dtype, device: torch.device) -> tuple:
        return self.inner.new_kv_cache(num_layers, shape, dtype, device)
