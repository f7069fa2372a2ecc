"""The three experiments a probe runs on a server, each from outside, each on its own requests.

* ``ttft_sweep``: time to first token against prompt length N (streaming, ``max_tokens=1``),
  unique prompts so no prefix cache helps, several runs per N taken in turn across the sizes.
* ``prefix_check``: one long prefix sent twice with different suffixes: a miss, then a hit.
* ``interference``: a few streams already generating when a long prompt arrives; their
  inter-token gaps before and during its prefill, and its time to first token.

Times are this machine's clock (``time.perf_counter``), so they include the network, which a
probe on the same host as the server keeps small.
"""

from __future__ import annotations

import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from prefillviz.machine.progress import ProgressCounter
from prefillviz.probe.client import ProbeError, ServerClient, StreamedCompletion
from prefillviz.probe.prompts import PromptMaker

SUFFIX_TOKENS = 16
STREAM_PROMPT_TOKENS = 32
TOKENS_BEFORE_ARRIVAL = 8  # each stream's tokens (7 gaps) before the long prompt is sent
STREAM_WAIT_S = 120.0


@dataclass
class TTFTPoint:
    target_tokens: int
    num_tokens: int  # the server's own count (median over the runs), or the target when it reports none
    ttft_s_median: float
    runs: list[float]

    def to_json(self) -> dict:
        return {
            "num_tokens": self.num_tokens, "ttft_s_median": self.ttft_s_median, "runs": self.runs,
            "target_tokens": self.target_tokens,
        }


def _first_token_s(answer: StreamedCompletion, what: str) -> float:
    if answer.time_to_first_token_s is None:
        raise ProbeError(f"The server streamed no token for {what} (finish reason {answer.finish_reason!r}).")
    return answer.time_to_first_token_s


def ttft_sweep(
    client: ServerClient, model: str, maker: PromptMaker, sizes: list[int], runs: int, counter: ProgressCounter
) -> list[TTFTPoint]:
    """Time to first token at each size, ``runs`` times each (round-robin over the sizes)."""
    times: dict[int, list[float]] = {n: [] for n in sizes}
    counts: dict[int, list[int]] = {n: [] for n in sizes}
    for run in range(runs):
        for n in sizes:
            counter.advance(f"Time to first token: N ≈ {n}, run {run + 1} of {runs}", units=0)
            answer = client.stream_completion(model, maker.prompt(n), 1, n)
            times[n].append(_first_token_s(answer, f"a {n}-token prompt"))
            counts[n].append(answer.prompt_tokens if answer.prompt_tokens is not None else n)
            counter.advance(f"Time to first token: N ≈ {n}, run {run + 1} of {runs}")
    return [TTFTPoint(n, int(statistics.median(counts[n])), statistics.median(times[n]), times[n]) for n in sizes]


@dataclass
class PrefixResult:
    prefix_tokens: int
    miss_runs_s: list[float]
    hit_runs_s: list[float]
    cached_tokens_reported: int | None  # the server's usage.prompt_tokens_details.cached_tokens on the hits (median)
    prompt_tokens: int | None

    @property
    def miss_ttft_s(self) -> float:
        return statistics.median(self.miss_runs_s)

    @property
    def hit_ttft_s(self) -> float:
        return statistics.median(self.hit_runs_s)

    @property
    def speedup(self) -> float:
        return self.miss_ttft_s / self.hit_ttft_s


def prefix_check(
    client: ServerClient, model: str, maker: PromptMaker, prefix_tokens: int, runs: int, counter: ProgressCounter
) -> PrefixResult:
    """Per run: a new prefix with one suffix (a miss), then the same prefix with another (a hit)."""
    misses, hits, cached, prompt_tokens = [], [], [], []
    for run in range(runs):
        prefix = maker.prompt(prefix_tokens)
        total = prefix_tokens + SUFFIX_TOKENS
        counter.advance(f"Prefix cache: miss, run {run + 1} of {runs}", units=0)
        miss = client.stream_completion(model, prefix + maker.suffix(SUFFIX_TOKENS), 1, total)
        counter.advance(f"Prefix cache: hit, run {run + 1} of {runs}")
        hit = client.stream_completion(model, prefix + maker.suffix(SUFFIX_TOKENS), 1, total)
        counter.advance(f"Prefix cache: run {run + 1} of {runs} done")
        misses.append(_first_token_s(miss, "the prefix's first request"))
        hits.append(_first_token_s(hit, "the prefix's second request"))
        if hit.cached_tokens is not None:
            cached.append(hit.cached_tokens)
        if hit.prompt_tokens is not None:
            prompt_tokens.append(hit.prompt_tokens)
    return PrefixResult(
        prefix_tokens, misses, hits,
        int(statistics.median(cached)) if cached else None,
        int(statistics.median(prompt_tokens)) if prompt_tokens else None,
    )


