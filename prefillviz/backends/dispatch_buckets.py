"""The step shapes the dispatch is measured on, and the one each engine step is timed as.

A step's bucket says what kind of work it is (decodes only, new tokens over a cached context,
or a fresh prefill by size); ``dispatch_tuning`` times every candidate on each bucket's shape,
and ``dispatch.step_choice`` runs, for a step, the fastest in its bucket.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Bucket:
    """A step shape the dispatch is measured on: its requests as (num_computed, num_new)."""

    name: str
    requests: tuple[tuple[int, int], ...]
    what: str

    @property
    def num_tokens(self) -> int:
        return sum(new for _, new in self.requests)


BUCKETS = (
    Bucket("decode", ((512, 1),), "one decode step over 512 cached tokens"),
    Bucket("mixed", ((1024, 29), (96, 1), (96, 1), (96, 1)),
           "a 29-token chunk after 1,024 cached tokens with 3 decodes"),
    Bucket("prefill_128", ((0, 128),), "a fresh 128-token prompt"),
    Bucket("prefill_512", ((0, 512),), "a fresh 512-token prompt"),
    Bucket("prefill_2048", ((0, 2048),), "a fresh 2,048-token prompt"),
)
BUCKET_NAMES = tuple(b.name for b in BUCKETS)


def bucket_of(step) -> str:
    """The bucket a step (``PagedStep``) is timed as: decodes only, anything over cached context, or a fresh prefill
    by size."""
    return bucket_for([step.query_len(r) for r in range(step.num_requests)], step.num_computed)


def bucket_for(query_lens: list[int], num_computed: list[int]) -> str:
    """``bucket_of`` from each request's new tokens and what it had cached."""
    if all(n == 1 for n in query_lens):
        return "decode"
    if any(num_computed):
        return "mixed"
    total = sum(query_lens)
    return "prefill_128" if total <= 256 else "prefill_512" if total <= 1024 else "prefill_2048"
