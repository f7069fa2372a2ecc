"""Long prompts from the command line: ``sparse`` (block-sparse prefill against dense) and ``wall`` (the
O(N^2) wall), and the bench's part at 4,096 tokens. Each checks its sizes against the model's context
before any run (``cli_checks.check_context_of``), and records how busy the machine was while it measured.
"""

from __future__ import annotations

import os
from typing import Any

from prefillviz.experiments.long_prompt_wall import DEFAULT_TIME_BUDGET_S, run_wall
from prefillviz.experiments.sparse_prefill import DEFAULT_KEEP_FRACTION, GREEDY_TOKENS, compare_dense_sparse
from prefillviz.machine.load import MachineLoad

SPARSE_JSON_KEYS = (
    "attention_flops_skipped_fraction", "tiles_kept_fraction", "first_token_kl", "top1_agree", "greedy_agree_32",
    "dense_attention_s", "sparse_attention_s", "dense_ttft_s", "sparse_ttft_s", "backend",
)
BENCH_SPARSE_TOKENS = 4096


def load_average() -> list[float]:
    """The 1, 5 and 15-minute load averages (``/proc/loadavg``; empty where there is none)."""
    try:
        return [float(x) for x in open("/proc/loadavg").read().split()[:3]]
    except OSError:
        return []


def sparse_figures(loaded: Any, num_tokens: int, keep_fractions: tuple[float, ...], runs: int,
                   progress=None, backend: str = "measured") -> dict:
    """The ``sparse`` command's JSON: one setting's keys (``SPARSE_JSON_KEYS`` first), or ``settings``: one each."""
    load_before = load_average()
    with MachineLoad() as machine:
        results = compare_dense_sparse(loaded, num_tokens, keep_fractions, runs, progress, backend)
    context = {"model": loaded.model_id, "num_tokens": num_tokens, "runs": runs, "load_average_before": load_before,
               "load_average_after": load_average(), "machine_load": machine.reading.as_dict(),
               "cpu_count": os.cpu_count()}
    settings = []
    for result in results:
        figures = result.as_json()
        settings.append({**{key: figures[key] for key in SPARSE_JSON_KEYS}, **figures})
    return {**settings[0], **context} if len(settings) == 1 else {"settings": settings, **context}


def wall_figures(loaded: Any, sizes: list[int], runs: int, time_budget_s: float = DEFAULT_TIME_BUDGET_S,
                 progress=None, backend: str = "measured") -> dict:
    """The ``wall`` command's JSON (``WallResult.as_json``, with the machine's load)."""
    load_before = load_average()
    with MachineLoad() as machine:
        result = run_wall(loaded, sizes, runs, time_budget_s, progress, backend)
    return {**result.as_json(), "load_average_before": load_before, "load_average_after": load_average(),
            "machine_load": machine.reading.as_dict()}


def bench_sparse_part(loaded: Any, quick: bool) -> dict:
    """``sparse_attention_speedup_4096`` and ``sparse_first_token_kl_4096`` at the default keep fraction, dense and
    sparse on the measured backend (``--quick``: 512 tokens, one run; None where the context is too short)."""
    num_tokens = 512 if quick else BENCH_SPARSE_TOKENS
    context = loaded.info.max_context
    if context and num_tokens + GREEDY_TOKENS > context:
        reason = f"{loaded.model_id}'s context ({context:,}) is shorter than {num_tokens:,} + {GREEDY_TOKENS} tokens"
        return {"speedup": None, "kl": None, "details": {"skipped": reason}}
    result = compare_dense_sparse(loaded, num_tokens, (DEFAULT_KEEP_FRACTION,), runs=1 if quick else 3)[0]
    return {"speedup": result.attention_speedup, "kl": result.first_token_kl, "details": result.as_json()}
