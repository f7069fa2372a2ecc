"""Parallel vs token-by-token: the same prompt in one step or in N steps, timed and proven equal."""

import statistics
from dataclasses import asdict

import pandas as pd
import streamlit as st

from prefillviz.analysis.flop_facts import decode_intensity_limit, predicted_quadratic_coefficient, token_by_token_flops
from prefillviz.experiments.length_sweep import DEFAULT_PARALLEL_SIZES, DEFAULT_SEQUENTIAL_SIZES, run_sweep
from prefillviz.experiments.parallel import run_both_ways
from prefillviz.experiments.ways import PARALLEL, TOKEN_BY_TOKEN, WAYS
from prefillviz.figures import parallel as figures
from prefillviz.loading.hosted import hosted_policy
from prefillviz.loading.prompts import PRESETS
from prefillviz.machine.devices import dtype_name
from prefillviz.measure.roofline import DEFAULT_DECODE_CONTEXTS, DEFAULT_PREFILL_SIZES, run_roofline
from prefillviz.peers.workload import PeerRequest
from prefillviz.ui.results import downloads, get_result, save_result
from prefillviz.ui.running import progress_bar, run_guarded
from prefillviz.ui.shell import page_frame, run_button
from prefillviz.ui.vllm_panel import vllm_panel

loaded = page_frame()

PREFILL_PROMPT = "Last prompt of the Prefill page"
PASSES = {
    "none": "timing pass (nothing captured)",
    "inspect": "inspection pass (K/V and logits captured; slower)",
}


def source(result, capture: str) -> str:
    """Which pass a number comes from, and where it ran (from the result, not the sidebar)."""
    return f"{PASSES[capture]} · {result.model_id} on {result.device}, {result.dtype}"


def rate(tokens_per_s: float) -> str:
    return f"{tokens_per_s:,.0f}" if tokens_per_s >= 100 else f"{tokens_per_s:.3g}"


st.title("Parallel vs token-by-token")
st.markdown(
    "The same prompt, the same engine, the same model, two token budgets. **Parallel**: a budget of at least N "
    "runs all N prompt tokens in **one step** (one (1, N) batch: big matrix multiplications). **Token-by-token**: "
    "a budget of 1 runs **N steps** of one token each, every step reading all the weights again to do 1/N of the work. "
    "Both end with the same KV cache and the same next-token distribution, which is checked below."
)


# ---------------------------------------------------------------- one prompt, both ways
st.header("One prompt, both ways")
presets = dict(PRESETS)
last_prefill = get_result("prefill")
if last_prefill is not None:
    presets[PREFILL_PROMPT] = last_prefill.prompt
preset = st.selectbox("Preset", list(presets), index=list(presets).index("Chat with a system prompt"),
                      key="parallel_preset")
prompt = st.text_area("Prompt", presets[preset], height=130, key=f"parallel_prompt_{preset}")
max_tokens = st.number_input(
    "Use at most this many prompt tokens",
    min_value=1,
    max_value=4096,
    value=256,
    step=16,
    key="parallel_max_tokens",
    help="Token-by-token runs one step per token (tens of ms each on a CPU), twice: a timing and an inspection pass.",
)

if run_button("Run both ways", type="primary", key="parallel_run"):
    with run_guarded("The comparison"):
        with progress_bar("Parallel vs token-by-token") as update:
            save_result("parallel", run_both_ways(loaded, prompt, int(max_tokens), progress=update))

