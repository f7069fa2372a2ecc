"""Three set-ups on the Chunked prefill page's workload, and what the users felt in each.

    one engine, chunking off   the long prompt runs whole in one step; every decode waits for it
    one engine, chunking on    decodes first, the long prompt in chunks of the budget left
    disaggregated              the long prompt on the prefill worker; the decode worker never runs it

The one-engine runs use every core of this process; the two workers split the cores (one torch
thread each on two cores), so each prefill and each decode step runs on half the machine: the
price of separating them on one box. Outputs are compared token for token with the chunking-off
run, and the K/V each worker held are compared by digest (bit for bit).
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass

import numpy as np
import torch

from prefillviz.disagg.launch import DisaggRun, check_workload, run_disaggregated
from prefillviz.disagg.spec import DisaggTimeouts, available_cores, model_loader, placement_for
from prefillviz.engine.trace import Trace
from prefillviz.experiments.chunked import (
    LONG_REQUEST_ID,
    ChunkedComparison,
    ChunkedWorkload,
    LatencySummary,
    compare_chunking,
    latency_summary,
    short_request_ids,
)
from prefillviz.experiments.outputs import OutputCheck, compare_outputs
from prefillviz.machine.devices import dtype_name
from prefillviz.machine.progress import StepProgress

SETUPS = ("one engine, chunking off", "one engine, chunking on", "disaggregated")
SETUP_KEYS = dict(zip(SETUPS, ("one_engine_chunking_off", "one_engine_chunking_on", "disaggregated")))


def disagg_summary(run: DisaggRun) -> LatencySummary:
    """The users' latencies of a disaggregated run: the decode worker's records hold every token's
    time (the first from the prefill worker, same host clock); steps and total span both workers."""
    decode = run.decode.trace
    summary = latency_summary(decode)
    last = decode.steps[-1]
    end = run.decode.engine_start_time + last.start_time_s + last.wall_time_s
    return dataclasses.replace(
        summary,
        num_steps=run.prefill.trace.num_steps + decode.num_steps,
        total_ms=(end - run.origin) * 1000,
        num_paused_decode_steps=len(paused_on_decode_worker(decode)),
    )


def paused_on_decode_worker(trace: Trace) -> list[int]:
    """Steps of the decode worker that left out a request it had started decoding and had not
    finished (every request there arrives with its first token already sampled)."""
    num_outputs = {rid: len(record.output_token_ids) for rid, record in trace.requests.items()}
    num_tokens = dict.fromkeys(trace.requests, 1)
    started: set[str] = set()
    paused = []
    for step in trace.steps:
        decoding = {rid for rid in started if num_tokens[rid] < num_outputs[rid]}
        if decoding - {chunk.request_id for chunk in step.chunks}:
            paused.append(step.step_index)
        started.update(chunk.request_id for chunk in step.chunks)
        for request_id in step.sampled_token_ids:
            num_tokens[request_id] += 1
    return paused


def itl_after_arrival_ms(trace: Trace, arrival_s: float) -> list[float]:
    """Inter-token gaps (ms) of the short requests that end after ``arrival_s`` (the trace's time axis)."""
    gaps = []
    for request_id in short_request_ids(trace):
        record = trace.requests[request_id]
        t = record.arrival_time_s + record.time_to_first_token_s
        for gap in record.inter_token_times_s:
            t += gap
            if t > arrival_s:
                gaps.append(gap * 1000)
    return gaps


@dataclass
class DisaggComparison:
    workload: ChunkedWorkload
    model_id: str
    device: str
    dtype: str
    kv_bytes_per_token: int
    one_engine: ChunkedComparison
    disagg: DisaggRun
    one_engine_threads: int
    cores: int

    @property
    def traces(self) -> dict[str, Trace]:
        """Each set-up's request records (the disaggregated run's are the decode worker's, complete)."""
        return dict(zip(SETUPS, (self.one_engine.off, self.one_engine.on, self.disagg.decode.trace)))

    @property
    def summaries(self) -> dict[str, LatencySummary]:
        return dict(zip(SETUPS, (self.one_engine.summary_off, self.one_engine.summary_on, disagg_summary(self.disagg))))

    @property
    def output_checks(self) -> list[OutputCheck]:
        return compare_outputs(self.one_engine.off, self.disagg.decode.trace)

    @property
    def outputs_equal(self) -> bool:
        return all(check.identical for check in self.output_checks + self.one_engine.output_checks)

    @property
    def kv_bit_identical(self) -> bool:
        return all(t.bit_identical for t in self.disagg.transfers)

    @property
    def bytes_match_formula(self) -> bool:
        return all(t.num_bytes == self.kv_bytes_per_token * t.num_tokens for t in self.disagg.transfers)

    @property
    def threads_label(self) -> str:
        workers = self.disagg.prefill.num_threads, self.disagg.decode.num_threads
        return (
            f"{self.cores} cores: one engine ran on {self.one_engine_threads} torch thread(s); "
            f"the prefill and decode workers on {workers[0]} and {workers[1]}, each its own process"
        )

    def request_rows(self) -> list[dict]:
        """One row per set-up and request: TTFT and the ITL its user saw (ms)."""
        rows = []
        for setup, trace in self.traces.items():
            for request_id, record in trace.requests.items():
                gaps = [g * 1000 for g in record.inter_token_times_s]
                rows.append({
                    "set-up": setup, "request": request_id, "prompt tokens": record.num_prompt_tokens,
                    "TTFT (ms)": (
                        record.time_to_first_token_s * 1000
                        if record.time_to_first_token_s is not None else float("nan")
                    ),
                    "ITL median (ms)": statistics.median(gaps) if gaps else float("nan"),
                    "ITL max (ms)": max(gaps, default=float("nan")),
                    "tokens": len(record.output_token_ids),
                })
        return rows

    def transfer_rows(self) -> list[dict]:
        return [
            {
                "request": t.request_id, "prompt tokens": t.num_tokens, "bytes sent": t.num_bytes,
                "KV formula x tokens": self.kv_bytes_per_token * t.num_tokens, "transfer (ms)": t.transfer_s * 1000,
                "GB/s": t.num_bytes / t.transfer_s / 1e9, "bit-identical": t.bit_identical,
            }
            for t in self.disagg.transfers
        ]

    def as_json(self) -> dict:
        transfers = self.disagg.transfers
        seconds = [t.transfer_s for t in transfers]
        long = next(t for t in transfers if t.request_id == LONG_REQUEST_ID)
        summaries = self.summaries
        return {
            "model": self.model_id, "device": self.device, "dtype": self.dtype,
            "placement": self.disagg.spec.placement.label, "cores": self.cores,
            "threads": {
                "one_engine": self.one_engine_threads, "prefill_worker": self.disagg.prefill.num_threads,
                "decode_worker": self.disagg.decode.num_threads,
            },
            "outputs_equal": self.outputs_equal, "kv_bit_identical": self.kv_bit_identical,
            "kv_bytes_per_token": self.kv_bytes_per_token, "kv_bytes_sent": sum(t.num_bytes for t in transfers),
            "kv_bytes_sent_per_request": {t.request_id: t.num_bytes for t in transfers},
            "kv_bytes_match_formula": self.bytes_match_formula,
            "transfer_s_median": statistics.median(seconds), "transfer_s_long": long.transfer_s,
            "transfer_gb_s": sum(t.num_bytes for t in transfers) / sum(seconds) / 1e9,
            "transfer_gb_s_long": long.num_bytes / long.transfer_s / 1e9,
            "worker_start_s": self.disagg.start_s,
            "workload": {
                "num_short_requests": len(self.workload.short_prompts),
                "short_prompt_tokens": len(self.workload.short_prompts[0]) if self.workload.short_prompts else 0,
                "short_max_new_tokens": self.workload.short_max_new_tokens,
                "long_prompt_tokens": len(self.workload.long_prompt),
                "long_max_new_tokens": self.workload.long_max_new_tokens, "arrival_step": self.workload.arrival_step,
                "token_budget": self.workload.token_budget,
            },
            "setups": {
                SETUP_KEYS[name]: {
                    "itl_p50_ms": s.itl_p50_ms, "itl_p99_ms": s.itl_p99_ms, "itl_max_ms": s.itl_max_ms,
                    "ttft_long_ms": s.long_ttft_ms,
                    "num_steps": s.num_steps, "total_ms": s.total_ms,
                    "num_paused_decode_steps": s.num_paused_decode_steps,
                }
                for name, s in summaries.items()
            },
        }

    def itl_growth(self) -> float:
        """Disaggregated: the decoding users' worst gap once the long prompt has arrived, over their median gap."""
        trace = self.disagg.decode.trace
        after = itl_after_arrival_ms(trace, trace.requests[LONG_REQUEST_ID].arrival_time_s)
        every = [g * 1000 for rid in short_request_ids(trace) for g in trace.requests[rid].inter_token_times_s]
        return max(after, default=float("nan")) / float(np.median(every))


def compare_setups(
    loaded, workload: ChunkedWorkload, progress: StepProgress | None = None, load=None,
    timeouts: DisaggTimeouts | None = None,
) -> DisaggComparison:
    """One engine with chunking off and on (this process), then the two workers (fresh processes).

    Args:
        loaded: the ``LoadedModel`` the one-engine runs use (its id and dtype tell the workers what to load).
        workload: the Chunked prefill page's workload.
        progress: steps of the one-engine runs.
        load: override what the workers load (tests: a tiny model); default ``loaded``'s id and dtype.
    """
    check_workload(workload)  # before any run: a workload the workers can't take fails at once
    one_engine = compare_chunking(loaded.model, workload, progress, loaded.model_id)
    run = run_disaggregated(
        load or model_loader(loaded.model_id, dtype_name(loaded.dtype)),
        workload, placement_for(loaded.device), timeouts
    )
    return DisaggComparison(
        workload, loaded.model_id, str(loaded.device), dtype_name(loaded.dtype), loaded.info.kv_bytes_per_token,
        one_engine, run, torch.get_num_threads(), available_cores(),
    )
