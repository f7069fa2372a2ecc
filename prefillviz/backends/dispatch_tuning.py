"""Measuring the dispatch table (``dispatch.py``): check every candidate, time the rest, keep the winners.

For one model, device, dtype and thread count:

1. **Which candidates run here.** v7 and v7 tiles need the engine's C++ ops for this CPU and head size;
   v8 needs them, bf16 or fp32, a head size that is a multiple of 64 and oneDNN's brgemm for the dtype here (tried);
   oneDNN's matmul needs Debian's oneDNN and a JIT kernel for the dtype; the brgemm linear needs
   the C++ ops and the same brgemm micro-kernel as v8; the slab linear fp32 and the C++ ops built for
   AVX-512 (its micro-kernel is the engine's own); torch's packed linear needs a CPU whose
   oneDNN packs the dtype. Each says why not (``candidate_statuses``).
2. **Each passes its oracle on this machine** or is out: attention against v1, the naive fp32
   oracle, on a step with a fresh prompt, a chunk after cached context and a decode; the
   linears against an fp32 ``F.linear`` of layer 0's own weights, within a bound derived
   from the dtype's precision (``linear_checks.linear_tolerance``: the linears family's groups, calls and oracle).
3. **Timing**, for each bucket of ``dispatch_buckets.BUCKETS``: one layer's attention on random q/k/v of
   the model's heads, and layer 0's four linears (q|k|v, o, gate|up, down) on its own weights,
   each candidate as the engine calls it (stock: q, k and v each its own ``F.linear``, the outputs
   concatenated, as ``llama_weights`` runs them; gate|up with the SiLU after it, which the brgemm
   and slab linears compute in the same call and the others in ``silu_mul``), under the allocator the engine sets
   (``host_memory``: without it, glibc hands a 2,048-token linear's ~12 MB outputs back between
   calls and some calls fault in fresh pages, 34 against 6 ms a layer in one table here). A race
   keeps it short: every candidate runs once; one over ``RACE_FACTOR`` times the best on that
   call and on a second one is out for that bucket (timed once), the others
   are timed over ``RUNS`` runs, taken in turns (one run of each, then the next), and the
   medians compared: a burst of other work on the machine then slows a run of each candidate
   rather than every run of one (a table measured at 15:33 here had v7 at 7.7 ms a layer for an
   fp32 chunk, 16x its 0.44-0.49 in the next two measurements, and v2 would have run).

Keeping the table (in this process and on disk) and reading it is ``dispatch_tables.py``'s.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import statistics
import time
import weakref
from collections.abc import Callable

import torch

from prefillviz.backends import dispatch, packed_weights
from prefillviz.backends.attention import ENGINE_KERNELS, attend, compiled_attention_status
from prefillviz.backends.dispatch import (
    ATTENTION,
    COMPILED_CANDIDATES,
    LINEARS,
    ONEDNN,
    ROWS_CANDIDATES,
    TORCH_PACKED,
    DispatchTable,
)
from prefillviz.backends.dispatch_buckets import BUCKETS
from prefillviz.backends.host_memory import keep_freed_memory
from prefillviz.backends.linear_checks import check_linears, input_widths, layer_linears, linear_inputs, linear_layer
from prefillviz.backends.ops.brgemm_linear import brgemm_linear_why, slab_linear_why
from prefillviz.backends.ops.engine_ops import brgemm_why, step_meta
from prefillviz.backends.ops.paged_check import KernelCheckError, check_paged, random_step
from prefillviz.engine.kv_cache import cache_shape
from prefillviz.machine.devices import machine_name
from prefillviz.machine.load import MachineLoad
from prefillviz.machine.timers import calls_per_run, run_seconds

RACE_FACTOR = 3.0  # a candidate this much slower than the best on its first two calls is not timed further
RUNS = 5
MIN_RUN_TIME_S = 0.005


# --------------------------------------------------------------------------- the shapes timed
def attention_heads(model: torch.nn.Module) -> tuple[int, int, int]:
    """(query heads, KV heads, head size) from the model's config."""
    _, num_kv_heads, head_dim = cache_shape(model.config)
    return model.config.get_text_config().num_attention_heads, num_kv_heads, head_dim


def model_signature(model: torch.nn.Module) -> str:
    """The shapes the dispatch times: heads, KV heads, head size and the linears' widths (part of a table's key)."""
    heads, kv_heads, head_dim = attention_heads(model)
    config = model.config.get_text_config()
    mlp = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None) or 4 * config.hidden_size
    return f"H{heads}-KVH{kv_heads}-D{head_dim}-hidden{config.hidden_size}-mlp{mlp}"


