"""What an instrument implements to watch the engine: the one way in for everything above the core.

The core never imports an instrument: ``LLMEngine.run(observer=...)`` takes any object with these methods
(the app's is ``instrument.capture.Capture``). The engine tells it of every step, the forward of its parts:

    span(name)          a context manager around each named part of the forward (timing, profiling)
    attention(...)      each layer's q (T, H, D), k and v (T, KVH, D) after its KV write   } only when
    hidden(i, h)        the residual stream h (T, hidden) after the embedding and layer i-1 } sees_tensors
"""

from __future__ import annotations

from typing import ContextManager, Protocol

import torch

from prefillviz.engine.trace import StepRecord, Trace

Tensor = torch.Tensor


class RunObserver(Protocol):
    sees_tensors: bool  # it reads q/k/v and the residual stream of every row (an inspection pass)

    def installed(self) -> ContextManager[object]:
        """Whatever the run needs set up (a profiler, hooks on a stock forward); undone on exit, even on failure."""

    def span(self, name: str) -> ContextManager[object]:
        """Around one named part of a step's forward."""

    def attention(self, layer: int, module: torch.nn.Module, q: Tensor, k: Tensor, v: Tensor, meta) -> None:
        """A layer's post-RoPE q, k and v, after the K/V were written to the cache."""

    def hidden(self, index: int, h: Tensor) -> None:
        """The residual stream after the embedding (0) or after layer ``index - 1``."""

    def end_step(self, record: StepRecord) -> None:
        """Add this step's measurements to its record (called after every step)."""

    def attach(self, trace: Trace) -> None:
        """Add the run's results to its trace (called once, after the run)."""
