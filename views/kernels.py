"""Kernel timings: where the time of one prefill goes, per layer, per op, over time, against
the roofline's prediction, and inside the attention kernel itself."""

import statistics

import pandas as pd
import streamlit as st

from prefillviz.experiments import timing_rows
from prefillviz.figures import kernels as figures
from prefillviz.kernels.attention import KERNELS
from prefillviz.kernels.paged_attention import PAGED_KERNELS
from prefillviz.loading.hosted import hosted_policy
from prefillviz.loading.prompts import PRESETS
from prefillviz.measure import kernel_bench
from prefillviz.measure import kernels as experiments
from prefillviz.ui.results import downloads, get_result, save_result
from prefillviz.ui.running import run_guarded
from prefillviz.ui.shell import page_frame, run_button, stop_page
from prefillviz.ui.tuning_panel import backends_panel, dispatch_panel

loaded = page_frame()

st.title("Kernel timings")
st.markdown(
    "One prefill of your prompt, measured four ways: **per-layer clocks** (a timing pass), "
    "**torch.profiler** (every op, and a timeline you can open in Perfetto), the **roofline's "
    "prediction** from the machine's measured peaks, and the **attention kernel** itself, rewritten "
    "three ways and each checked against a naive reference before it is timed."
)

preset = st.selectbox("Preset", list(PRESETS), key="kernels_preset")
prompt = st.text_area("Prompt", PRESETS[preset], height=120, key=f"kernels_prompt_{preset}")
device_type = loaded.device.type if loaded is not None else "cpu"
controls = st.columns(2)
policy = hosted_policy()
num_layers = loaded.info.num_layers if loaded is not None else 1
kernel_layer = controls[0].number_input(
    "Layer whose queries, keys and values the attention kernels run on",
    0,
    num_layers - 1,
    0,
    key=f"kernels_layer_of_{num_layers}",  # a model with another depth gets its own widget and bounds
)
sweep_choices = experiments.SWEEP_CHOICES.get(device_type, experiments.SWEEP_CHOICES["cpu"])
sweep_choices = [n for n in sweep_choices if n <= policy.limit("prompt_tokens", n)]
sweep_sizes = controls[1].multiselect(
    "Kernel benchmark: prompt lengths N (random q/k/v of the model's shape; long N take a while on a CPU)",
    sweep_choices,
    default=[n for n in experiments.default_sweep_sizes(device_type) if n in sweep_choices],
    max_selections=policy.limit("sweep_points", 64),
    key=f"kernels_sweep_{device_type}",
)
include_flex = controls[1].checkbox(
    "Include FlexAttention (v4): compiled for every new shape, several seconds each",
    value=False,
    key="kernels_flex",
    disabled=policy.enabled,
)

if run_button("Measure", type="primary", key="kernels_run"):
    bar = st.progress(0.0, text="starting")
    with run_guarded("The kernel timings"):
        save_result(
            "kernels",
            experiments.run_kernel_timings(
                loaded,
                prompt,
                int(kernel_layer),
                sorted(sweep_sizes),
                progress=lambda done, text: bar.progress(min(done, 1.0), text=text),
                include_flex=include_flex,
            ),
        )
    bar.empty()

# ---------------------------------------------------------------- the measured dispatch, what tuning buys
dispatch_panel(loaded, policy.enabled)
backends_panel(loaded, prompt)

result = get_result("kernels")
if result is None:
    stop_page()

st.caption(
    f"Last run: {result.num_tokens:,} prompt tokens · {result.model_id} on **{result.device}**, {result.dtype}. "
    "Every pass below runs the engine's own forward on the measured backend with the model's stock matmuls "
    "(`aten::mm`, whose FLOPs the profiler counts); elsewhere the measured backend runs them on a CPU with weights "
    "packed once for oneDNN, which is faster."
)

