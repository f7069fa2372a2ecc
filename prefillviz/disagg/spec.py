"""What the two workers are told (``DisaggSpec``, picklable: spawned processes get a copy), and
what each sends back (``WorkerResult``).

Rank 0 is the prefill worker, rank 1 the decode worker. Both load the model themselves, once,
through ``load`` (a picklable callable that returns it), so the parent's model is never shared.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from prefillviz.disagg.kv_transfer import TransferRecord
from prefillviz.engine.errors import PrefillVizError
from prefillviz.engine.trace import Trace
from prefillviz.experiments.chunked import ChunkedWorkload

PREFILL_RANK, DECODE_RANK = 0, 1
ROLES = {PREFILL_RANK: "prefill", DECODE_RANK: "decode"}
FAULTS = ("prefill_killed_mid_transfer", "decode_killed_mid_transfer", "transfer_stalls")


class DisaggError(PrefillVizError):
    """A disaggregated run failed: a worker died, stalled or could not start. Both are stopped."""


@dataclass(frozen=True)
class DisaggTimeouts:
    """Every wait on the other process is bounded by one of these (seconds).

    Attributes:
        start_s: spawn, load the model, warm up, join the process group and its barrier.
        transfer_s: one request's KV header-to-payload, and each send.
        idle_s: a worker waiting for the other side's next request or signal.
        run_s: the whole run, as the parent sees it.
    """

    start_s: float = 180.0
    transfer_s: float = 30.0
    idle_s: float = 120.0
    run_s: float = 900.0


def available_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def threads_per_worker() -> int:
    """The two workers split the cores: each gets half (at least one torch thread)."""
    return max(1, available_cores() // 2)


@dataclass(frozen=True)
class Placement:
    """Where each worker runs and how K/V travels between them."""

    devices: tuple[str, str]  # prefill, decode
    backend: str  # "gloo" or "nccl"

    @property
    def label(self) -> str:
        wire = "NCCL, GPU to GPU" if self.backend == "nccl" else "gloo over TCP on 127.0.0.1"
        if self.backend == "gloo" and self.devices[0].startswith("cuda"):
            wire += ", K/V staged through host memory"
        return f"prefill on {self.devices[0]}, decode on {self.devices[1]}; K/V by {wire}"


def placement_for(device: torch.device) -> Placement:
    """gloo on a CPU; NCCL with a GPU per worker; one GPU shared: gloo through the host
    (NCCL refuses two ranks on one GPU)."""
    if device.type == "cuda" and torch.cuda.device_count() >= 2:
        return Placement(("cuda:0", "cuda:1"), "nccl")
    if device.type in ("cuda", "mps"):
        name = str(device) if device.index is not None or device.type == "mps" else f"{device.type}:0"
        return Placement((name, name), "gloo")
    return Placement(("cpu", "cpu"), "gloo")


def load_model_in_worker(model_id: str, device: str, dtype: str):
    """The app's loader, in a worker (its ``load``): the model only, on ``device``."""
    from prefillviz.loading.models import load_model

    return load_model(model_id, device=device, dtype=dtype).model


def model_loader(model_id: str, dtype: str) -> Callable[[str], object]:
    return functools.partial(load_model_in_worker, model_id, dtype=dtype)


@dataclass(frozen=True)
class DisaggSpec:
    """One disaggregated run of a chunked-prefill workload.

    Attributes:
        load: ``load(device) -> model`` (picklable: a module-level function or a partial of one).
        workload: the Chunked prefill page's workload (token ids).
        port: the process group's TCP store on 127.0.0.1.
        placement: devices and backend.
        num_threads: torch threads per worker.
        timeouts: see ``DisaggTimeouts``.
        fault: None, or one of ``FAULTS`` (the fault tests inject it).
        keep_payloads: send the payloads back to the parent (tests compare them bit for bit).
    """

    load: Callable[[str], object]
    workload: ChunkedWorkload
    port: int
    placement: Placement = Placement(("cpu", "cpu"), "gloo")
    num_threads: int = 1
    timeouts: DisaggTimeouts = DisaggTimeouts()
    fault: str | None = None
    keep_payloads: bool = False

    @property
    def request_ids(self) -> list[str]:
        return self.workload.request_ids

    @property
    def prompts(self) -> list[tuple[int, ...]]:
        return [*self.workload.short_prompts, self.workload.long_prompt]

    def max_new_tokens(self, index: int) -> int:
        return (
            self.workload.long_max_new_tokens if index == len(self.workload.short_prompts)
            else self.workload.short_max_new_tokens
        )


@dataclass
class WorkerResult:
    """What one worker sends back when it is done (times: host perf_counter seconds)."""

    role: str
    trace: Trace  # its own engine's steps and requests
    engine_start_time: float  # when its first step started
    ready_time: float  # model loaded, warmed up, past the barrier
    load_s: float
    num_threads: int
    transfers: list[TransferRecord] = field(default_factory=list)
    # keep_payloads only: raw bytes (uint8), numpy so they pickle by value
    payloads: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class WorkerFailure:
    role: str
    message: str