comparison = get_result("parallel")
if comparison is not None:
    parallel, sequential, check = comparison.parallel, comparison.token_by_token, comparison.equality
    n = comparison.num_tokens
    cut = comparison.num_prompt_tokens_before_cut
    st.caption(
        f"Last run: {n:,} prompt tokens" + (f" (the first {n:,} of {cut:,})" if cut > n else "") + ". "
        f"Times: {source(comparison, 'none')}, after a warm-up; parallel is the median of "
        f"{len(parallel.timing_runs_s)} runs (spread "
        f"{min(parallel.timing_runs_s) * 1e3:,.1f}-{max(parallel.timing_runs_s) * 1e3:,.1f} ms), "
        f"token-by-token one run of {sequential.num_steps} steps (per-step median below)"
        + (f"; {comparison.machine_load.label()}." if comparison.machine_load is not None else ".")
    )
    columns = st.columns(4)
    columns[0].metric(f"Parallel ({parallel.num_steps} step): time to first token",
                      f"{parallel.time_to_first_token_s * 1e3:,.1f} ms")
    columns[1].metric(f"Token-by-token ({sequential.num_steps} steps): time to first token",
                      f"{sequential.time_to_first_token_s * 1e3:,.1f} ms")
    columns[2].metric("Token-by-token / parallel", f"{comparison.ratio:,.1f}×")
    columns[3].metric("Prompt tokens/s: parallel vs token-by-token",
                      f"{rate(parallel.tokens_per_s)} vs {rate(sequential.tokens_per_s)}")

    latency = figures.step_latency_figure(comparison)
    st.plotly_chart(latency, key="parallel_latency_chart")
    one_token_step_s = statistics.median(sequential.step_wall_times_s)
    same_shapes = loaded is not None and loaded.model_id == comparison.model_id
    work = ""
    if same_shapes:  # the FLOP model, not n: every one-token step also computes a row of logits
        flops = token_by_token_flops(loaded, n)
        work = (
            f"The parallel step did {flops.parallel_over_mean_step:,.0f}× the FLOPs of an average one-token step (the "
            f"FLOP model; not {n}×: each of the {n} steps computes a row of logits, so token by token does "
            f"{100 * (flops.extra_work - 1):.0f}% more FLOPs in all) in "
            f"{parallel.step_wall_times_s[0] / one_token_step_s:,.1f}× the time of a median one "
            f"({one_token_step_s * 1e3:,.1f} ms): each step reads all the weights, whatever its token count."
        )
    st.caption("Each bar is one engine step (schedule + pack + forward + sample + update); "
               f"{source(comparison, 'none')}. {work}")
    downloads("parallel_step_latency", "parallel_latency_dl", figure=latency, table=comparison.step_rows(),
              data=comparison.summary())

    over_time = figures.tokens_over_time_figure(comparison)
    st.plotly_chart(over_time, key="parallel_over_time_chart")
    downloads("parallel_tokens_over_time", "parallel_over_time_dl", figure=over_time, table=comparison.step_rows())

    st.subheader("Proof: the same KV cache and the same next token")
    tolerance = f"{check.relative_tolerance:.1e} of the largest value"
    same_model = loaded is not None and loaded.model_id == comparison.model_id and loaded.tokenizer is not None
    token_text = (lambda t: f"{loaded.tokenizer.decode([t])!r}, id {t}") if same_model else (lambda t: f"id {t}")
    same_token = check.parallel_top_token_id == check.token_by_token_top_token_id
    near_tie = "" if same_token or not check.top_tokens_agree else (
        f" (a near tie: the top two logits are {check.top_two_margin:.2g} apart, within the rounding)"
    )
    verdict = (
        f"**{'PASS' if check.passed else 'FAIL'}** ({check.dtype}, tolerance {tolerance}): over all {check.num_layers} "
        f"layers and {check.num_positions} positions, the largest difference relative to its layer's largest |K| or "
        f"|V| is {check.relative_diff:.1e} (max |ΔK| = {check.max_key_diff:.2e}, max |ΔV| = "
        f"{check.max_value_diff:.2e}); first-token logits max |Δ| = {check.logits_max_abs_diff:.2e} of max |logit| "
        f"{check.logits_max_abs:.3g}, allowed {check.logits_allowed:.2e} (probabilities "
        f"{check.probs_max_abs_diff:.2e}); top token {'the same' if same_token else 'DIFFERENT'}{near_tie} "
        f"({token_text(check.parallel_top_token_id)} vs {token_text(check.token_by_token_top_token_id)}). "
    )
    if check.passed:
        st.success(verdict + "Every difference is within the rounding of the dtype.")
    else:
        st.warning(verdict + "Some difference is more than the rounding of the dtype explains.")
    st.caption(
        f"From an {source(comparison, 'inspect')}: the post-RoPE keys and values each way wrote into the KV cache, "
        f"compared element by element. Rounding alone makes them differ a little: a matmul over {n} rows adds its "
        f"products in another order than one over 1 row. The tolerance is {check.describe_tolerance()}: what two whole "
        "forward passes of one model differ by from rounding, on any CPU. "
        "A wrong key or value would be off by about its own size (1 on this scale)."
    )
    difference = figures.kv_difference_figure(check)
    st.plotly_chart(difference, key="parallel_difference_chart")
    downloads("parallel_kv_difference", "parallel_difference_dl", figure=difference, table=check.rows(),
              data=comparison.summary()["equality"])

    token_ids = list(parallel.record.prompt_token_ids)
    vllm_panel(
        "parallel", loaded,
        {PARALLEL: ([PeerRequest("prompt", token_ids, 1)], n, 3),
         TOKEN_BY_TOKEN: ([PeerRequest("prompt", token_ids, 1)], 1, 0)},
        figures.engines_ttft_figure,
    )

