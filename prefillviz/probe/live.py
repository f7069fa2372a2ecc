"""The live record of a running ``prefillviz serve`` (``GET /prefillviz/steps``), read from outside.

Only our server has this endpoint: it is the engine's own step record (``serve/live.py``), which no
OpenAI-compatible server exposes. Every read has a timeout; every failure is one ``ProbeError`` in words.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx

from prefillviz.engine.errors import ProbeError
from prefillviz.loading.hosted import normalized_url

TIMEOUT_S = 5.0
LIVE_PATH = "/prefillviz/steps"
REQUIRED = ("token_budget", "num_blocks", "num_steps", "steps", "requests", "recording_cost_s", "recorded_step_time_s")


def fetch_live(url: str, since_step: int = 0, timeout_s: float = TIMEOUT_S) -> dict:
    """The server's recent steps (numbered ``since_step`` on), finished requests and recording cost."""
    base = normalized_url(url)
    try:
        response = httpx.get(f"{base}{LIVE_PATH}", params={"since": since_step}, timeout=timeout_s)
    except httpx.TimeoutException as error:
        raise ProbeError(f"{base} did not answer within {timeout_s:.0f} s.") from error
    except httpx.HTTPError as error:
        raise ProbeError(f"Can't reach {base}: {error}. Is `make serve` (python -m prefillviz serve) "
                         "running?") from error
    if response.status_code == 404:
        raise ProbeError(f"{base} has no {LIVE_PATH}: only `python -m prefillviz serve` (started without --no-live) "
                         "shows its steps; other servers can be measured on the Your server page.")
    if response.status_code != 200:
        raise ProbeError(f"{base}{LIVE_PATH} answered HTTP {response.status_code}: {response.text[:200]}")
    try:
        snapshot = response.json()
    except ValueError as error:
        raise ProbeError(f"{base}{LIVE_PATH} did not answer JSON.") from error
    if not isinstance(snapshot, dict) or any(key not in snapshot for key in REQUIRED):
        raise ProbeError(f"{base}{LIVE_PATH} answered something else than the engine's live record.")
    return snapshot


@dataclass(frozen=True)
class RecordingCost:
    """What keeping the live record cost the engine thread, as the server measured it."""

    cost_s: float
    step_time_s: float
    num_steps: int
    read_s: float = 0.0
    num_reads: int = 0

    @property
    def fraction(self) -> float | None:
        return self.cost_s / self.step_time_s if self.step_time_s else None

    def sentence(self) -> str:
        if not self.num_steps or self.fraction is None:
            return "No step has run yet: the recording cost is measured once the server has served something."
        per_step_us = self.cost_s / self.num_steps * 1e6
        text = (f"Recording these steps cost the engine {per_step_us:.0f} µs per step, {self.fraction:.3%} of the "
                f"{self.step_time_s:.1f} s its {self.num_steps:,} steps took (timed by the server itself, on the "
                "engine's thread).")
        if self.num_reads:
            text += (f" The {self.num_reads:,} earlier reads of this record took the server "
                     f"{self.read_s / self.num_reads * 1000:.1f} ms each on its HTTP thread, holding the Python lock "
                     "the engine's thread also needs.")
        return text


def recording_cost(snapshot: dict) -> RecordingCost:
    return RecordingCost(snapshot["recording_cost_s"], snapshot["recorded_step_time_s"], snapshot["num_steps"],
                         snapshot.get("read_cost_s", 0.0), snapshot.get("num_reads", 0))
