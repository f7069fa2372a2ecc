"""The published numbers the "Reproduce the papers" page and lesson 6 set beside our runs.

Each file under ``assets/papers/`` is a verbatim copy (``git show``) of a file in the paper's own
repository; ``SOURCES`` says which repository, path and commit, and the model and hardware the
numbers were measured on. Nothing here is typed in by hand: the loaders read those files.

    sarathi_serve_table_2.csv          Sarathi-Serve (OSDI'24) Table 2: decode-only, prefill-only and
                                       mixed batches, per-token time
    sarathi_serve_figure_9a.csv        Sarathi-Serve Figure 9a: prefill time in chunks, relative to whole
    sarathi_serve_figure_2_prefill.csv Sarathi-Serve Figure 2: prefill batch time against prompt length
    distserve_profile_a100_vllm.json   DistServe (OSDI'24) simulator's fitted step-time model of a
                                       colocated (vLLM) engine; the paper's Figure 2 points are not in
                                       the repository, so the interference curve is drawn from this model
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

PAPERS_DIR = Path(__file__).resolve().parents[2] / "assets" / "papers"
SARATHI_REPO = "microsoft/sarathi-serve"
SARATHI_COMMIT = "ceaa0660ea2487976101a8167aad5c8046e85b27"  # branch osdi-sarathi-serve (main has no osdi-experiments/)
DISTSERVE_REPO = "LLMServe/DistServe"
DISTSERVE_COMMIT = "82831f1604cc6b10bebd360f6c437a07790dde9f"  # main
SARATHI_HARDWARE = "2× A100 80GB PCIe (NVLink pairs), tensor parallel 2, Azure NC96ads v4"


@dataclass(frozen=True)
class Source:
    """Where a published figure's numbers come from, and what they were measured on."""

    figure: str
    repo: str
    path: str
    commit: str
    file: str  # its copy under assets/papers/
    model: str
    hardware: str
    note: str = ""

    @property
    def url(self) -> str:
        return f"https://github.com/{self.repo}/blob/{self.commit}/{self.path}"

    @property
    def citation(self) -> str:
        return f"{self.figure}: {self.repo} `{self.path}` @ {self.commit[:10]} · {self.model} on {self.hardware}"


SOURCES = {
    "piggyback": Source(
        "Sarathi-Serve, Table 2", SARATHI_REPO, "osdi-experiments/table-2/results.csv", SARATHI_COMMIT,
        "sarathi_serve_table_2.csv",
        "Yi-34B (01-ai/Yi-34B-200K)", SARATHI_HARDWARE,
    ),
    "chunk_cost": Source(
        "Sarathi-Serve, Figure 9a", SARATHI_REPO, "osdi-experiments/figure-9/chunking-overhead.csv", SARATHI_COMMIT,
        "sarathi_serve_figure_9a.csv",
        "Yi-34B (01-ai/Yi-34B-200K)", SARATHI_HARDWARE, "the whole prefill is chunk size 16,384",
    ),
    "knee": Source(
        "Sarathi-Serve, Figure 2 (prefill)", SARATHI_REPO, "osdi-experiments/figure-2/prefill.csv", SARATHI_COMMIT,
        "sarathi_serve_figure_2_prefill.csv",
        "Yi-34B (01-ai/Yi-34B-200K)", SARATHI_HARDWARE, "batch_execution_time in seconds",
    ),
    "interference": Source(
        "DistServe, simulator step-time model (colocated vLLM)", DISTSERVE_REPO,
        "simdistserve/estimators/profile_data/profiler-a100-80g.vllm.json",
        DISTSERVE_COMMIT, "distserve_profile_a100_vllm.json", "OPT-13B (facebook/opt-13b), tensor parallel 1",
        "one A100 80GB",
        "the paper's Figure 2 measurements are not in the repository; this is the fitted model its simulator uses "
        "(simdistserve/estimators/time_estimator.py): prefill a + bN + cN² ms, decode a + b·tokens + c·batch ms",
    ),
}


def _rows(name: str) -> list[dict[str, str]]:
    with open(PAPERS_DIR / SOURCES[name].file, newline="", encoding="utf-8") as file:
        return list(csv.DictReader(file))


def piggyback_rows() -> list[dict]:
    """Table 2's three batches: prefill and decode tokens, batch time (ms) and time per token (ms)."""
    return [
        {
            "prefill_tokens": int(row["batch_num_prefill_tokens"]),
            "decode_tokens": int(row["batch_num_decode_tokens"]),
            "batch_ms": float(row["batch_execution_time"]), "per_token_ms": float(row["per_token_time"]),
        }
        for row in _rows("piggyback")
    ]


def piggyback_ratio() -> float:
    """Table 2: a decode-only batch's time per token over the mixed batch's (their headline factor)."""
    rows = piggyback_rows()
    decode_only = next(r for r in rows if r["prefill_tokens"] == 0)
    mixed = next(r for r in rows if r["prefill_tokens"] and r["decode_tokens"])
    return decode_only["per_token_ms"] / mixed["per_token_ms"]


def chunk_cost_rows() -> list[dict]:
    """Figure 9a: prefill length, chunk size, time (ms) and time relative to the whole prefill."""
    return [
        {
            "prefill_tokens": int(row["prefill_length"]), "chunk_size": int(row["chunk_size"]),
            "prefill_ms": float(row["prefill_execution_time"]),
            "relative": float(row["prefill_execution_time_relative"]),
        }
        for row in _rows("chunk_cost")
    ]


def knee_rows() -> list[dict]:
    """Figure 2 (prefill): prompt length, batch time (ms) and time per token (ms)."""
    return [
        {
            "prefill_tokens": int(row["batch_num_prefill_tokens"]),
            "batch_ms": 1000 * float(row["batch_execution_time"]),
            "per_token_ms": float(row["operation_time_per_token"]),
        }
        for row in _rows("knee")
    ]


def distserve_interference(
    prompt_tokens: list[int], decode_batch: int, context_tokens: int, model: str = "facebook/opt-13b", tp: str = "1"
) -> list[dict]:
    """DistServe's fitted model of a colocated engine: a decode-only step of ``decode_batch`` users
    against the step that prefills a prompt of N tokens, which the decoding users wait for, in ms
    and as a ratio. The formulas are the simulator's (``get_prefill_time``: a + b·N + c·N² plus its
    1 ms pipeline constant; ``get_decode_time``: a + b·Σ(context + 1) + c·batch)."""
    profile = json.loads((PAPERS_DIR / SOURCES["interference"].file).read_text(encoding="utf-8"))[model][tp]
    a, b, c = profile["prefill"]
    d_a, d_b, d_c = profile[
        "decoding_smallbs" if decode_batch < profile["decoding_large_small_bs_threshold"] else "decoding_largebs"
    ]
    decode_ms = d_a + d_b * decode_batch * (context_tokens + 1) + d_c * decode_batch
    rows = []
    for n in prompt_tokens:
        mixed_ms = a + b * n + c * n**2 + 1.0
        rows.append({
            "prompt_tokens": n, "decode_step_ms": decode_ms, "step_with_prefill_ms": mixed_ms,
            "ratio": mixed_ms / decode_ms,
        })
    return rows
