"""A session's lesson runs: ``action_key`` names a run, ``RunStore`` keeps the newest few."""

from __future__ import annotations

import json

from prefillviz.lessons.actions import ActionOutcome


def action_key(action: dict, loaded, settings: dict | None = None) -> str:
    """Names a run: the same action in the same step settings on the same model, device and
    dtype measures the same thing (two steps with one action share one run)."""
    identity = {
        "action": action, "settings": settings or {}, "model": loaded.model_id, "device": str(loaded.device),
        "dtype": str(loaded.dtype),
    }
    return json.dumps(identity, sort_keys=True)


class RunStore:
    """One session's lesson runs by ``action_key``, newest last, at most ``max_runs`` of them.

    A prefill's inspection pass holds every layer's queries, keys and values, so old runs are
    dropped; the default keeps the four runs the longest lesson needs.
    """

    def __init__(self, max_runs: int = 4) -> None:
        self.max_runs = max_runs
        self._runs: dict[str, tuple[ActionOutcome, str]] = {}  # key -> (outcome, the step that ran it)

    def __len__(self) -> int:
        return len(self._runs)

    def get(self, key: str) -> ActionOutcome | None:
        return self._runs[key][0] if key in self._runs else None

    def origin(self, key: str) -> str:
        return self._runs[key][1] if key in self._runs else ""

    def put(self, key: str, outcome: ActionOutcome, origin: str) -> None:
        self._runs.pop(key, None)  # re-inserted: the newest run is the last to go
        self._runs[key] = (outcome, origin)
        while len(self._runs) > self.max_runs:
            self._runs.pop(next(iter(self._runs)))