# ---------------------------------------------------------------- the N sweep
st.header("Time to first token against N")
st.markdown(
    "Prompts of N tokens of real prose, each way, fitted by least squares to **t = a + b·N + c·N²** with "
    "a, b, c ≥ 0 (no cost shrinks as the prompt grows): *a* is the fixed cost of a request, *b* the cost per token, "
    "*c* the part that grows faster than N. Attention's N² FLOPs (token *i* looks at *i* keys) bend the curve up, but "
    "so does a device that is under-used at short prompts and then fills up (a GPU's TTFT is flat, then rises): the "
    "fitted *c* is compared below with the *c* attention's FLOPs predict. Token-by-token pays a whole step per token, "
    "so its *b* is about one step's time; keep its N small."
)
columns = st.columns(3)
parallel_sizes = columns[0].multiselect(
    "Parallel: N", [8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024], list(DEFAULT_PARALLEL_SIZES),
    max_selections=hosted_policy().limit("sweep_points", 64), key="parallel_sweep_parallel_sizes"
)
sequential_sizes = columns[1].multiselect(
    "Token-by-token: N", [2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128], list(DEFAULT_SEQUENTIAL_SIZES),
    max_selections=hosted_policy().limit("sweep_points", 64), key="parallel_sweep_sequential_sizes"
)
parallel_runs = columns[2].number_input("Parallel runs per N (median)", 1, 9, 3, key="parallel_sweep_runs")
estimate = (f"Token-by-token will run {sum(sequential_sizes):,} steps; "
            f"parallel {len(parallel_sizes) * (int(parallel_runs) + 1)} steps (one warm-up per N).")
if (comparison is not None and loaded is not None
        and (comparison.model_id, comparison.dtype) == (loaded.model_id, dtype_name(loaded.dtype))):
    step_s = statistics.median(comparison.token_by_token.step_wall_times_s)
    estimate += (f" At the {step_s * 1e3:,.0f} ms per one-token step measured above, "
                 f"the token-by-token part takes about {sum(sequential_sizes) * step_s:,.0f} s.")
st.caption(estimate)



def bend_text(sweep) -> str:
    """Which explains the parallel fit's upward bend: attention's FLOPs, or something else (the FLOP model's c vs
    the fitted c)."""
    fit = sweep.fits[PARALLEL]
    if loaded is None or loaded.model_id != sweep.model_id or fit.b_s_per_token <= 0:
        return ""
    predicted = predicted_quadratic_coefficient(loaded, fit.b_s_per_token)
    said = (f"Parallel: fitted c = {fit.c_s_per_token2 * 1e6:.3g} µs per token²; "
            f"attention's FLOPs, at the fitted b, predict {predicted * 1e6:.3g}.")
    if fit.c_s_per_token2 <= 3 * predicted:
        return said + " Attention's N² share can explain the bend."
    return said + (
        f" The bend is {fit.c_s_per_token2 / predicted:,.0f}× larger than attention explains: the device was "
        "under-used at small N and filled up as N grew (or caches overflowed), not the N² term."
    )


if run_button("Run the sweep", key="parallel_sweep_run"):
    with run_guarded("The sweep"):
        with progress_bar("Sweep") as update:
            save_result("parallel_sweep", run_sweep(loaded, parallel_sizes, sequential_sizes, int(parallel_runs),
                                                    progress=update))

