"""Measured dispatch: which implementation of each op family an engine step runs, chosen by timing.

The engine has several correct implementations of two op families:

    attention   v7 compiled and v7 tiles (the engine's C++ kernel), v8 brgemm (bf16 or fp32: the
                engine's softmax between Q K^T and P V on oneDNN's brgemm micro-kernel, bf16 on AMX
                tiles where the CPU has them), v6 loop with fp32 decodes, v2 loop and v3 packed (torch's SDPA inside;
                on a CPU its bf16 flash attention calls oneDNN's gemm a block at a time)
    linears     oneDNN's matmul primitive (``ops/onednn_linear.py``), the brgemm and slab linears
                (``ops/brgemm_linear.py``: the engine's, SiLU in gate|up; slab: its own fp32 micro-kernel),
                torch's packed linear, ``F.linear``

Which is fastest depends on the machine: on a Zen 4 with AVX512-BF16, v7 beat SDPA; on a Xeon with
AMX, SDPA beat v7 by 4x at 2,048 tokens (and v8 beat SDPA). So no CPU flag and no preference written
here picks one. ``dispatch_tuning.measure`` checks every candidate against its oracle here (one that
fails or can't run is out, with the reason), times the rest on the model's own shapes for a few step
shapes (``BUCKETS``), and the fastest of each family in each bucket is what the engine runs:

    step  ->  bucket_of(step)  ->  table.choice(bucket, family)  ->  the implementation

A ``DispatchTable`` is kept per machine, device, dtype, thread count and model shape, on disk
(``dispatch_tables``) as the machine peaks are; ``dispatch_tables.table_for`` finds it,
measuring once when there is none. This module only reads a table: it never times anything.
``PREFILLVIZ_ATTENTION`` / ``PREFILLVIZ_LINEARS`` name a candidate to force (the
ISA-cap runs and the tests use them); a forced candidate that can't run here is refused with its
reason. Tests inject timings with ``dispatch_tables.injected_table``.
"""

from __future__ import annotations

import datetime
import functools
import os
from dataclasses import asdict, dataclass, field

import torch

from prefillviz.backends.dispatch_buckets import BUCKET_NAMES, BUCKETS, bucket_of
from prefillviz.engine.errors import ConfigError

ATTENTION, LINEARS = "attention", "linears"
FAMILIES = (ATTENTION, LINEARS)
FORCE_ENV = {ATTENTION: "PREFILLVIZ_ATTENTION", LINEARS: "PREFILLVIZ_LINEARS"}

V7 = "v7 compiled"
V7_TILES = "v7 tiles"  # v7's kernel without the rows across the lanes: which layout wins is measured too
COMPILED_CANDIDATES = (V7, V7_TILES)  # the engine's C++ kernel (``backends/ops/csrc``), one op with a layout switch
V8 = "v8 brgemm"  # bf16 or fp32: the engine's C++ softmax between two matmuls on oneDNN's brgemm micro-kernel
# C++ ops over the whole step: q read from the q|k|v rows, K/V from the cache through the slots
ROWS_CANDIDATES = (V7, V7_TILES, V8)
ATTENTION_CANDIDATES = (V7, V7_TILES, V8, "v6 loop, fp32 decodes", "v2 loop", "v3 packed")
ONEDNN, BRGEMM_LINEAR, SLAB_LINEAR, TORCH_PACKED, STOCK = (
    "oneDNN matmul", "brgemm linear", "slab linear", "torch packed", "stock")
# brgemm, slab: the engine's own (slab: fp32, AVX-512)
LINEAR_CANDIDATES = (ONEDNN, BRGEMM_LINEAR, SLAB_LINEAR, TORCH_PACKED, STOCK)
CANDIDATES = {ATTENTION: ATTENTION_CANDIDATES, LINEARS: LINEAR_CANDIDATES}
# a caption compares across kinds
KINDS = {V7: "C++", V7_TILES: "C++", V8: "brgemm",
         "v6 loop, fp32 decodes": "SDPA", "v2 loop": "SDPA", "v3 packed": "SDPA"}
