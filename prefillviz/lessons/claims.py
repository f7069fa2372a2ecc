"""Statements that are true only on some machines, dtypes, models or outcomes, and the guard each needs.

A lesson's text may state one of these only where its guard holds for the run it is shown with. The
guard is written in the reveal variants' grammar (``reveal_text.parse_condition``: measured names and
``RUN_NUMBERS``, joined by "and") and checked by the same code that picks a variant, so a sentence
and the variant it sits in can't disagree. ``NEVER`` marks a statement no run can justify: a fixed
machine ("on 2 cores"), a fixed model ("135M"), or a rule of thumb that the measurement replaces.

``contradictions`` lists the guarded statements of a text that the run's numbers contradict; the
lessons' tests render every step under simulated outcomes and require it to be empty.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from prefillviz.lessons.actions import ActionOutcome
from prefillviz.lessons.reveal_text import parse_condition, run_numbers

NEVER = "never"
WEIGHTS_READ = "the weights' read time at the measured bandwidth"


@dataclass(frozen=True)
class Claim:
    """A statement (a regular expression over one sentence) and the guard it needs."""

    pattern: str
    guard: str  # "name op number [and ...]", or NEVER
    why: str


CLAIMS = (
    # the machine
    Claim(r"\bcores\b", "on_gpu < 1", "only a CPU has cores to split"),
    Claim(r"\bon \d+ cores\b|\b\d+-core\b", NEVER, "a fixed core count is one machine's"),
    Claim(r"CPU caches?", "on_gpu < 1", "a GPU run gets no CPU explanation"),
    Claim(r"\b135M(?:-parameter)? model", NEVER, "the model is whichever the sidebar loaded: {model_id}"),
    Claim(r"fastest dtype", NEVER, "auto is bfloat16 on any CUDA GPU, fast bf16 or not"),
    Claim(r"a few dozen tokens reach|A CPU's ridge is low", NEVER, "a CPU with AMX bf16 has a ridge in the hundreds"),
    Claim(r"ridge is low|compute-bound after a few tokens", "ridge_tokens < 64", "the measured ridge, in tokens"),
    Claim(r"ridge is high", "ridge_tokens >= 64", "the measured ridge, in tokens"),
    Claim(r"still left of the ridge", "prefill_over_ridge <= 1", "the prefill step's side of the measured ridge"),
    Claim(r"prefill is right of the ridge", "prefill_over_ridge > 1", "the prefill step's side of the measured ridge"),
    Claim(r"generated tokens are the same", "outputs_identical >= 1", "the run's own comparison of the outputs"),
    Claim(r"cost next to nothing here", "mixed_over_prefill <= 1.1", "the measured mixed step over the prefill"),
    # outcomes
    Claim(r"TTFT hardly grew", "ttft_ratio < 2", "the measured TTFT ratio"),
    Claim(r"still less than the model's own weights", "kv_at_context_over_weights < 1", "the model's own sizes"),
    Claim(r"more than the model's own weights", "kv_at_context_over_weights >= 1", "the model's own sizes"),
    Claim(r"TTFT (?:is|was) close to one engine's", "disagg_ttft_ratio >= 0.95 and disagg_ttft_ratio <= 1.05",
          "the measured TTFT ratio"),
    Claim(r"\bshare one GPU\b", "placement_kind >= 1 and placement_kind < 2", "where the workers ran"),
    Claim(r"GPU of its own", "placement_kind >= 2", "where the workers ran"),
    Claim(r"set by reading the weights", "weights_read_share >= 0.5", WEIGHTS_READ),
    Claim(r"launch and host overhead", "weights_read_share < 0.5", WEIGHTS_READ),
    Claim(r"\blayer by layer\b", "positions_before_next_layer > 1", "the one-step run's recorded KV write events"),
    Claim(r"one position at a time", "positions_before_next_layer <= 1", "the one-step run's recorded KV write events"),
    Claim(r"slower than dense", "sparse_ttft_speedup <= 1", "the measured end-to-end speedup of block-sparse prefill"),
    Claim(r"faster than dense", "sparse_ttft_speedup > 1", "the measured end-to-end speedup of block-sparse prefill"),
    Claim(r"within it, as Amdahl", "speedup_over_amdahl_cap <= 1", "the measured speedup against Amdahl's cap"),
    Claim(r"One step gave every first token", "steps_to_last_first_token <= 1", "the class burst's measured steps"),
    Claim(r"earlier students' answers, not their prefills", "students_per_slot > 1",
          "more students than running slots: some queue for one"),
    Claim(r"of the prompt tokens came from the prefix cache", "cached_percent > 0", "the class burst's cache hits"),
    Claim(r"No prompt token came from the prefix cache", "cached_percent <= 0", "the class burst's cache hits"),
    Claim(r"the longer the prompt, the cheaper", NEVER, "bytes per FLOP stay flat until attention's N² term counts"),
    Claim(r"on an A100 .*falling until about 512", NEVER, "Figure 2's rows rise at 256 and past 4k"),
)
_SENTENCE = re.compile(r"(?<=[.!?:])\s+|\n+")


def contradictions(text: str, outcome: ActionOutcome) -> list[str]:
    """The sentences of ``text`` whose statement the run contradicts, each with the reason.

    A claim whose guard names a number this run did not measure is not checked here: the loader has
    already required every variant condition to name a measured number, and a claim outside a variant
    must be one the guard's names make checkable (``NEVER`` claims always are)."""
    numbers = outcome.measured | run_numbers(outcome)
    found = []
    for sentence in _SENTENCE.split(text):
        for claim in CLAIMS:
            if not re.search(claim.pattern, sentence, flags=re.IGNORECASE):
                continue
            if claim.guard == NEVER:
                found.append(f"{sentence.strip()!r}: {claim.why}")
                continue
            conditions = parse_condition(claim.guard, tuple(re.findall(r"[a-z_]+", claim.guard)), "claim")
            if all(c.name in numbers for c in conditions) and not all(c.holds(numbers) for c in conditions):
                found.append(f"{sentence.strip()!r}: needs {claim.guard} ({claim.why})")
    return found