sweep = get_result("parallel_sweep")
if sweep is not None:
    sweep_chart = figures.sweep_figure(sweep)
    st.plotly_chart(sweep_chart, key="parallel_sweep_chart")
    fits = pd.DataFrame(
        [
            {
                "way": row["way"],
                "a (ms)": row["a_s"] * 1e3,
                "b (ms per token)": row["b_s_per_token"] * 1e3,
                "c (µs per token²)": row["c_s_per_token2"] * 1e6,
                "R²": row["r_squared"],
            }
            for row in sweep.fit_rows()
        ]
    )
    st.dataframe(fits, hide_index=True, key="parallel_fit_table")
    b_parallel, b_sequential = (sweep.fits[way].b_s_per_token for way in WAYS)
    b_text = (
        f"Per-token cost b: token-by-token / parallel = {b_sequential / b_parallel:,.1f}×."
        if b_parallel > 0
        else "Parallel's per-token cost b fitted as 0: at these N its growth is lost in the timing noise; try larger N."
    )
    st.caption(f"{b_text} {bend_text(sweep)} Every number: "
               f"{source(sweep, 'none')}, each run a fresh request with the prefix cache off.")
    downloads("parallel_sweep", "parallel_sweep_dl", figure=sweep_chart, table=sweep.rows(),
              data={"fits": sweep.fit_rows(), "points": sweep.rows()})

# ---------------------------------------------------------------- the roofline
st.header("Roofline: why one big step beats N small ones")
decode_limit = (
    f"at most 2 ÷ bytes per weight = {decode_intensity_limit(loaded.dtype.itemsize):.2g} "
    f"FLOP/byte in {dtype_name(loaded.dtype)}"
    if loaded is not None else "at most 2 ÷ bytes per weight FLOP/byte"
)
st.markdown(
    "A step that does F FLOPs while moving B bytes can run no faster than min(peak FLOP/s, bandwidth × F/B). "
    "A prefill step of N tokens reuses every weight N times (high intensity: **compute-bound** once it passes the "
    "ridge); a one-token step reads every weight for one token: a multiply and an add per weight, so an intensity of "
    f"{decode_limit} (**memory-bound**). The roofs are this machine's measured matmul peak and memory bandwidth; "
    "the points are measured engine steps."
)
columns = st.columns(3)
prefill_sizes = columns[0].multiselect(
    "Prefill points: N", [16, 32, 64, 128, 256, 512, 1024], list(DEFAULT_PREFILL_SIZES),
    max_selections=hosted_policy().limit("sweep_points", 64), key="parallel_roofline_prefill"
)
decode_contexts = columns[1].multiselect(
    "Decode points: context", [16, 64, 256, 1024], list(DEFAULT_DECODE_CONTEXTS),
    max_selections=hosted_policy().limit("sweep_points", 64), key="parallel_roofline_decode"
)
roofline_runs = columns[2].number_input("Runs per point (median)", 1, 9, 2, key="parallel_roofline_runs")

if run_button("Measure the roofline", key="parallel_roofline_run"):
    with (run_guarded("The roofline"),
          st.spinner("Reading or measuring the machine's peaks, then timing prefill and decode steps…")):
        save_result("parallel_roofline", run_roofline(loaded, prefill_sizes, decode_contexts, int(roofline_runs)))

roofline = get_result("parallel_roofline")
if roofline is not None:
    same_setup = comparison is not None and (
        (comparison.model_id, comparison.device, comparison.dtype)
        == (roofline.model_id, roofline.device, roofline.dtype)
    )
    prompt_points = comparison.roofline_points if same_setup else []
    roofline_chart = figures.roofline_figure(roofline.peaks, roofline.points, prompt_points)
    st.plotly_chart(roofline_chart, key="parallel_roofline_chart")
    st.caption(
        f"Points: median forward time of real engine steps, {source(roofline, 'none')}; FLOPs and bytes from the "
        f"model's shapes. Roofs: matmul {roofline.peaks.matmul_gflops:,.0f} GFLOP/s, memory "
        f"{roofline.peaks.memory_gb_s:,.1f} GB/s, "
        f"measured on {roofline.peaks.machine} ({roofline.peaks.device}, {roofline.peaks.dtype})."
        + (" Stars: the prompt above (its timing pass)." if prompt_points else "")
        + "".join(f" {p.label}: {p.intensity:.2g} FLOP/byte." for p in roofline.points if p.phase == "decode")
    )
    downloads("parallel_roofline", "parallel_roofline_dl", figure=roofline_chart, table=roofline.rows(),
              data={"peaks": asdict(roofline.peaks), "points": roofline.rows()})
