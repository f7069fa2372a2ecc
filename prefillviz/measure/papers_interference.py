"""Prefill-decode interference as the long prompt grows, and where disaggregation starts to pay
(DistServe, OSDI'24): the Disaggregated page's three set-ups (``disagg.experiment.compare_setups``,
run as they are) at several long-prompt lengths.

    long prompt N:      64      256      1024
    one engine, off     the decoding users' worst gap grows with N (they wait for the whole prefill)
    one engine, on      it stays near a chunk's step
    disaggregated       it stays near a decode step, but every prefill runs on half the cores

Interference is a set-up's worst gap between two tokens of a decoding user over its median gap. The
crossover is the smallest N at which the disaggregated run's worst gap is below a one-engine set-up's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from prefillviz.disagg.experiment import SETUPS, DisaggComparison, compare_setups
from prefillviz.experiments.chunked import ChunkedWorkload
from prefillviz.machine.progress import FractionProgress, ProgressCounter


@dataclass
class InterferencePoint:
    long_prompt_tokens: int
    comparison: DisaggComparison

    def worst_gap_ms(self, setup: str) -> float:
        return self.comparison.summaries[setup].itl_max_ms

    def interference(self, setup: str) -> float:
        """The decoding users' worst gap over their median gap in this set-up."""
        summary = self.comparison.summaries[setup]
        return summary.itl_max_ms / summary.itl_p50_ms


@dataclass
class InterferenceSweep:
    model_id: str
    device: str
    dtype: str
    points: list[InterferencePoint]  # by long prompt length

    def rows(self) -> list[dict]:
        rows = []
        for point in self.points:
            for setup in SETUPS:
                summary = point.comparison.summaries[setup]
                rows.append({
                    "long_prompt_tokens": point.long_prompt_tokens, "set-up": setup, "worst_gap_ms": summary.itl_max_ms,
                    "median_gap_ms": summary.itl_p50_ms, "interference_worst_over_median": point.interference(setup),
                    "long_prompt_ttft_ms": summary.long_ttft_ms, "same_tokens": point.comparison.outputs_equal,
                })
        return rows

    def crossover(self, against: str = SETUPS[0]) -> int | None:
        """The smallest long-prompt length whose disaggregated worst gap beats ``against``'s (None: none did)."""
        return next((p.long_prompt_tokens for p in self.points
                     if p.worst_gap_ms(SETUPS[2]) < p.worst_gap_ms(against)), None)


def run_interference(loaded, workload: ChunkedWorkload, long_prompt_sizes: list[int],
                     progress: FractionProgress | None = None, load=None) -> InterferenceSweep:
    """``compare_setups`` once per long-prompt length (the workload's long prompt cut or repeated to it).

    Args:
        loaded: the ``LoadedModel`` (its id and dtype tell the workers what to load).
        workload: the Chunked prefill page's workload; only its long prompt's length changes.
        long_prompt_sizes: the lengths, run in increasing order.
        load: what the workers load instead (tests).
    """
    sizes = sorted({int(n) for n in long_prompt_sizes})
    counter = ProgressCounter(progress, len(sizes))
    document = workload.long_prompt
    points = []
    for n in sizes:
        counter.advance(f"long prompt of {n:,} tokens: one engine (chunking off, on), then the two workers", 0)
        long_prompt = tuple((document * (n // len(document) + 1))[:n])
        comparison = compare_setups(loaded, dataclasses.replace(workload, long_prompt=long_prompt), load=load)
        points.append(InterferencePoint(n, comparison))
        counter.advance(f"long prompt of {n:,} tokens done")
    first = points[0].comparison
    return InterferenceSweep(first.model_id, first.device, first.dtype, points)
