"""Start the two workers, wait for them with a deadline, and always stop them.

``run_disaggregated`` spawns both processes (``torch.multiprocessing``, spawn start method),
collects what each sends back, and turns every fault into a ``DisaggError`` within a bounded
time: a worker that dies (``ProcessContext.join`` sees its exit code or signal), a worker that
reports its own error (a transfer timed out, a peer's connection closed), or a run past its
deadline. In every case the ``finally`` terminates, then kills, whatever is still alive, so
nothing is left running and the next run starts fresh processes.
"""

from __future__ import annotations

import queue
import signal
import socket
import time
from dataclasses import dataclass

import torch.multiprocessing as mp

from prefillviz.disagg.kv_transfer import TransferRecord
from prefillviz.disagg.spec import (
    DECODE_RANK,
    FAULTS,
    PREFILL_RANK,
    ROLES,
    DisaggError,
    DisaggSpec,
    DisaggTimeouts,
    Placement,
    WorkerFailure,
    WorkerResult,
    threads_per_worker,
)
from prefillviz.engine.errors import RequestError
from prefillviz.experiments.chunked import ChunkedWorkload

STOP_GRACE_S = 5.0  # after SIGTERM, before SIGKILL
OTHER_EXIT_GRACE_S = 2.0  # a worker reports a closed connection: the other may be dying that moment


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the process group's store binds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class DisaggRun:
    """One disaggregated run: both workers' results and the transfers, merged by request."""

    spec: DisaggSpec
    prefill: WorkerResult
    decode: WorkerResult
    spawn_time: float  # perf_counter when the processes were started
    worker_pids: tuple[int, int]

    @property
    def start_s(self) -> float:
        """Spawn to both workers ready (imports, model load, warm-up, process group)."""
        return max(self.prefill.ready_time, self.decode.ready_time) - self.spawn_time

    @property
    def origin(self) -> float:
        """The time axis' zero: the prefill worker's first step."""
        return self.prefill.engine_start_time

    @property
    def transfers(self) -> list[TransferRecord]:
        received = {t.request_id: t for t in self.decode.transfers}
        merged = []
        for sent in self.prefill.transfers:
            got = received.get(sent.request_id)
            merged.append(
                TransferRecord(
                    sent.request_id, sent.num_tokens, sent.num_bytes, sent.send_start_time, sent.send_end_time,
                    got.recv_end_time if got else None, got.written_time if got else None,
                    sent.sent_sha256, got.received_sha256 if got else "",
                )
            )
        return merged


def _collect(results, got: dict[str, WorkerResult], timeout_s: float, processes=()) -> None:
    """Take what the workers sent back; a worker's own failure becomes a DisaggError here
    (saying so when the other worker had been killed first)."""
    deadline = time.perf_counter() + timeout_s
    while True:
        try:
            item = results.get(timeout=max(0.0, deadline - time.perf_counter()))
        except queue.Empty:
            return
        if isinstance(item, WorkerFailure):
            other_rank = DECODE_RANK if item.role == ROLES[PREFILL_RANK] else PREFILL_RANK
            other = processes[other_rank] if len(processes) > other_rank else None
            if other is not None:  # its connection closes as it dies: give its exit a moment to be seen
                other.join(OTHER_EXIT_GRACE_S)
            exit_code = other.exitcode if other is not None else None
            if exit_code is not None and exit_code < 0:  # the other one was killed first: that is the news
                how = f"killed by {signal.Signals(-exit_code).name}"
                raise DisaggError(f"{_died_message(other_rank, how)} (The {item.role} worker saw: {item.message})")
            raise DisaggError(
                f"The {item.role} worker failed: {item.message} "
                f"The {ROLES[other_rank]} worker was stopped; nothing is left running."
            )
        got[item.role] = item
        deadline = time.perf_counter()  # drain what is there, then return


def _died_message(rank: int, how: str) -> str:
    other = ROLES[DECODE_RANK if rank == PREFILL_RANK else PREFILL_RANK]
    return (
        f"The {ROLES[rank]} worker died mid-run ({how}). "
        f"The {other} worker was stopped; nothing is left running. Run again."
    )


def _how_it_exited(error: mp.ProcessExitedException | mp.ProcessRaisedException) -> str:
    if getattr(error, "signal_name", None):
        return f"killed by {error.signal_name}"
    return f"exit code {getattr(error, 'exit_code', '?')}"


def stop_processes(processes) -> None:
    """SIGTERM every live process, wait, then SIGKILL any that remain, and reap them all."""
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join(STOP_GRACE_S)
        if process.is_alive():
            process.kill()
            process.join(STOP_GRACE_S)


def check_workload(workload: ChunkedWorkload) -> None:
    """Disaggregation hands a request over after its first token, so each must ask for two or more."""
    if min(workload.short_max_new_tokens, workload.long_max_new_tokens) < 2:
        raise RequestError(
            "A disaggregated run needs at least 2 new tokens per request: "
            "the prefill worker makes the first, the decode worker the rest."
        )


def run_disaggregated(
    load,
    workload: ChunkedWorkload,
    placement: Placement | None = None,
    timeouts: DisaggTimeouts | None = None,
    num_threads: int | None = None,
    fault: str | None = None,
    keep_payloads: bool = False,
) -> DisaggRun:
    """Run ``workload`` on a prefill worker and a decode worker; see ``DisaggSpec``.

    Raises:
        DisaggError: a worker failed, died or stalled, or the run passed ``timeouts.run_s``.
        RequestError: a workload with a request of fewer than 2 new tokens.
    """
    check_workload(workload)
    if fault is not None and fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r} (known: {', '.join(FAULTS)})")
    spec = DisaggSpec(
        load=load, workload=workload, port=free_port(), placement=placement or Placement(("cpu", "cpu"), "gloo"),
        num_threads=num_threads or threads_per_worker(), timeouts=timeouts or DisaggTimeouts(), fault=fault,
        keep_payloads=keep_payloads,
    )
    from prefillviz.disagg.workers import worker_main

    context = mp.get_context("spawn")
    results, arrival = context.Queue(), context.Event()
    spawn_time = time.perf_counter()
    deadline = spawn_time + spec.timeouts.run_s
    processes = mp.start_processes(
        worker_main, args=(spec, results, arrival), nprocs=2, join=False, start_method="spawn"
    )
    got: dict[str, WorkerResult] = {}
    try:
        while len(got) < 2:
            _collect(results, got, 0.1, processes.processes)
            try:
                all_exited = processes.join(timeout=0.05)
            except (mp.ProcessExitedException, mp.ProcessRaisedException) as error:
                _collect(results, got, 2.0, processes.processes)  # its own message, when it had time to send one
                raise DisaggError(_died_message(error.error_index, _how_it_exited(error))) from None
            if all_exited and len(got) < 2:
                _collect(results, got, 2.0)
                if len(got) < 2:
                    raise DisaggError("Both workers exited but did not send their results back.")
            if time.perf_counter() > deadline:
                raise DisaggError(
                    f"The disaggregated run did not finish within {spec.timeouts.run_s:g} s; both workers were stopped."
                )
        pids = tuple(process.pid for process in processes.processes)
        return DisaggRun(spec, got["prefill"], got["decode"], spawn_time, pids)
    finally:
        stop_processes(processes.processes)
        results.close()
        results.cancel_join_thread()
