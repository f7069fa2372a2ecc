"""The engine as ``python -m prefillviz serve`` runs it: its settings and its warm-up, written once for the
server and for the lesson step that measures a class's burst of requests in-process (``class_burst.py``).

The server's options default to ``EngineConfig``'s own defaults (``serve/server.py``), so an engine built
with ``served_engine_config()`` schedules as a freshly started server does.
"""

from __future__ import annotations

import time

from prefillviz.engine.config import EngineConfig
from prefillviz.engine.engine import LLMEngine
from prefillviz.engine.request import SamplingParams
from prefillviz.loading.hosted import hosted_policy

SERVED_DEFAULTS = EngineConfig()  # what `prefillviz serve` runs with when given no option
WARM_UP_TOKENS, WARM_UP_NEW_TOKENS = 64, 3


def served_engine_config(**changes) -> EngineConfig:
    """The server's engine settings (``changes``: the options given), with the hosted demo's request limits."""
    return EngineConfig(**(SERVED_DEFAULTS.as_dict() | hosted_policy().engine_limits() | changes))


def warm_full_batch(engine: LLMEngine) -> float:
    """Run a full batch of short, distinct requests (no prefix hits) through ``engine``: prefill, mixed and decode
    steps at the batch's size, so the first timed requests don't pay for each shape's first run. The engine's
    history of them is cleared; returns the seconds it took."""
    started = time.perf_counter()
    for i in range(engine.config.max_num_running):
        engine.add_request([(i * WARM_UP_TOKENS + t) % engine.vocab_size for t in range(WARM_UP_TOKENS)],
                           SamplingParams(max_new_tokens=WARM_UP_NEW_TOKENS))
    engine.run()
    engine.steps.clear()
    engine.request_records.clear()
    return time.perf_counter() - started