# other processes' share of the cores above which a measurement is taken again (stricter than a page's 25%)
BUSY_PERCENT = 10.0
# a candidate's slowest run over its fastest above this, where it may have decided the choice: measured again
# (1.3-2.5 is ordinary jitter on a 2-core VM)
NOISY_SPREAD = 3.0
SECOND_PACK_GAIN = 1.10  # a bucket runs another pack than the primary only when it is this much faster there
PLAIN_NAMES = {  # what a caption calls each candidate
    V7: "the engine's C++ kernel (v7)",
    V7_TILES: "the engine's C++ kernel in key tiles (v7 tiles)",
    V8: "the engine's softmax between oneDNN brgemm matmuls (v8)",
    "v6 loop, fp32 decodes": "torch's SDPA (v6: fp32 decodes)",
    "v2 loop": "torch's SDPA (v2: one call per request)",
    "v3 packed": "torch's SDPA (v3: one packed call)",
    ONEDNN: "oneDNN matmul primitives",
    BRGEMM_LINEAR: "the engine's linear on oneDNN's brgemm micro-kernel, SiLU fused into gate|up",
    SLAB_LINEAR: "the engine's linear on its own fp32 micro-kernel, the next weights fetched as it multiplies, "
                 "SiLU fused into gate|up",
    TORCH_PACKED: "torch's packed linear",
    STOCK: "stock F.linear",
}