# ---------------------------------------------------------------- per layer
st.subheader("Where the time goes, layer by layer")
rows = timing_rows.layer_rows(result.layer_times)
label = experiments.pass_label(result, "timing")
layer_figure = figures.layer_time_figure(rows, experiments.pass_label(result, "timing", short=True))
st.plotly_chart(layer_figure, key="kernels_layers_chart")
totals = {key: sum(row[key] for row in rows) for key in ("attention_ms", "mlp_ms", "norms_ms", "other_ms", "layer_ms")}
metrics = st.columns(4)
for column, (key, name) in zip(metrics, [("attention_ms", "Attention"), ("mlp_ms", "MLP"), ("norms_ms", "Norms"),
                                         ("other_ms", "Other")]):
    column.metric(f"{name}, all layers", f"{totals[key]:,.2f} ms",
                  f"{100 * totals[key] / totals['layer_ms']:.0f}% of the layers", delta_color="off")
st.caption(
    f"{label}. Clock: {result.layer_times.clock}. Attention covers the q/k/v/o projections, RoPE, the KV write and "
    "the attention itself; other = the layer's clock minus its parts (residual adds, hooks)."
)
downloads("kernels_layer_times", "kernels_layers_dl", figure=layer_figure, table=rows)

# ---------------------------------------------------------------- roofline
st.subheader("Predicted vs measured")
st.markdown(
    "The roofline predicts each op's time as the larger of *FLOPs / peak matmul throughput* and "
    "*bytes moved / memory bandwidth*, with both peaks measured on this machine. Every layer has the same "
    "shape, so the prediction is the same for each; the clock is not."
    + (
        " Except the last: the engine's own forward, which ran these timing passes, takes only the row whose logits "
        "are sampled on past that layer's attention (every token's K/V are written first; nothing reads the other rows "
        "there), so o, the norm and the MLP run one row, and the last layer is predicted, and runs, shorter."
        if result.last_layer_rows else ""
    )
)
peaks_row = st.columns([5, 1])
if peaks_row[1].button(
    "Measure peaks again",
    key="kernels_measure_peaks",
    help="One more measurement of matmul throughput and memory bandwidth (a few seconds). Load only lowers a peak, "
    "so the prediction uses the best of the measurements kept on this machine.",
):
    with run_guarded("Measuring the machine's peaks"), st.spinner("Measuring matmul throughput and memory bandwidth…"):
        save_result("kernels", experiments.with_peaks_measured_again(result))
    result = get_result("kernels")  # drawn below with the new best peaks, in this same run
peaks = result.peaks
peaks_row[0].caption(peaks.history_label())
predicted = result.predicted
ratios = {group: statistics.median(row[f"{group}_ratio"] for row in predicted) for group in ("attention", "mlp")}
metrics = st.columns(3)
metrics[0].metric("Attention: measured / predicted", f"{ratios['attention']:,.1f}×",
                  f"{predicted[0]['attention_bound']}-bound by the roofline", delta_color="off")
metrics[1].metric("MLP: measured / predicted", f"{ratios['mlp']:,.1f}×",
                  f"{predicted[0]['mlp_bound']}-bound by the roofline", delta_color="off")
metrics[2].metric("Machine peaks", f"{peaks.matmul_gflops:,.0f} GFLOP/s", f"{peaks.memory_gb_s:,.0f} GB/s",
                  delta_color="off")
prediction_figure = figures.predicted_vs_measured_figure(
    predicted, f"measured: {experiments.pass_label(result, 'timing', short=True)}"
)
st.plotly_chart(prediction_figure, key="kernels_prediction_chart")
st.caption(
    f"Predicted: roofline from peaks measured on {peaks.machine} ({peaks.device}, {peaks.dtype}, {peaks.num_threads} "
    f"threads, {peaks.measured_at}). Measured: {experiments.pass_label(result, 'timing')}. Ratios are medians over "
    "layers. The gap is what the roofline leaves out: Python and dispatch per op, small matmuls far from peak, "
    "RoPE and the KV write, and anything else running on the machine."
)
with st.expander("Per-layer numbers"):
    st.dataframe(pd.DataFrame(predicted), hide_index=True)
