"""What an instrument implements to watch the engine: the one way in for everything above the core.

The core never imports an instrument. ``LLMEngine.run(observer=...)`` takes any object with
these three methods; ``instrument.capture.Capture`` is the one the app uses (its capture
levels). While installed, an observer may set the runner's three hook points, which the
engine's forward reads and the core never fills itself:

    runner.span_clock       a ``timers.SpanClock``: the forward times its named spans on it
    runner.observers        callables (layer, module, q, k, v, metadata) after each layer's KV write
    runner.hidden_observer  a callable (index, hidden (T, hidden)) after the embedding and each layer
"""

from __future__ import annotations

from typing import ContextManager, Protocol

from prefillviz.engine.trace import StepRecord, Trace


class RunObserver(Protocol):
    def installed(self) -> ContextManager[object]:
        """Set the hooks for the run; take every one of them off on exit, even when the run fails."""

    def end_step(self, record: StepRecord) -> None:
        """Add this step's measurements to its record (called after every step)."""

    def attach(self, trace: Trace) -> None:
        """Add the run's results to its trace (called once, after the run)."""