@dataclass
class DispatchTable:
    """The measured choice of one machine, device, dtype, thread count and model shape.

    Attributes:
        timings: {bucket: {family: {candidate: median seconds per call}}}, the candidates
            that passed their check (one layer's attention or linears, on the model's shape).
        excluded: {family: {candidate: why it is out}}: can't run here, or failed its oracle check.
        dropped: {bucket: {family: [candidates timed once only, over 3x the best]}}.
        measured_at: ISO 8601 time; other_cpu_percent: other processes' share of the cores meanwhile.
        spreads: {bucket: {family: {candidate: its slowest run over its fastest}}}: a chosen one over
            ``NOISY_SPREAD`` makes the table ``noisy`` (measured again next time, and said so), and so does
            another's that may have been faster but for its slow runs.
        source: "measured", "cache" (read from disk), or "injected" (a test's timings).
    """

    device: str
    dtype: str
    machine: str
    num_threads: int
    shape: str
    timings: dict
    excluded: dict = field(default_factory=dict)
    dropped: dict = field(default_factory=dict)
    measured_at: str = ""
    other_cpu_percent: float | None = None
    measure_s: float | None = None
    source: str = "measured"
    fingerprint: str = ""
    spreads: dict = field(default_factory=dict)  # {bucket: {family: {candidate: slowest run / fastest run}}}

    def choice(self, bucket: str, family: str) -> str:
        """The candidate to run: the forced one (``FORCE_ENV``) if set, else the fastest measured."""
        forced = forced_candidate(family, self)
        if forced:
            return forced
        timed = self.timings.get(self.nearest_timed(bucket), {}).get(family, {})
        if not timed:
            raise RuntimeError(f"no {family} implementation passed its check for {bucket} on this machine: "
                               f"{self.excluded.get(family)}")
        if family == LINEARS:  # the fastest of the packs kept (a second pack is a second copy of the weights)
            kept = {name: seconds for name, seconds in timed.items() if name in self.linear_packs}
            if kept:
                return min(kept, key=kept.get)
        return min(timed, key=timed.get)

    @functools.cached_property
    def linear_packs(self) -> frozenset[str]:
        """The linears candidates the engine keeps packs of: the primary, and any that is over
        ``SECOND_PACK_GAIN`` faster than the primary in some bucket. Once a second pack is made,
        every bucket runs the faster of the two."""
        primary = self.primary_linears
        packs = {primary} if primary else set()
        for bucket in self.timings.values():
            timed = bucket.get(LINEARS, {})
            if timed:
                fastest = min(timed, key=timed.get)
                if primary not in timed or timed[primary] > SECOND_PACK_GAIN * timed[fastest]:
                    packs.add(fastest)
        return frozenset(packs)

    @functools.cached_property
    def primary_linears(self) -> str:
        """The linears candidate with the least time over all buckets (the one pack every bucket shares unless
        another wins clearly)."""
        totals: dict[str, float] = {}
        for bucket in self.timings.values():
            for name, seconds in bucket.get(LINEARS, {}).items():
                totals[name] = totals.get(name, 0.0) + seconds
        complete = {n: t for n, t in totals.items() if all(n in b.get(LINEARS, {}) for b in self.timings.values())}
        return min(complete or totals, key=(complete or totals).get) if totals else ""

    def nearest_timed(self, bucket: str) -> str:
        """``bucket``, or where a first start has not timed it yet (the app times the first page's buckets first,
        ``dispatch_tables.time_next_bucket`` the others), the nearest bucket that is timed."""
        if bucket in self.timings or not self.timings:
            return bucket
        return min(self.timings, key=lambda b: abs(BUCKET_NAMES.index(b) - BUCKET_NAMES.index(bucket)))

    @property
    def partial(self) -> bool:
        """Some bucket is not timed yet (a first start's table, before ``dispatch_tuning.complete``)."""
        return not set(BUCKET_NAMES) <= set(self.timings)

    def choices(self) -> dict[str, dict[str, str]]:
        """{bucket: {family: candidate}}."""
        return {bucket: {family: self.choice(bucket, family) for family in FAMILIES} for bucket in self.timings}

    def runner_up(self, bucket: str, family: str) -> tuple[str, float] | None:
        """(the fastest candidate of another kind than the choice's, its time over the choice's), or None.

        Kinds: v7 against torch's SDPA versions for attention (v2, v3 and v6 are one kind: the
        same SDPA inside); each linears candidate is a kind of its own.
        """
        timed = self.timings.get(bucket, {}).get(family, {})
        chosen = self.choice(bucket, family)
        kind = KINDS.get(chosen, chosen)
        others = {name: s for name, s in timed.items() if KINDS.get(name, name) != kind}
        if not others or chosen not in timed:
            return None
        name = min(others, key=others.get)
        return name, others[name] / timed[chosen]

    @property
    def busy(self) -> bool:
        """Other processes used more than ``BUSY_PERCENT`` of the cores while it was measured."""
        return self.other_cpu_percent is not None and self.other_cpu_percent > BUSY_PERCENT

    @property
    def noisy(self) -> bool:
        """A candidate's runs varied by more than ``NOISY_SPREAD`` where that may have decided the choice: the
        chosen one's, or another's whose fastest run (at least its median over its spread) may have beaten
        the chosen one's median. Another program competed for the cores (on two cores, one more busy
        thread can slow every threaded kernel many times, more than the load shows)."""
        for bucket, families in self.timings.items():
            for family in FAMILIES:
                timed, chosen = families.get(family, {}), self.choice(bucket, family)
                for name, spread in self.spreads.get(bucket, {}).get(family, {}).items():
                    if spread > NOISY_SPREAD and (name == chosen or
                                                  (chosen in timed and timed[name] / spread < timed[chosen])):
                        return True
        return False

    def sentence(self, family: str) -> str:
        """One line for a caption: what the family runs, and the measured times that chose it."""
        forced = forced_candidate(family, self)
        if forced:
            return f"{family}: {PLAIN_NAMES[forced]}, forced by {FORCE_ENV[family]}"
        by_choice: dict[str, list[str]] = {}
        for bucket in self.timings:
            by_choice.setdefault(self.choice(bucket, family), []).append(bucket)
        parts = []
        for name, buckets in by_choice.items():
            part = f"{PLAIN_NAMES[name]} for {', '.join(b.replace('_', ' ') for b in buckets)}"
            widest = max(buckets, key=lambda b: (self.runner_up(b, family) or ("", 0.0))[1])
            beaten = self.runner_up(widest, family)
            if beaten:
                chosen_ms = self.timings[widest][family][name] * 1e3
                versus = f"{beaten[1]:.1f}x faster than" if beaten[1] >= 1.05 else "within 5% of"
                part += (f" (at {widest.replace('_', ' ')}: {chosen_ms:.2f} ms a layer, "
                         f"{versus} {PLAIN_NAMES[beaten[0]]})")
            parts.append(part)
        return f"{family}: " + "; ".join(parts)

    def provenance(self) -> str:
        """Where the timings come from: when, how busy, on what."""
        if self.source == "injected":
            return "timings injected by a test"
        load = ("" if self.other_cpu_percent is None
                else f", other processes used {self.other_cpu_percent:.0f}% of the cores")
        when = self.measured_at.replace("T", " ")[:16] + " UTC" if self.measured_at else "unknown time"
        doubt = (" (busy or noisy: measured again at the next start; Measure again when the machine is quiet)"
                 if self.busy or self.noisy else "")
        return (f"measured on this {self.device} ({self.machine}, {self.dtype}, {self.num_threads} threads) "
                f"at {when}{load}{doubt}")

    def rows(self) -> list[dict]:
        """One row per bucket, family and timed candidate: ms per layer, and whether the engine runs it there."""
        what = {b.name: b.what for b in BUCKETS}
        return [
            {"bucket": bucket, "step": what.get(bucket, bucket), "family": family, "candidate": name,
             "ms_per_layer": seconds * 1e3, "chosen": name == self.choice(bucket, family),
             "timed_once": name in self.dropped.get(bucket, {}).get(family, [])}
            for bucket, families in self.timings.items() for family, timed in families.items()
            for name, seconds in timed.items()
        ]

    def as_dict(self) -> dict:
        """The JSON form: every timing, exclusion and the choice per bucket."""
        return {**asdict(self), "choices": self.choices()}

    @classmethod
    def from_dict(cls, data: dict) -> DispatchTable:
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**fields)