downloads("kernels_predicted_vs_measured", "kernels_prediction_dl", figure=prediction_figure, table=predicted)

# ---------------------------------------------------------------- profiler
st.subheader("The profiler's op table")
op_rows = timing_rows.op_rows(result.profile)
profile_label = experiments.pass_label(result, "profile")
op_figure = figures.op_table_figure(op_rows, 15, experiments.pass_label(result, "profile", short=True))
st.plotly_chart(op_figure, key="kernels_ops_chart")
st.dataframe(pd.DataFrame(op_rows[:25]), hide_index=True)
st.caption(
    f"{profile_label}. Self time excludes the ops called inside; a scope's self time is what ran in it outside any "
    "torch op (Python, hooks). GFLOP: what the profiler counted (matmuls; it reports 0 for the attention kernel)."
)
downloads("kernels_op_table", "kernels_ops_dl", figure=op_figure, table=op_rows)

# ---------------------------------------------------------------- timeline
st.subheader("Timeline of one prefill")
timeline_figure = figures.timeline_figure(result.timeline, experiments.pass_label(result, "profile", short=True))
st.plotly_chart(timeline_figure, key="kernels_timeline_chart")
st.caption(f"From the Chrome trace's record_function scopes ({profile_label}). "
           "Zoom in to see the sub-layers of one layer.")
downloads("kernels_timeline", "kernels_timeline_dl", figure=timeline_figure, table=result.timeline)
if result.profile.profile.chrome_trace_gz:
    st.download_button(
        "Chrome trace (JSON)",
        result.profile.profile.chrome_trace_json,
        "prefill_chrome_trace.json",
        "application/json",
        key="kernels_chrome_trace",
        on_click="ignore",
        help="Opens in Perfetto (ui.perfetto.dev) or chrome://tracing: every op of the prefill on its thread.",
    )
    st.caption("The full trace opens in Perfetto (ui.perfetto.dev) or chrome://tracing.")

# ---------------------------------------------------------------- attention kernels
st.subheader("Attention kernels")
st.markdown(
    "The same causal attention computed three ways (`prefillviz/kernels/attention.py`). Each version is first "
    "compared with v1, the naive reference, and refused if it differs; only then is it timed (warm-up, "
    "median of several runs) and its memory measured in a separate call."
)
st.dataframe(pd.DataFrame([{"version": k.name, "what it changes": k.changes} for k in KERNELS]), hide_index=True)
kernel_rows = kernel_bench.kernel_rows(result.kernel_results)
kernel_label = experiments.pass_label(result, "inspect")
on_prompt = (
    f"**On your prompt:** layer {result.kernel_layer}'s queries, keys and values, "
    f"N = {result.kernel_num_tokens:,} tokens"
)
if result.kernel_num_tokens < result.num_tokens:
    on_prompt += (
        f" (the first {result.kernel_num_tokens:,} of {result.num_tokens:,}: the naive oracle's N x N scores would not "
        "fit; causal attention of a prefix needs only the prefix)"
    )
st.markdown(on_prompt + ".")
columns = st.columns(2)
kernel_subtitle = experiments.pass_label(result, "inspect", short=True)
kernel_time = figures.kernel_time_figure(kernel_rows, kernel_subtitle)
kernel_memory = figures.kernel_memory_figure(kernel_rows, kernel_subtitle)
columns[0].plotly_chart(kernel_time, key="kernels_kernel_time_chart")
columns[1].plotly_chart(kernel_memory, key="kernels_kernel_memory_chart")
st.dataframe(pd.DataFrame(kernel_rows), hide_index=True)
memory_method = kernel_rows[0]["memory_method"] if kernel_rows else ""
st.caption(
    f"{kernel_label}. |Δ v1| = max absolute difference from the naive oracle. Memory measured with {memory_method}: "
    "the peak of bytes allocated minus freed during one call, output included (a library's private scratch is not "
    "seen). Largest intermediate: computed from the shapes (v1's (H, N, N) scores, v3's one fp32 tile; unknown for v2)."
)
downloads("kernels_attention_kernels", "kernels_kernel_dl", figure=kernel_time, table=kernel_rows)

