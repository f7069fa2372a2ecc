"""Block-sparse prefill against dense on the real model: what it skips, what it costs in quality, what it saves.

For one prompt of N tokens (``long_text``: real prose) and one keep fraction, dense and sparse on the same
backend, so the ratio is the method's alone: the measured one (dense: the dispatch's choice; sparse: the
faster of v8 block-sparse and the textbook's, ``backends/sparse.py``), or the textbook's torch ops:

    quality   first-token KL(dense || sparse), top-1 agreement, and how many of the next 32 greedy
              tokens agree (up to the first difference), each against the dense run as the oracle; and
              the first token's KL and top-1 agreement on the next ``QUALITY_PROMPTS`` - 1 stretches of
              N tokens of the book too (one prompt's top two can lie within a rounding step of each other)
    speed     the attention's seconds (``op_timing``) and the time to first token, dense and sparse,
              medians over ``runs`` alternating runs after one untimed run of each
    work      the share of attention FLOPs skipped (causal (query, key) pairs not computed) and of
              tiles kept; the scoring's own cost, ~1/stride of QK^T, is reported beside them
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from prefillviz.backends.measured import MeasuredBackend
from prefillviz.backends.sparse import BlockSparseBackend
from prefillviz.engine.backend import TorchBackend
from prefillviz.engine.request import SamplingParams
from prefillviz.engine.sparse_attention import SPARSE_BLOCK_SIZE, block_sparse_backend
from prefillviz.experiments.long_text import LONG_TEXT_NAME, long_prompts
from prefillviz.experiments.model_setup import device_and_dtype, model_tokenizer_and_id
from prefillviz.experiments.one_request import one_request_engine
from prefillviz.experiments.op_timing import TimedBackend
from prefillviz.experiments.sparse_work import (
    attention_flops_kept_fraction,
    scoring_flops_fraction,
    tiles_kept_fraction,
)
from prefillviz.machine.progress import FractionProgress, ProgressCounter

DEFAULT_KEEP_FRACTION = 0.2
GREEDY_TOKENS = 32
TRADE_OFF_KEEPS = (1.0, 0.5, 0.3, 0.2, 0.1)
BACKENDS = ("measured", "torch")
QUALITY_PROMPTS = 4  # prompts the first token's agreement is counted over: the book's first stretches of N tokens


def backend_for(name: str, keep_fraction: float | None):
    """The backend ``name`` ("measured" or "torch", the textbook's), dense (None) or block-sparse at the keep
    fraction."""
    if name == "torch":
        return block_sparse_backend(keep_fraction) if keep_fraction is not None else TorchBackend()
    return BlockSparseBackend(keep_fraction) if keep_fraction is not None else MeasuredBackend()


def backend_label(model, name: str, keep_fraction: float) -> str:
    """What ran dense and sparse, for the figures' ``backend``."""
    if name == "torch":
        return "torch (the textbook ops), dense and sparse alike"
    choice = backend_for(name, keep_fraction).choice_for(model)
    return f"measured: dense the dispatch's choice per step, sparse {choice.kernel} ({choice.why})"


@dataclass
class PrefillRun:
    """One prefill (and its greedy continuation when asked): what it computed and how long it took."""

    first_token_logits: np.ndarray  # (V,) fp32
    output_token_ids: list[int]
    attention_s: float
    linears_s: float
    ttft_s: float


def run_prefill(model, token_ids: list[int], keep_fraction: float | None, new_tokens: int = 1,
                backend: TimedBackend | None = None, backend_name: str = "torch") -> PrefillRun:
    """One request of ``token_ids`` on a fresh engine (prefix cache off), dense (None) or block-sparse, on
    ``backend`` or else the one ``backend_name`` names (timed by op)."""
    backend = backend or TimedBackend(backend_for(backend_name, keep_fraction))
    engine = one_request_engine(model, None, len(token_ids), len(token_ids) + new_tokens, backend=backend)
    request = engine.add_request(token_ids, SamplingParams(max_new_tokens=new_tokens), request_id="prompt")
    times = backend.reset()
    engine.step()  # the prefill: its first token
    prefill_attention_s, prefill_linears_s = times.total("attention"), times.total("linears")
    while engine.has_unfinished_requests():
        engine.step()
    return PrefillRun(request.first_token_logits.float().numpy(), list(request.output_token_ids), prefill_attention_s,
                      prefill_linears_s, float(request.time_to_first_token_s))


def first_token_kl(dense_logits: np.ndarray, sparse_logits: np.ndarray) -> float:
    """KL(dense || sparse) of the two first-token distributions, in nats (fp64)."""
    log_p = dense_logits.astype(np.float64) - np.logaddexp.reduce(dense_logits.astype(np.float64))
    log_q = sparse_logits.astype(np.float64) - np.logaddexp.reduce(sparse_logits.astype(np.float64))
    return max(0.0, float(np.sum(np.exp(log_p) * (log_p - log_q))))


def greedy_agreement(dense_ids: list[int], sparse_ids: list[int]) -> int:
    """How many leading greedy tokens agree (after a difference the two continue from other text)."""
    agree = 0
    for a, b in zip(dense_ids, sparse_ids):
        if a != b:
            break
        agree += 1
    return agree


@dataclass
class SparseComparison:
    """Dense against block-sparse prefill at one N and keep fraction (``as_json``: the CLI's keys)."""

    model_id: str
    device: str
    dtype: str
    num_tokens: int
    keep_fraction: float
    block_size: int
    attention_flops_skipped_fraction: float
    tiles_kept_fraction: float
    scoring_flops_fraction: float
    first_token_kl: float
    top1_agree: bool
    greedy_agree_32: int
    dense_attention_s: float
    sparse_attention_s: float
    dense_ttft_s: float
    sparse_ttft_s: float
    backend: str
    runs: int
    prompt_text: str
    top1_agree_prompts: int = 0  # of quality_prompts, the first one's top1_agree among them
    quality_prompts: int = 1
    first_token_kl_prompts: list[float] = field(default_factory=list)

    @property
    def attention_speedup(self) -> float:
        return self.dense_attention_s / self.sparse_attention_s

    @property
    def ttft_speedup(self) -> float:
        return self.dense_ttft_s / self.sparse_ttft_s

    @property
    def attention_share(self) -> float:
        """Attention's share of the dense time to first token."""
        return self.dense_attention_s / self.dense_ttft_s

    @property
    def amdahl_cap(self) -> float:
        """The end-to-end speedup if attention took no time at all: 1 / (1 - its share)."""
        return 1.0 / max(1e-12, 1.0 - self.attention_share)

    @property
    def amdahl_skip_cap(self) -> float:
        """The end-to-end speedup if the skipped share of attention's FLOPs took no time and the rest of the
        prefill its dense time: 1 / (1 - attention's share x the share skipped), Amdahl's law for this skip."""
        return 1.0 / max(1e-12, 1.0 - self.attention_share * self.attention_flops_skipped_fraction)

    @property
    def amdahl_prediction(self) -> float:
        """The end-to-end speedup Amdahl's law predicts from the attention's measured speedup alone."""
        return 1.0 / (1.0 - self.attention_share + self.attention_share / self.attention_speedup)

    def as_json(self) -> dict:
        return {**asdict(self), "attention_speedup": self.attention_speedup, "ttft_speedup": self.ttft_speedup,
                "attention_share_of_ttft": self.attention_share, "amdahl_cap": self.amdahl_cap,
                "amdahl_prediction": self.amdahl_prediction}


def compare_dense_sparse(loaded_or_pair: Any, num_tokens: int,
                         keep_fractions: tuple[float, ...] = (DEFAULT_KEEP_FRACTION,), runs: int = 3,
                         progress: FractionProgress | None = None, backend: str = "measured") -> list[SparseComparison]:
    """Dense against each keep fraction on the same prompt and backend (``BACKENDS``).

    The dense run and each sparse run first generate ``GREEDY_TOKENS`` greedy tokens (untimed: they
    warm up the shapes too), and prefill the other quality prompts; then ``runs`` prefills of each,
    alternating, are timed.
    """
    model, tokenizer, model_id = model_tokenizer_and_id(loaded_or_pair)
    prompts = long_prompts(tokenizer, num_tokens, QUALITY_PROMPTS)
    token_ids = prompts[0]
    counter = ProgressCounter(progress, (1 + len(keep_fractions)) * (1 + runs))
    dense = run_prefill(model, token_ids, None, GREEDY_TOKENS, backend_name=backend)
    dense_logits = [dense.first_token_logits] + [run_prefill(model, ids, None, backend_name=backend).first_token_logits
                                                 for ids in prompts[1:]]
    counter.advance(f"dense N={num_tokens}: {GREEDY_TOKENS} greedy tokens, {len(prompts)} prompts")
    results = []
    for keep in keep_fractions:
        sparse = run_prefill(model, token_ids, keep, GREEDY_TOKENS, backend_name=backend)
        sparse_logits = [sparse.first_token_logits] + [
            run_prefill(model, ids, keep, backend_name=backend).first_token_logits for ids in prompts[1:]]
        counter.advance(f"keep {keep:g}: {GREEDY_TOKENS} greedy tokens, {len(prompts)} prompts")
        timed: dict[str, list[PrefillRun]] = {"dense": [], "sparse": []}
        for run in range(runs):
            timed["dense"].append(run_prefill(model, token_ids, None, backend_name=backend))
            timed["sparse"].append(run_prefill(model, token_ids, keep, backend_name=backend))
            counter.advance(f"keep {keep:g}: timed run {run + 1} of {runs}, dense and sparse")
        median = {way: {key: statistics.median(getattr(r, key) for r in rs) for key in ("attention_s", "ttft_s")}
                  for way, rs in timed.items()}
        results.append(SparseComparison(
            model_id, *device_and_dtype(model), num_tokens, keep, SPARSE_BLOCK_SIZE,
            1.0 - attention_flops_kept_fraction(num_tokens, keep), tiles_kept_fraction(num_tokens, keep),
            scoring_flops_fraction(), first_token_kl(dense.first_token_logits, sparse.first_token_logits),
            int(np.argmax(dense.first_token_logits)) == int(np.argmax(sparse.first_token_logits)),
            greedy_agreement(dense.output_token_ids, sparse.output_token_ids),
            median["dense"]["attention_s"], median["sparse"]["attention_s"], median["dense"]["ttft_s"],
            median["sparse"]["ttft_s"], backend_label(model, backend, keep), runs, LONG_TEXT_NAME,
            sum(int(np.argmax(d)) == int(np.argmax(s)) for d, s in zip(dense_logits, sparse_logits)), len(prompts),
            [first_token_kl(d, s) for d, s in zip(dense_logits, sparse_logits)],
        ))
    return results
