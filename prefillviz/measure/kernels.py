"""Where the time of one prefill goes: per layer, per op, over time, against the roofline,
and in the attention kernel itself.

One run of ``run_kernel_timings`` makes five kinds of measurement of the same prompt, each
in its own pass, because each instrument changes what it measures:

Every pass runs the measured backend with the model's own linears (``STOCK_LINEARS``: ``aten::mm``
matmuls, whose FLOPs the profiler counts), so the passes measure the same work:

    warm-up      capture "none": first-call costs out of the way (not shown)
    timing       capture "timing", ``timing_runs`` times: per-layer clocks, median per layer
    profile      capture "profile": torch.profiler op table + Chrome trace (slower: its
                 times include the profiler's own cost)
    inspect      capture "inspect": the post-RoPE q/k/v of one layer, for the kernels
    kernels      prefillviz/kernels/attention.py on those q/k/v, then the kernel benchmark
                 (``kernel_bench.py``: both kernel families on random q/k/v of the model's
                 shape for a sweep of N, each checked against its naive oracle first)

The rows of its tables are ``timing_rows.py``'s (the kernels' own: ``kernel_bench.kernel_rows``);
the figures live in ``prefillviz.figures.kernels``.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace

import torch

from prefillviz.analysis.machine_peaks import MachinePeaks
from prefillviz.analysis.model_shape import ModelShape
from prefillviz.backends.measured import STOCK_LINEARS
from prefillviz.engine.errors import RequestError
from prefillviz.engine.forward import own_forward_status
from prefillviz.engine.request import SamplingParams
from prefillviz.engine.trace import Trace
from prefillviz.experiments.one_request import one_request_engine
from prefillviz.experiments.timing_rows import predicted_vs_measured, timeline_events
from prefillviz.instrument import passes
from prefillviz.instrument.capture import run_captured
from prefillviz.instrument.records import LayerTimes
from prefillviz.kernels.attention import KERNELS, AttentionKernel, check_and_time
from prefillviz.kernels.harness import KernelResult
from prefillviz.loading.models import LoadedModel
from prefillviz.machine.devices import dtype_name
from prefillviz.machine.progress import FractionProgress
from prefillviz.measure.kernel_bench import KernelBenchmark, run_kernel_benchmark
from prefillviz.measure.peaks_history import machine_peaks

CPU_SWEEP_SIZES = (128, 256, 512, 1024)
CUDA_SWEEP_SIZES = (512, 1024, 2048, 4096, 8192)
SWEEP_CHOICES = {"cpu": (64, 128, 256, 512, 1024, 2048, 4096, 8192), "cuda": (256, 512, 1024, 2048, 4096, 8192)}
MAX_ORACLE_SCORE_BYTES = {"cpu": 512 * 2**20, "cuda": 4 * 2**30}
"""On the prompt, v1 is timed with its whole fp32 (H, N, N) score matrix up to this size."""


def max_kernel_tokens(info: ModelShape, device: str | torch.device) -> int:
    """The longest prompt prefix the kernels run on within ``MAX_ORACLE_SCORE_BYTES`` on this device."""
    budget = MAX_ORACLE_SCORE_BYTES.get(torch.device(device).type, MAX_ORACLE_SCORE_BYTES["cpu"])
    return math.isqrt(budget // (info.num_heads * 4))


def default_sweep_sizes(device: str | torch.device) -> tuple[int, ...]:
    """N values for the kernel sweep: short on a CPU, longer on a GPU."""
    return CUDA_SWEEP_SIZES if torch.device(device).type == "cuda" else CPU_SWEEP_SIZES


# ------------------------------------------------------------------------------ result
@dataclass
class KernelTimingsResult:
    """Everything one run of the page measured (plain data: no live modules)."""

    model_id: str
    device: str
    dtype: str
    prompt: str
    num_tokens: int
    timing_traces: list[Trace]  # capture "timing", one per timing run
    layer_times: LayerTimes  # per-layer median over the timing runs
    profile: Trace  # capture "profile"
    timeline: list[dict]  # our record_function scopes, from the Chrome trace
    info: ModelShape  # the model's shape, which the roofline prediction reads
    peaks: MachinePeaks  # the best of this machine's measured peaks when the prediction was made
    predicted: list[dict]  # predicted vs measured, one row per layer, from ``peaks``
    # rows the timing passes' last layer ran attention and what follows for (1: the engine's own forward; None: all)
    last_layer_rows: int | None
    kernel_layer: int
    kernel_num_tokens: int  # the first tokens of the prompt the kernels ran on (all, unless the oracle can't fit)
    kernel_results: list[KernelResult]  # kernels on the captured q/k/v of kernel_layer
    benchmark: KernelBenchmark | None  # both families on random q/k/v of the model's shape, same device and dtype

    @property
    def num_layers(self) -> int:
        return len(self.layer_times.layer_s)


# ------------------------------------------------------------------------------ passes
def prefill_pass(loaded: LoadedModel, prompt: str | list[int], capture_level: str,
                 profile_dir: str | None = None) -> Trace:
    """One parallel prefill (one step, first token only) at ``capture_level``.

    Raises:
        RequestError: empty prompt, or too long for the model or the KV budget.
    """
    # stock aten::mm matmuls (no pre-packed weights) in every pass: the profiler counts their FLOPs
    engine = one_request_engine(loaded.model, loaded.tokenizer, 8192, model_id=loaded.model_id, backend=STOCK_LINEARS)
    engine.add_request(prompt, SamplingParams(max_new_tokens=1))
    return run_captured(engine, capture_level=capture_level, profile_dir=profile_dir)


def median_layer_times(traces: list[Trace]) -> LayerTimes:
    """Per-layer medians of the first step's LayerTimes over several timing passes.

    Each layer's figures all come from one pass, the one whose layer time is that layer's
    median (the lower one for an even count), so its parts stay inside it and "other" (the
    layer minus its parts) is what that pass measured. Medians of each part on its own could
    mix passes and leave a negative rest.
    """
    times = [trace.steps[0].layer_times for trace in traces]
    if any(t is None for t in times):
        raise ValueError("Every trace needs a timing capture (layer_times).")
    num_layers = len(times[0].layer_s)
    median_pass = [
        sorted(range(len(times)), key=lambda index: times[index].layer_s[layer])[(len(times) - 1) // 2]
        for layer in range(num_layers)
    ]

    def per_layer(attribute: str) -> list[float]:
        return [getattr(times[median_pass[layer]], attribute)[layer] for layer in range(num_layers)]

    return LayerTimes(
        clock=times[0].clock,
        attention_s=per_layer("attention_s"),
        mlp_s=per_layer("mlp_s"),
        norms_s=per_layer("norms_s"),
        layer_s=per_layer("layer_s"),
        embedding_s=statistics.median(t.embedding_s for t in times),
        final_norm_s=statistics.median(t.final_norm_s for t in times),
        lm_head_s=statistics.median(t.lm_head_s for t in times),
    )


def with_peaks_measured_again(result: KernelTimingsResult) -> KernelTimingsResult:
    """The same run with one more measurement of the machine's peaks and the prediction redone.

    The new measurement joins the cached history (``machine_peaks(refresh=True)``) and the
    prediction uses the best of it, which the new one only raises if it was faster.
    """
    peaks = machine_peaks(result.device, result.dtype, refresh=True)
    predicted = predicted_vs_measured(result.info, result.num_tokens, result.layer_times, peaks, result.last_layer_rows)
    return replace(result, peaks=peaks, predicted=predicted)


# ------------------------------------------------------------------------------ kernels
def captured_qkv(
    trace: Trace, layer: int, device: torch.device | str, dtype: torch.dtype, max_tokens: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
    """q (H, N, D), k and v (KVH, N, D) and the scale of one layer from an inspect trace.

    ``max_tokens`` keeps the first tokens only: causal attention of a prefix needs only
    the prefix, so the kernels' result on it is exactly the prompt's for those tokens.
    """
    if not trace.captured_qk:
        raise ValueError("The trace has no captured q/k/v: run it with capture_level='inspect'.")
    captured = next(iter(trace.captured_qk.values()))
    if not 0 <= layer < len(captured.queries):
        raise RequestError(f"Layer {layer} does not exist: the model has layers 0..{len(captured.queries) - 1}.")
    if not captured.values:
        raise ValueError("This trace captured queries and keys but no values.")

    def tensor(array) -> torch.Tensor:
        return torch.from_numpy(array[:, :max_tokens]).to(device=device, dtype=dtype)

    return (tensor(captured.queries[layer]), tensor(captured.keys[layer]), tensor(captured.values[layer]),
            captured.scaling[layer])


def compare_kernels(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, kernels: tuple[AttentionKernel, ...] = KERNELS,
    runs: int = 5
) -> list[KernelResult]:
    """Every kernel on the same q/k/v, each checked against v1 before it is timed."""
    return [check_and_time(kernel, q, k, v, scale, runs=runs) for kernel in kernels]


# ------------------------------------------------------------------------------ together
def run_kernel_timings(
    loaded: LoadedModel,
    prompt: str,
    kernel_layer: int = 0,
    sweep_sizes: tuple[int, ...] | list[int] | None = None,
    timing_runs: int = 3,
    kernel_runs: int = 5,
    profile_dir: str | None = None,
    progress: FractionProgress | None = None,
    include_flex: bool = False,
) -> KernelTimingsResult:
    """All passes of the Kernel timings page for one prompt.

    Args:
        loaded: the model.
        prompt: text to prefill.
        kernel_layer: whose captured q/k/v the attention kernels run on.
        sweep_sizes: N values for the kernel benchmark (``default_sweep_sizes`` if None;
            empty for none).
        timing_runs: timing passes; the per-layer median is kept.
        kernel_runs: timed runs per kernel.
        profile_dir: also write the Chrome trace there (it is kept in memory either way).
        progress: called with (fraction done, what is running).
        include_flex: also benchmark v4 FlexAttention (it compiles each new shape).

    Raises:
        RequestError: empty prompt, too long, or a layer that does not exist.
    """
    report = progress or (lambda fraction, text: None)
    info = loaded.info
    if not 0 <= kernel_layer < info.num_layers:
        raise RequestError(f"Layer {kernel_layer} does not exist: the model has layers 0..{info.num_layers - 1}.")
    sizes = list(default_sweep_sizes(loaded.device) if sweep_sizes is None else sweep_sizes)
    if any(n < 1 for n in sizes):
        raise RequestError(f"Sweep sizes must be at least 1 token, got {sorted(sizes)}.")
    token_limit = max_kernel_tokens(info, loaded.device)
    report(0.0, "warm-up prefill")
    prefill_pass(loaded, prompt, "none")  # raises RequestError on a bad prompt before anything is kept
    timing_traces = []
    for run in range(timing_runs):
        report(0.05 + 0.15 * run / timing_runs, f"timing pass {run + 1} of {timing_runs}")
        timing_traces.append(prefill_pass(loaded, prompt, "timing"))
    layer_times = median_layer_times(timing_traces)
    num_tokens = timing_traces[0].steps[0].num_scheduled_tokens

    report(0.2, "prefill under torch.profiler")
    profile = prefill_pass(loaded, prompt, "profile", profile_dir)
    timeline = timeline_events(profile.profile.chrome_trace_json())

    report(0.35, "machine peaks (cached; measured again when old or taken on a busy machine)")
    loaded_dtype_name = dtype_name(loaded.dtype)
    peaks = machine_peaks(loaded.device, loaded_dtype_name)
    # the timing passes' forward keeps one row there
    last_layer_rows = 1 if own_forward_status(loaded.model)[0] else None
    predicted = predicted_vs_measured(info, num_tokens, layer_times, peaks, last_layer_rows)

    report(0.4, f"inspection pass: q/k/v of layer {kernel_layer}")
    inspection = prefill_pass(loaded, prompt, "inspect")
    q, k, v, scale = captured_qkv(inspection, kernel_layer, loaded.device, loaded.dtype, max_tokens=token_limit)
    del inspection  # all layers' q/k/v: only one layer is kept
    kernel_num_tokens = q.shape[1]
    report(0.5, f"attention kernels on layer {kernel_layer}'s q/k/v")
    kernel_results = compare_kernels(q, k, v, scale, runs=kernel_runs)

    def sweep_progress(fraction: float, text: str) -> None:
        report(0.6 + 0.4 * fraction, text)

    benchmark = None
    if sizes:
        benchmark = run_kernel_benchmark(
            info.num_heads, info.num_kv_heads, info.head_dim, sizes, loaded.device, loaded.dtype,
            include_flex=include_flex, runs=kernel_runs, progress=sweep_progress,
        )
    report(1.0, "done")
    return KernelTimingsResult(
        model_id=loaded.model_id,
        device=str(loaded.device),
        dtype=loaded_dtype_name,
        prompt=prompt,
        num_tokens=num_tokens,
        timing_traces=timing_traces,
        layer_times=layer_times,
        profile=profile,
        timeline=timeline,
        info=info,
        peaks=peaks,
        predicted=predicted,
        last_layer_rows=last_layer_rows,
        kernel_layer=kernel_layer,
        kernel_num_tokens=kernel_num_tokens,
        kernel_results=kernel_results,
        benchmark=benchmark,
    )


KERNEL_PASS_NAMES = {  # which: (long, short for a figure's subtitle); the engine's own passes: instrument.passes
    "inspect": (f"q/k/v of layer {{layer}} from an {passes.INSPECTION_PASS}, kernels timed on their own",
                f"layer {{layer}}'s q/k/v, {passes.INSPECTION_PASS}"),
    "sweep": ("kernel benchmark: random q/k/v of the model's shape, kernels timed on their own",
              "random q/k/v of the model's shape"),
}


def pass_label(result: KernelTimingsResult, which: str, short: bool = False) -> str:
    """Which pass a number came from, and where: for captions (long) and figure subtitles (short)."""
    if which in KERNEL_PASS_NAMES:
        name = KERNEL_PASS_NAMES[which][short].format(layer=result.kernel_layer)
    else:  # "timing" (a median of the timing passes) or "profile"
        name = passes.pass_label(which, len(result.timing_traces) if which == "timing" else None, short)
    where = f"{result.device}, {result.dtype}" if short else f"{result.model_id} on {result.device}, {result.dtype}"
    return f"{name} · {where}"