def forced_candidate(family: str, table: DispatchTable | None = None) -> str:
    """The candidate ``FORCE_ENV[family]`` names ('' when unset).

    Raises:
        ConfigError: it names no candidate, or one the table excluded on this machine (with why).
    """
    name = os.environ.get(FORCE_ENV[family], "").strip()
    if not name:
        return ""
    matches = [c for c in CANDIDATES[family] if c == name or c.split(",")[0].split(" ")[0] == name]
    if not matches:
        raise ConfigError(f"{FORCE_ENV[family]}={name!r} names no {family} implementation; "
                          f"pick one of {', '.join(CANDIDATES[family])}.")
    if table is not None and matches[0] in table.excluded.get(family, {}):
        raise ConfigError(f"{FORCE_ENV[family]}={name!r}, but it can't run here: {table.excluded[family][matches[0]]}")
    return matches[0]


def injected(timings: dict, excluded: dict | None = None, device: str = "cpu", dtype: str = "float32") -> DispatchTable:
    """A table from given timings, as a test injects them: ``{bucket: {family: {candidate: seconds}}}``."""
    return DispatchTable(device, dtype, "injected", torch.get_num_threads(), "injected", timings, excluded or {},
                         source="injected",
                         measured_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"))


@dataclass(frozen=True)
class StepChoice:
    """What one step runs: its bucket, the attention candidate and the linears candidate."""

    bucket: str
    attention: str
    linears: str


def step_choice(table: DispatchTable, step, pack_linear_weights: bool = True) -> StepChoice:
    """The implementations for this step (``pack_linear_weights=False``: the stock linears, as the engine's setting
    asks)."""
    bucket = bucket_of(step)
    linears = table.choice(bucket, LINEARS) if pack_linear_weights else STOCK
    timed = table.nearest_timed(bucket)
    label = bucket if timed == bucket else f"{bucket} (not timed yet: {timed}'s choice)"
    return StepChoice(label, table.choice(bucket, ATTENTION), linears)