# --------------------------------------------------------------------------- candidates
def candidate_statuses(model: torch.nn.Module, parameter: torch.Tensor | None = None) -> dict[str, dict[str, str]]:
    """{family: {candidate: '' when it can run here, else why not}} (``parameter``: any of the model's, if at hand)."""
    parameter = next(model.parameters()) if parameter is None else parameter
    device, dtype = parameter.device, parameter.dtype
    head_dim = attention_heads(model)[2]
    on_cpu = device.type == "cpu"
    attention = {name: "" for name in dispatch.ATTENTION_CANDIDATES}
    ops, why = compiled_attention_status(device, dtype, head_dim)
    for name in COMPILED_CANDIDATES:
        attention[name] = "" if ops is not None else why
    attention[dispatch.V8] = brgemm_why(device, dtype, head_dim)
    if not on_cpu:
        attention["v6 loop, fp32 decodes"] = "the same as v2 off a CPU"
    linears = {name: "" for name in dispatch.LINEAR_CANDIDATES}
    packs = (ONEDNN, dispatch.BRGEMM_LINEAR, dispatch.SLAB_LINEAR, TORCH_PACKED)
    if not _has_linears(model):
        linears.update(dict.fromkeys(packs, "the model's layers have no nn.Linear to pack"))
    elif not on_cpu:
        linears.update(dict.fromkeys(packs, "pre-packed weights are a CPU path (oneDNN); "
                                            "on a GPU the matmuls run as they are"))
    elif os.environ.get(packed_weights.FORCE_STOCK_ENV, "").strip() not in ("", "0"):
        linears.update(dict.fromkeys(packs, f"{packed_weights.FORCE_STOCK_ENV} is set: stock linear layers run, "
                                            "as on a CPU that can't pack"))
    else:
        if packed_weights.onednn_linear(dtype) is None:  # through the module, so a test's stand-in CPU applies here too
            linears[ONEDNN] = packed_weights.onednn_runs(dtype)[1] or "oneDNN's matmul does not run this dtype here"
        linears[dispatch.BRGEMM_LINEAR] = next(filter(None, (brgemm_linear_why(device, dtype, width)
                                                             for width in input_widths(model))), "")
        linears[dispatch.SLAB_LINEAR] = slab_linear_why(device, dtype)
        runs, why = packed_weights.cpu_runs_packed_linear(dtype)
        if not runs:
            linears[TORCH_PACKED] = why
    return {ATTENTION: attention, LINEARS: linears}


def _has_linears(model: torch.nn.Module) -> bool:
    """Whether the model has ``nn.Linear`` layers to pack (asked at every step: kept per model)."""
    has = _linears_of.get(model)
    if has is None:
        has = _linears_of[model] = any(type(m) is torch.nn.Linear for m in model.modules())
    return has


_linears_of: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def check_attention(model: torch.nn.Module, candidate: str) -> str:
    """'' when ``candidate`` matches the v1 oracle (fp32) on a mixed step in the model's dtype and heads, else what
    differed."""
    parameter = next(model.parameters())
    heads, kv_heads, head_dim = attention_heads(model)
    inputs = random_step([(0, 37), (40, 9), (23, 1)], heads, kv_heads, head_dim, device=parameter.device,
                         dtype=parameter.dtype, seed=1)
    try:
        check_paged(ENGINE_KERNELS[candidate], inputs)
    except KernelCheckError as error:
        return str(error)
    except RuntimeError as error:
        return ("failed on this CPU "
                f"({str(error).strip().splitlines()[0][:160] if str(error).strip() else type(error).__name__})")
    return ""


class _AttentionCall:
    """One layer's attention of ``inputs`` as the engine's forward calls it: q, k, v as row views of one q|k|v
    tensor."""

    def __init__(self, candidate: str, inputs) -> None:
        self.candidate, self.inputs = candidate, inputs
        q, k, v = (t.transpose(0, 1) for t in (inputs.q, inputs.k_new, inputs.v_new))  # (T, heads, D)
        heads, kv_heads = q.shape[1], k.shape[1]
        rows = torch.cat([q, k, v], dim=1).contiguous()  # (T, H + 2 KVH, D), as the projections leave them
        self.q, self.k, self.v = rows[:, :heads], rows[:, heads : heads + kv_heads], rows[:, heads + kv_heads :]
        self.meta = step_meta(inputs.step) if candidate in ROWS_CANDIDATES else None

    def __call__(self) -> torch.Tensor:
        i = self.inputs
        return attend(self.candidate, self.q, self.k, self.v, i.key_cache, i.value_cache, i.step, i.scale, self.meta)


