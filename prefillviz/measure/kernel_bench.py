"""The attention-kernel benchmark: time and peak memory vs N for every kernel in ``prefillviz/kernels/``.

Both families run on random q/k/v of one model's attention shape (H, KVH, D), on one device
and dtype; each kernel is checked against its family's naive oracle before it is timed:

    dense  ``prefillviz/kernels/attention.py``, one causal prompt of N tokens: v1 naive, v2 sdpa,
           v3 blocked
    paged  ``prefillviz/kernels/paged_attention.py``, two engine steps at each N:
             prefill  one fresh prompt of N tokens
             mixed    a chunked-prefill step: a chunk of 128 new tokens after N - 128
                      cached, packed with 4 decodes whose requests hold N tokens each
           v1 naive, v2 loop (the textbook backend's), v3 packed, v4 flex (if compiled FlexAttention
           runs here), v5 triton (on CUDA only), v6 loop with fp32 decodes,
           v7 compiled and v7 tiles (the engine's own kernel on a CPU in its two layouts, where its
           C++ ops are built)

A kernel that cannot run (v1's whole (H, N, N) score matrix over the memory cap, no
FlexAttention, no GPU for Triton, no C++ ops built) is listed in ``skipped`` with the reason, never dropped
silently. ``python -m prefillviz kernels`` prints the result as JSON; the Kernel timings page
draws the same rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from prefillviz.backends.ops.paged_check import KernelCheckError
from prefillviz.engine.errors import ConfigError
from prefillviz.kernels import attention as dense
from prefillviz.kernels import paged_attention as paged
from prefillviz.kernels.harness import KernelResult
from prefillviz.machine.devices import dtype_name, machine_name
from prefillviz.machine.progress import FractionProgress
from prefillviz.measure.kernel_trials import first_line, recompile_limit, trial_launch

BENCH_SIZES = (128, 256, 512, 1024, 2048, 4096, 8192)
SHAPES = {  # name: (query heads, KV heads, head dim) of a model's attention
    "smollm2-135m": (9, 3, 64),  # the bundled model
    "llama-3.2-1b": (32, 8, 64),
}
SHAPE_CONTEXTS = {"smollm2-135m": 8192, "llama-3.2-1b": 131072}  # name: the model's context (max_position_embeddings)
MIXED_CHUNK, MIXED_DECODES = 128, 4
NAIVE_MAX_SCORE_BYTES = {"cpu": 3 * 2**30, "cuda": 24 * 2**30}
"""v1 is timed with its whole (H, N, N) fp32-sized score matrix only up to this size."""


@dataclass
class KernelBenchmark:
    """Every kernel at every N: results, what was skipped and why, and where it ran."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    device: str
    dtype: str
    sizes: list[int]
    results: list[KernelResult] = field(default_factory=list)
    points: list[tuple[str, int]] = field(default_factory=list)  # (family, N) of each result
    skipped: list[dict] = field(default_factory=list)  # kernel, family, workload, N, reason

    def add(self, family: str, n: int, result: KernelResult) -> None:
        self.results.append(result)
        self.points.append((family, n))

    def skip(self, kernel: str, family: str, workload: str, n: int | None, reason: str) -> None:
        self.skipped.append({"kernel": kernel, "family": family, "workload": workload, "N": n, "reason": reason})

    def rows(self) -> list[dict]:
        """One table row per result: family, N (the benchmark's size), then ``kernel_rows``'s
        columns (there ``N`` is renamed ``queries``: a mixed step has fewer queries than N)."""
        rows = []
        for (family, n), row in zip(self.points, kernel_rows(self.results)):
            row["queries"] = row.pop("N")
            rows.append({"family": family, "workload": row.pop("workload"), "N": n, **row})
        return rows

    def summary(self) -> dict:
        """Median ms of every kernel per (family, workload, N), and v3 packed over v2 loop."""
        table: dict[str, dict] = {}
        for row in self.rows():
            table.setdefault(f"{row['family']} {row['workload']} N={row['N']}", {})[row["kernel"]] = row["median_ms"]
        ratios = {
            point: times["v3 packed"] / times["v2 loop"]
            for point, times in table.items() if {"v2 loop", "v3 packed"} <= times.keys()
        }
        return {"median_ms": table, "packed_over_loop": ratios}