@dataclass
class InterferenceResult:
    """Streams decoding while a long prompt arrives; times in seconds from the first stream's send."""

    stream_token_times_s: list[list[float]]
    long_sent_s: float
    long_first_token_s: float
    long_prompt_tokens: int
    streams_outlived_long_prompt: bool  # every stream was still generating after the long prompt's first token

    @property
    def ttft_long_s(self) -> float:
        return self.long_first_token_s - self.long_sent_s

    def gaps(self) -> list[tuple[int, float, float]]:
        """Every inter-token gap: (stream, its end time s, its length s)."""
        return [(i, b, b - a) for i, times in enumerate(self.stream_token_times_s) for a, b in zip(times, times[1:])]

    def itl_max_ms(self, during: bool) -> float:
        """The longest gap that ended before the long prompt was sent, or that overlapped its prefill."""
        chosen = []
        for _index, end, length in self.gaps():
            start = end - length
            overlaps = end > self.long_sent_s and start < self.long_first_token_s
            if (during and overlaps) or (not during and end <= self.long_sent_s):
                chosen.append(length)
        return max(chosen) * 1e3 if chosen else float("nan")


def interference(
    client: ServerClient, model: str, maker: PromptMaker, long_tokens: int, num_streams: int, max_stream_tokens: int,
    counter: ProgressCounter,
) -> InterferenceResult:
    """``num_streams`` generations run; once each has ``TOKENS_BEFORE_ARRIVAL`` tokens the long
    prompt is sent; the streams are closed a little after its first token comes back."""
    started = [StreamedCompletion(sent_s=0.0) for _ in range(num_streams)]
    stop_after = [float("inf")]  # set once the long prompt's first token is back
    lock = threading.Lock()

    def stream(index: int) -> StreamedCompletion:
        def stop_when(so_far: StreamedCompletion) -> bool:
            with lock:
                started[index] = so_far
            return so_far.token_times_s[-1] > stop_after[0] if so_far.token_times_s else False
        return client.stream_completion(
            model, maker.prompt(STREAM_PROMPT_TOKENS), max_stream_tokens, STREAM_PROMPT_TOKENS, stop_when
        )

    counter.advance(f"Interference: starting {num_streams} streams", units=0)
    with ThreadPoolExecutor(num_streams) as pool:
        futures = [pool.submit(stream, i) for i in range(num_streams)]
        try:
            deadline = time.monotonic() + STREAM_WAIT_S
            while True:
                with lock:
                    ready = all(len(s.token_times_s) >= TOKENS_BEFORE_ARRIVAL for s in started)
                if ready:
                    break
                if any(f.done() for f in futures):
                    [f.result() for f in futures if f.done()]  # raises the stream's error, if any
                    raise ProbeError("A stream ended before the long prompt arrived: raise the streams' token count.")
                if time.monotonic() > deadline:
                    raise ProbeError(
                        f"The streams did not reach {TOKENS_BEFORE_ARRIVAL} tokens within {STREAM_WAIT_S:.0f} s."
                    )
                time.sleep(0.005)
            counter.advance(f"Interference: a {long_tokens}-token prompt arrives")
            long = client.stream_completion(model, maker.prompt(long_tokens), 1, long_tokens)
            first = long.token_times_s[0] if long.token_times_s else None
            if first is None:
                raise ProbeError("The server streamed no token for the long prompt.")
            with lock:
                gaps = [b - a for s in started for a, b in zip(s.token_times_s, s.token_times_s[1:])]
            stop_after[0] = first + max(0.25, 4 * (statistics.median(gaps) if gaps else 0.05))
            results = [f.result(timeout=client.request_deadline_s) for f in futures]
        finally:
            stop_after[0] = -1.0  # every stream stops at its next token, whatever happened
    counter.advance("Interference: done")
    origin = min(r.sent_s for r in results)
    return InterferenceResult(
        stream_token_times_s=[[t - origin for t in r.token_times_s] for r in results],
        long_sent_s=long.sent_s - origin, long_first_token_s=first - origin,
        long_prompt_tokens=long.prompt_tokens if long.prompt_tokens is not None else long_tokens,
        streams_outlived_long_prompt=all(r.stopped_early for r in results),
    )
