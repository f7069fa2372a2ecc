"""The same tokens either way: each request's output in one run against a reference run.

Chunked prefill and prefix caching change how a prompt is computed, never what comes out:
in float32 the greedy tokens must be identical. Both experiments check it with this.
"""

from __future__ import annotations

from dataclasses import dataclass

from prefillviz.engine.trace import Trace


@dataclass
class OutputCheck:
    request_id: str
    tokens_reference: list[int]  # the reference run's (chunking off, cache off)
    tokens: list[int]  # the run's under test

    @property
    def identical(self) -> bool:
        return self.tokens == self.tokens_reference


def compare_outputs(reference: Trace, run: Trace) -> list[OutputCheck]:
    """Each request of ``reference`` with its output tokens in both runs."""
    return [
        OutputCheck(rid, reference.requests[rid].output_token_ids, run.requests[rid].output_token_ids)
        for rid in reference.requests
    ]