def kernel_rows(results: list[KernelResult]) -> list[dict]:
    """Kernel results as table rows in ms and MiB."""
    return [
        {
            "kernel": r.kernel,
            "version": r.version,
            "workload": r.workload,
            "N": r.num_tokens,
            "context_tokens": r.context_tokens,
            "heads": f"{r.num_heads} q / {r.num_kv_heads} kv",
            "head_dim": r.head_dim,
            "dtype": r.dtype,
            "device": r.device,
            "median_ms": r.timing.median_s * 1e3,
            "min_ms": r.timing.min_s * 1e3,
            "max_ms": r.timing.max_s * 1e3,
            "runs": r.timing.num_runs,
            "calls_per_run": r.timing.calls_per_run,
            "max_abs_diff_vs_v1": r.max_abs_diff,
            "allowed_diff": r.allowed_diff,
            "peak_memory_MiB": None if r.peak_memory_bytes is None else r.peak_memory_bytes / 2**20,
            "memory_method": r.memory_method,
            "largest_intermediate_MiB": (None if r.largest_intermediate_bytes is None
                                         else r.largest_intermediate_bytes / 2**20),
            "output_MiB": r.output_bytes / 2**20,
        }
        for r in results
    ]


def mixed_requests(n: int) -> list[tuple[int, int]]:
    """The ``mixed`` step at N: (cached, new) per request."""
    chunk = min(MIXED_CHUNK, n)
    return [(n - chunk, chunk)] + [(n - 1, 1)] * MIXED_DECODES


def naive_fits(num_heads: int, n: int, device: str) -> tuple[bool, str]:
    """Whether v1's whole (H, N, N) score matrix, counted in fp32, is under the cap on ``device``."""
    cap = NAIVE_MAX_SCORE_BYTES.get(torch.device(device).type, NAIVE_MAX_SCORE_BYTES["cpu"])
    need = num_heads * n * n * 4
    if need <= cap:
        return True, ""
    return False, (f"its (H, N, N) scores would take {need / 2**30:.1f} GiB "
                   f"(cap {cap / 2**30:.0f} GiB on {torch.device(device).type})")


