"""Hosted mode: the settings for a public demo that strangers use at once.

Switched on by one environment variable, ``PREFILLVIZ_HOSTED=1``. Then:

* only allow-listed model ids load (no local paths, no other hub downloads);
* prompts, requests per workload, new tokens and sweep sizes have upper limits (the engine
  applies its two through ``EngineConfig``, which the app's engine builders fill from
  ``engine_limits``).

Off (the default), a user on their own machine may load any causal LM by id or folder.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from prefillviz.errors import ModelLoadError
from prefillviz.model_registry import BUNDLED_HUB_ID, BUNDLED_MODEL_ID

HOSTED_ENV = "PREFILLVIZ_HOSTED"


@dataclass(frozen=True)
class HostedPolicy:
    enabled: bool
    allowed_model_ids: tuple[str, ...] = (BUNDLED_MODEL_ID, BUNDLED_HUB_ID)
    max_prompt_tokens: int = 2048
    max_requests_per_workload: int = 8
    max_new_tokens: int = 64
    max_sweep_points: int = 8

    def check_model(self, model_id: str) -> None:
        """Raise ``ModelLoadError`` if hosted mode may not load ``model_id``."""
        if not self.enabled or model_id in self.allowed_model_ids:
            return
        looks_like_path = model_id.startswith(("/", ".", "~")) or "\\" in model_id or ".." in model_id or os.path.exists(model_id)
        kind = "Local paths are" if looks_like_path else f"{model_id!r} is"
        raise ModelLoadError(
            f"{kind} not available in this hosted demo; it serves only {', '.join(self.allowed_model_ids)}. "
            "Run prefillviz on your own machine to load other models."
        )

    def engine_limits(self) -> dict[str, int]:
        """The ``EngineConfig`` fields that bound each request: ``EngineConfig(..., **policy.engine_limits())``."""
        return {"max_prompt_tokens": self.max_prompt_tokens, "max_new_tokens": self.max_new_tokens} if self.enabled else {}

    def limit(self, name: str, value: int) -> int:
        """``value`` capped by the hosted limit ``max_<name>`` (unchanged when hosting is off)."""
        return min(value, getattr(self, f"max_{name}")) if self.enabled else value


def hosted_policy() -> HostedPolicy:
    """The policy in force now (read from the environment on each call)."""
    return HostedPolicy(enabled=os.environ.get(HOSTED_ENV, "").strip().lower() in {"1", "true", "yes", "on"})
