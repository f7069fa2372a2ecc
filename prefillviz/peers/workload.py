"""A workload for a peer engine: its requests, and what both engines need of it to run."""

from __future__ import annotations

from dataclasses import dataclass

from prefillviz.engine.errors import ConfigError


@dataclass(frozen=True)
class PeerRequest:
    """One request of a workload: it arrives at ``arrival_step``, or, when ``arrival_s`` is set,
    at the first step boundary after that many seconds from the run's start. Greedy unless
    ``temperature`` > 0 (then ``top_k``, ``top_p`` and ``seed`` apply)."""

    request_id: str
    token_ids: list[int]
    max_new_tokens: int
    arrival_step: int = 0
    arrival_s: float | None = None
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = 0

    def to_json(self) -> dict:
        return {
            "id": self.request_id, "token_ids": list(self.token_ids), "max_new_tokens": self.max_new_tokens,
            "arrival_step": self.arrival_step, "arrival_s": self.arrival_s, "temperature": self.temperature,
            "top_k": self.top_k, "top_p": self.top_p, "seed": self.seed,
        }


def check_workload(requests: list[PeerRequest], token_budget: int, chunking: bool) -> None:
    """Raise ``ConfigError`` for a workload neither engine can run: with chunking off every prompt must fit one step."""
    longest = max((len(r.token_ids) for r in requests), default=0)
    if not chunking and longest > token_budget:
        raise ConfigError(
            f"With chunking off a prompt runs in one step, so the token budget ({token_budget}) must hold the longest "
            f"prompt ({longest} tokens); raise the budget or turn chunking on."
        )