def device_memory_bytes(device: torch.device | str) -> int:
    """All the memory of ``device``: a GPU's own, else the machine's RAM (psutil)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    import psutil

    return psutil.virtual_memory().total


def check_sizes(shape_name: str, sizes: list[int], device: torch.device | str) -> None:
    """Raise ``ConfigError``, before any kernel runs, for an N past the shape's model context, or one
    whose (H, N, N) fp32 score matrix, v1's, would not fit in the device's memory at all. That is the
    cap on N: past it v1 can't exist, and the row-blocked oracle every kernel is checked against
    still does O(H N^2) work per check (below it, v1 is only skipped over ``NAIVE_MAX_SCORE_BYTES``)."""
    num_heads = SHAPES[shape_name][0]
    memory = device_memory_bytes(device)
    largest = math.isqrt(memory // (num_heads * 4))  # the largest N whose (H, N, N) fp32 scores fit
    context = SHAPE_CONTEXTS.get(shape_name)
    for n in sizes:
        if context is not None and n > context and context <= largest:
            raise ConfigError(f"N = {n:,} is past {shape_name}'s context of {context:,} tokens; "
                              f"use N of {context:,} or less.")
        if n > largest:
            raise ConfigError(
                f"N = {n:,} needs {num_heads * n * n * 4 / 2**30:,.1f} GiB for v1's (H, N, N) fp32 scores "
                f"(H = {num_heads}), more than this {'GPU' if torch.device(device).type == 'cuda' else 'machine'}'s "
                f"{memory / 2**30:,.1f} GiB; "
                f"use N of {largest:,} or less."
            )


def _dense_inputs(num_heads, num_kv_heads, head_dim, n, device, dtype, generator):
    shapes = ((num_heads, n, head_dim), (num_kv_heads, n, head_dim), (num_kv_heads, n, head_dim))
    return [torch.randn(*shape, generator=generator).to(device=device, dtype=dtype) for shape in shapes]


def run_kernel_benchmark(
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    sizes: tuple[int, ...] | list[int] = BENCH_SIZES,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    families: tuple[str, ...] = ("dense", "paged"),
    include_flex: bool = True,
    runs: int = 3,
    seed: int = 0,
    progress: FractionProgress | None = None,
) -> KernelBenchmark:
    """Check, time and measure every kernel of ``families`` at each N of ``sizes``.

    Raises:
        KernelCheckError: a kernel disagrees with its oracle (nothing after it is timed).
    """
    device = str(torch.device(device))
    report = progress or (lambda fraction, text: None)
    bench = KernelBenchmark(num_heads, num_kv_heads, head_dim, device, dtype_name(dtype), list(sizes))
    generator = torch.Generator().manual_seed(seed)
    scale = head_dim**-0.5
    paged_kernels = [paged.LOOP, paged.PACKED, paged.LOOP_FP32_DECODES]
    for kernel in (paged.FLEX, paged.TRITON, paged.COMPILED, paged.COMPILED_TILES, paged.BRGEMM):
        runnable, reason = kernel.status(device)
        if kernel is paged.FLEX and not include_flex:
            runnable, reason = False, "left out (each new shape compiles for several seconds)"
        if runnable and (refused := kernel.refuses(torch.device(device), dtype, head_dim)):
            runnable, reason = False, refused
        if kernel is paged.TRITON and runnable and torch.device(device).type != "cuda":
            runnable, reason = False, "the Triton interpreter is a correctness check, too slow to time"
        if runnable and kernel in (paged.FLEX, paged.TRITON) and "paged" in families:
            runnable, reason = trial_launch(kernel, num_heads, num_kv_heads, head_dim, device, dtype)
        if runnable:
            paged_kernels.append(kernel)
        elif "paged" in families:
            bench.skip(kernel.name, "paged", "all", None, reason)
    for index, n in enumerate(sizes):
        report(index / max(len(sizes), 1), f"kernel benchmark: N = {n:,}")
        fits, why_not = naive_fits(num_heads, n, device)
        if "dense" in families:
            q, k, v = _dense_inputs(num_heads, num_kv_heads, head_dim, n, device, dtype, generator)
            for kernel in dense.KERNELS:
                if kernel is dense.NAIVE and not fits:
                    bench.skip(kernel.name, "dense", "one prompt", n, why_not)
                    continue
                bench.add("dense", n, dense.check_and_time(kernel, q, k, v, scale, runs=runs))
            del q, k, v
        if "paged" in families:
            for workload, requests in (("prefill", [(0, n)]), ("mixed", mixed_requests(n))):
                inputs = paged.random_step(requests, num_heads, num_kv_heads, head_dim, device=device, dtype=dtype,
                                           seed=seed + n, workload=workload)
                for kernel in [paged.NAIVE, *paged_kernels]:
                    if kernel is paged.NAIVE and not fits:
                        bench.skip(kernel.name, "paged", workload, n, why_not)
                        continue
                    if kernel not in (paged.FLEX, paged.TRITON):
                        bench.add("paged", n, paged.check_paged_and_time(kernel, inputs, runs=runs))
                        continue
                    try:  # a compiled kernel may still fail at a new shape (a compile error, torch.compile's limits)
                        # FlexAttention compiles once per shape: two workloads per N
                        with recompile_limit(2 * len(sizes) + 2):
                            bench.add("paged", n, paged.check_paged_and_time(kernel, inputs, runs=runs))
                    except KernelCheckError:
                        raise
                    except Exception as error:  # noqa: BLE001 -- listed with its reason, the other kernels go on
                        bench.skip(kernel.name, "paged", workload, n, first_line(error))
                del inputs
    report(1.0, "done")
    return bench


def engine_choice(bench: KernelBenchmark) -> dict:
    """What the engine's measured dispatch runs for this shape here, and which rows it is.

    Returns:
        {"measured": whether a table exists for these heads here, "provenance" or "why",
        "by_bucket": {bucket: attention candidate}, "rows": [indexes into ``bench.rows()`` that the engine runs]}.
    """
    from prefillviz.backends.dispatch import ATTENTION
    from prefillviz.backends.dispatch_buckets import bucket_for
    from prefillviz.backends.dispatch_tables import table_for_heads

    table = table_for_heads(bench.num_heads, bench.num_kv_heads, bench.head_dim, bench.device, bench.dtype)
    if table is None:
        return {"measured": False, "why": "the engine's dispatch is not measured for these heads, device and dtype "
                                          "here yet (python -m prefillviz tune)"}
    by_bucket = {bucket: table.choice(bucket, ATTENTION) for bucket in table.timings}
    chosen = []
    for index, row in enumerate(bench.rows()):
        if row["family"] != "paged":
            continue
        bucket = "mixed" if row["workload"] == "mixed" else bucket_for([row["N"]], [0])
        if row["kernel"] == by_bucket.get(bucket):
            chosen.append(index)
    return {"measured": True, "provenance": table.provenance(), "by_bucket": by_bucket, "rows": chosen}


def benchmark_json(bench: KernelBenchmark) -> dict:
    """The benchmark as one JSON-ready object: machine, shape, rows (each paged row says whether it is the
    engine's measured choice there), skipped, summary, and the engine's choice."""
    choice = engine_choice(bench)
    rows = [{**row, "engine_choice": index in choice.get("rows", [])} for index, row in enumerate(bench.rows())]
    return {
        "machine": {
            "name": machine_name(bench.device),
            "device": bench.device,
            "cpu_threads": torch.get_num_threads(),
            "torch": torch.__version__,
        },
        "shape": {"num_heads": bench.num_heads, "num_kv_heads": bench.num_kv_heads, "head_dim": bench.head_dim,
                  "dtype": bench.dtype},
        "sizes": bench.sizes,
        "rows": rows,
        "skipped": bench.skipped,
        "summary": bench.summary(),
        "engine_choice": {k: v for k, v in choice.items() if k != "rows"},
    }


__all__ = [
    "BENCH_SIZES", "SHAPES", "SHAPE_CONTEXTS", "KernelBenchmark", "benchmark_json", "check_sizes", "kernel_rows",
    "mixed_requests", "run_kernel_benchmark",
]