# --------------------------------------------------------------------------- timing
def _race(calls: dict[str, Callable[[], object]],
          device: torch.device) -> tuple[dict[str, float], list[str], dict[str, float]]:
    """({candidate: median seconds per call}, [candidates dropped after one call], {candidate: slowest run over
    fastest})."""

    first = {}
    for name, call in calls.items():
        call()  # warm-up (packing, primitive creation, the allocator)
        first[name] = run_seconds(call, 1, device)
    # one slow first call (a burst, fresh pages for its outputs) must not drop a candidate
    for name, call in calls.items():
        if first[name] > RACE_FACTOR * min(first.values()):
            first[name] = min(first[name], run_seconds(call, 1, device))
    best = min(first.values())
    kept = {name: call for name, call in calls.items() if first[name] <= RACE_FACTOR * best}
    timings = {name: first[name] for name in calls if name not in kept}
    repeats = {name: calls_per_run(first[name], MIN_RUN_TIME_S) for name in kept}
    per_call = {name: [] for name in kept}
    for _ in range(RUNS):  # in turns: a burst of other work slows one run of each candidate, not all runs of one
        for name, call in kept.items():
            per_call[name].append(run_seconds(call, repeats[name], device) / repeats[name])
    spreads = {}
    for name, values in per_call.items():
        timings[name], spreads[name] = statistics.median(values), max(values) / max(min(values), 1e-12)
    return timings, [name for name in calls if name not in kept], spreads


@torch.inference_mode()
def measure(model: torch.nn.Module, progress: Callable[[float, str], None] | None = None,
            buckets: tuple[str, ...] | None = None, checked: DispatchTable | None = None) -> DispatchTable:
    """Check every candidate here, then time the rest on every bucket (a few seconds on 2 cores).

    Args:
        buckets: time these buckets only (a first start times the first page's, ``complete`` the rest).
        checked: a table of the same model whose candidates' checks stand: nothing is checked again.
    """
    started = time.perf_counter()
    parameter = next(model.parameters())
    device, dtype = parameter.device, parameter.dtype
    # time the candidates under the engine's allocator (its KV cache sets it; `tune` comes first)
    if device.type == "cpu":
        keep_freed_memory()
    heads, kv_heads, head_dim = attention_heads(model)
    statuses = candidate_statuses(model)
    available = fingerprint(statuses)
    groups = layer_linears(model)
    for family, check in ((LINEARS, lambda name: check_linears(groups, name)),
                          (ATTENTION, lambda name: check_attention(model, name))):
        for name, why in list(statuses[family].items()):
            statuses[family][name] = why or (checked.excluded.get(family, {}).get(name, "") if checked else check(name))
    runnable = {family: [n for n, why in s.items() if not why] for family, s in statuses.items()}
    layers = {name: linear_layer(groups, name) for name in runnable[LINEARS]}
    timings, dropped, spreads = {}, {}, {}
    measured_at = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    timed = [bucket for bucket in BUCKETS if buckets is None or bucket.name in buckets]
    with MachineLoad() as load:
        for index, bucket in enumerate(timed):
            if progress:
                progress(index / len(timed), f"timing the candidates on {bucket.what}")
            inputs = random_step(list(bucket.requests), heads, kv_heads, head_dim, device=device, dtype=dtype, seed=2)
            attention_calls = {name: _AttentionCall(name, inputs) for name in runnable[ATTENTION]}
            xs = linear_inputs(groups, bucket.num_tokens)
            linear_calls = {name: (lambda layer=layer: layer(xs)) for name, layer in layers.items()}
            timings[bucket.name], dropped[bucket.name], spreads[bucket.name] = {}, {}, {}
            for family, calls in ((ATTENTION, attention_calls), (LINEARS, linear_calls)):
                (timings[bucket.name][family], dropped[bucket.name][family],
                 spreads[bucket.name][family]) = _race(calls, device)
    excluded = {family: {n: why for n, why in s.items() if why} for family, s in statuses.items()}
    return DispatchTable(
        str(device), str(dtype).removeprefix("torch."), machine_name(device), torch.get_num_threads(),
        model_signature(model), timings, excluded, dropped, measured_at, load.reading.other_cpu_percent,
        time.perf_counter() - started, "measured", available, spreads,
    )


def complete(model: torch.nn.Module, partial: DispatchTable, buckets: tuple[str, ...] | None = None) -> DispatchTable:
    """``partial`` with its missing buckets (or those of ``buckets``) timed now (its candidates' checks stand)."""
    rest = tuple(b.name for b in BUCKETS if b.name not in partial.timings and (buckets is None or b.name in buckets))
    if not rest:
        return partial
    more = measure(model, buckets=rest, checked=partial)
    loads = [p for p in (partial.other_cpu_percent, more.other_cpu_percent) if p is not None]

    def in_order(first: dict, second: dict) -> dict:  # by bucket, in BUCKETS' order (the charts' and tables')
        merged = first | second
        return {b.name: merged[b.name] for b in BUCKETS if b.name in merged}

    return dataclasses.replace(
        partial, timings=in_order(partial.timings, more.timings), dropped=in_order(partial.dropped, more.dropped),
        spreads=in_order(partial.spreads, more.spreads), other_cpu_percent=max(loads, default=None),
        measure_s=(partial.measure_s or 0.0) + (more.measure_s or 0.0),
    )


def fingerprint(statuses: dict) -> str:
    """Which candidates could run (before their checks): a cached table is measured again when this changes (a build,
    a switch)."""
    runnable = sorted(f"{family}:{name}" for family, s in statuses.items() for name, why in s.items() if not why)
    return f"torch {torch.__version__}; " + ", ".join(runnable)