BENCHMARK_VIEWS = [  # (family, workload, what the N tokens are, chart key)
    ("dense", "one prompt", "one causal prompt of N tokens (`prefillviz/kernels/attention.py`)", "dense"),
    (
        "paged",
        "prefill",
        "an engine step with one fresh prompt of N tokens, through the paged cache "
        "(`prefillviz/kernels/paged_attention.py`); "
        "here v2 and v3 make the very same SDPA call, so any gap between them is run-to-run noise",
        "paged_prefill",
    ),
    (
        "paged",
        "mixed",
        "a chunked-prefill step: 128 new tokens after N - 128 cached, "
        "packed with 4 decodes of requests holding N tokens",
        "paged_mixed",
    ),
]
if result.benchmark is not None:
    st.subheader("Kernel benchmark: time and memory vs N")
    st.markdown(
        "Random q/k/v with the model's attention shape: the time and memory of attention depend on the shapes, "
        "not on the values. The paged family is the engine's step: **v2 loop** makes one SDPA call per request; "
        "**v3 packed** puts every request of the step in one call with a block-diagonal causal mask; **v4 flex** "
        "does that with FlexAttention's block mask; **v6** is v2 with 16-bit decodes on a CPU done as two fp32 "
        "matmuls, and is what the stock forward runs; **v7 compiled** is the engine's own C++ kernel (FlashAttention's "
        "tiling on a CPU, straight off the paged cache). Which of them the engine runs is the measured choice above."
    )
    st.dataframe(
        pd.DataFrame([{"version": k.name, "what it changes": k.changes} for k in PAGED_KERNELS]), hide_index=True
    )
    benchmark_rows = result.benchmark.rows()
    sweep_subtitle = experiments.pass_label(result, "sweep", short=True)
    for family, workload, what, chart in BENCHMARK_VIEWS:
        rows = [row for row in benchmark_rows if row["family"] == family and row["workload"] == workload]
        if not rows:
            continue
        st.markdown(f"**{family.capitalize()} kernels, {workload}:** {what}.")
        columns = st.columns(2)
        sweep_time = figures.sweep_time_figure(rows, sweep_subtitle,
                                               f"{family.capitalize()} attention, {workload}: time vs N")
        sweep_memory = figures.sweep_memory_figure(rows, sweep_subtitle,
                                                   f"{family.capitalize()} attention, {workload}: memory vs N")
        columns[0].plotly_chart(sweep_time, key=f"kernels_sweep_{chart}_time_chart")
        columns[1].plotly_chart(sweep_memory, key=f"kernels_sweep_{chart}_memory_chart")
        downloads(f"kernels_benchmark_{chart}", f"kernels_sweep_{chart}_dl", figure=sweep_time, table=rows)
    summary = result.benchmark.summary()["packed_over_loop"]
    if summary:
        st.markdown(
            "**Packed over loop** (v3 time / v2 time; above 1 means the engine's per-request loop is faster): "
            + ", ".join(f"{point.removeprefix('paged ')}: {ratio:.2f}×" for point, ratio in summary.items())
        )
    if result.benchmark.skipped:
        st.markdown("**Not run here:**")
        st.dataframe(pd.DataFrame(result.benchmark.skipped), hide_index=True)
    st.caption(
        f"{experiments.pass_label(result, 'sweep')}. Every point passed the check against its family's v1 before it "
        "was timed (the check computes v1 a few hundred rows at a time, so long N are checked too)."
    )
