"""Long prompts: the O(N²) wall measured to the model's context, and block-sparse prefill against dense."""

import pandas as pd
import streamlit as st

from prefillviz.experiments.long_prompt_wall import DEFAULT_WALL_SIZES, run_wall
from prefillviz.experiments.long_text import LONG_TEXT_NAME
from prefillviz.experiments.sparse_maps import block_maps
from prefillviz.experiments.sparse_prefill import (
    BACKENDS,
    DEFAULT_KEEP_FRACTION,
    QUALITY_PROMPTS,
    TRADE_OFF_KEEPS,
    compare_dense_sparse,
)
from prefillviz.figures import long_prompts as figures
from prefillviz.loading.hosted import hosted_policy
from prefillviz.ui.results import downloads, get_result, save_result
from prefillviz.ui.running import progress_bar, run_guarded
from prefillviz.ui.shell import page_frame, run_button

BACKEND_NAMES = {"measured": "measured (the engine's real path; sparse: v8 block-sparse where measured faster)",
                 "torch": "the textbook's torch ops"}
loaded = page_frame()
policy = hosted_policy()
context = (loaded.info.max_context if loaded is not None else None) or 8192
longest = min(context - 33, policy.max_prompt_tokens) if policy.enabled else context - 33  # 32 greedy tokens follow

st.title("Long prompts: the O(N²) wall, and block-sparse prefill")
st.markdown(
    "Every prompt token's query meets every earlier key: attention's work grows with **N²**, the linears' with "
    "**N**. At some length attention's time passes the linears'. Since 2024, engines get past the wall by skipping "
    "most of the attention matrix: MInference (per-head patterns), **XAttention** (antidiagonal block scoring, "
    "[arXiv 2503.16428](https://arxiv.org/abs/2503.16428)), FlexPrefill (blocks kept up to a cumulative threshold, "
    "[arXiv 2502.20766](https://arxiv.org/abs/2502.20766)). The engine here runs XAttention's scoring in plain "
    "torch, checked against dense attention; the measured backend runs it in C++ (the scores, the selection, the "
    "kept tiles on v8's brgemm kernel) where that was measured faster. "
    f"Prompts are the first N tokens of *{LONG_TEXT_NAME}*: prose that "
    "never repeats (repeated text makes attention look sparser than it is)."
)

# ---------------------------------------------------------------- the wall
st.header("1 · The wall, measured")
sizes = [n for n in DEFAULT_WALL_SIZES if n < context and (not policy.enabled or n <= policy.max_prompt_tokens)]
wall_backend = st.radio("Backend", BACKENDS, horizontal=True, key="long_wall_backend", format_func=BACKEND_NAMES.get)
st.caption(f"Sizes {', '.join(f'{n:,}' for n in sizes)} (to the model's context of {context:,}), one prefill each, "
           "clocked per op. Sizes that would pass a 3-minute budget are left out.")
if run_button("Measure the wall", type="primary", key="long_wall_run"):
    with run_guarded("The wall"), progress_bar("The wall") as update:
        save_result("long_wall", run_wall(loaded, sizes, progress=update, backend=wall_backend))
wall = get_result("long_wall")
if wall is not None and wall.points:
    st.caption(f"{wall.model_id} on {wall.device}, {wall.dtype}, {wall.backend} · {wall.elapsed_s:.0f} s"
               + (f" · {wall.stopped}" if wall.stopped else ""))
    left, right = st.columns(2)
    left.plotly_chart(figures.wall_figure(wall), key="long_wall_bars")
    right.plotly_chart(figures.share_figure(wall), key="long_wall_share")
    rates = wall.achieved_gflops()
    if wall.measured_crossover_tokens is None:
        crossover = "attention's time does not reach the linears' at any size measured or on the fits"
    elif wall.crossover_extrapolated:
        crossover = (f"attention's time stays below the linears' up to N = {wall.points[-1].num_tokens:,}; the fits "
                     f"put the crossover at about **{wall.measured_crossover_tokens:,.0f}** tokens (extrapolated)")
    else:
        crossover = f"attention's time passes the linears' at about **N = {wall.measured_crossover_tokens:,.0f}**"
    flop = (f"**{wall.flop_crossover_tokens:,}** tokens" if wall.flop_crossover_tokens else "no N below 131,072")
    faster = "slower" if rates["attention"] < rates["linears"] else "faster"
    st.markdown(
        f"Measured: {crossover}. The FLOP model puts it at {flop} (attention's causal FLOPs = the linears'). They "
        f"differ because a FLOP does not cost the same in both: at N = {wall.points[-1].num_tokens:,} attention ran "
        f"at **{rates['attention']:,.1f} GFLOP/s** and the linears at **{rates['linears']:,.1f} GFLOP/s**, so each "
        f"attention FLOP was {faster} here (64-wide heads, a softmax between two matmuls, and a causal mask that a "
        f"kernel only partly skips, against large, regular matrix products)."
    )
    if wall.ttft_fit is not None:
        fit = wall.ttft_fit
        st.plotly_chart(figures.ttft_fit_figure(wall), key="long_wall_fit")
        last = wall.points[-1].num_tokens
        st.markdown(f"TTFT ≈ {fit.a_s * 1e3:.0f} ms + {fit.b_s_per_token * 1e6:.1f} µs·N + "
                    f"{fit.c_s_per_token2 * 1e9:.3f} ns·N²: at N = {last:,} the N² term is "
                    f"{fit.c_s_per_token2 * last**2 / fit.predict([last])[0]:.0%} of the fit.")
    st.plotly_chart(figures.per_layer_figure(wall.points[-1]), key="long_wall_layers")
    downloads("long_prompt_wall", "long_wall_dl", table=pd.DataFrame(wall.as_json()["points"]), data=wall.as_json())

# ---------------------------------------------------------------- kept blocks
st.header("2 · Which blocks block-sparse prefill keeps")
st.markdown(
    "XAttention cuts the causal matrix into 128 × 128 tiles. For each head it **scores** every tile by the sums of "
    "antidiagonals of q kᵀ (one in every 16 × 16 square: 1/16 of the work of q kᵀ), then **keeps** the "
    "highest-scoring fraction of each query block's key blocks, always with the first block (the attention sink) "
    "and the diagonal. Below, the squares are the kept tiles; the colour is the attention the model really puts "
    "there, from a dense run's q and k."
)
columns = st.columns(3)
map_tokens = columns[0].select_slider("Prompt tokens", [512, 1024, 2048, 4096], value=1024, key="long_map_tokens")
last_layer = (loaded.info.num_layers - 1) if loaded else 29
map_layer = columns[1].number_input("Layer", 0, last_layer, min(10, last_layer), key="long_layer")
map_keep = columns[2].select_slider("Fraction of key blocks kept", [0.1, 0.2, 0.3, 0.5, 1.0],
                                    value=DEFAULT_KEEP_FRACTION, key="long_map_keep")
if run_button("Show the kept blocks", key="long_map_run"):
    with run_guarded("The block maps"):
        save_result("long_maps", block_maps(loaded, min(int(map_tokens), longest), int(map_layer), float(map_keep)))
maps = get_result("long_maps")
if maps is not None:
    selection = maps.selection
    st.caption(f"{selection.tiles_kept_fraction():.0%} of the causal tiles kept, "
               f"{1 - selection.pairs_kept_fraction():.0%} of attention's FLOPs skipped; the scores said the kept "
               f"tiles hold {selection.score_mass_kept():.0%} of the attention, the real maps say "
               f"{sum(maps.mass_kept_per_head()) / len(maps.mass_kept_per_head()):.0%}.")
    st.plotly_chart(figures.kept_blocks_figure(maps), key="long_maps_figure")

# ---------------------------------------------------------------- trade-off and Amdahl
st.header("3 · Speed against quality, and the Amdahl cap")
trade_sizes = [n for n in (1024, 2048, 4096) if n <= longest] or [longest]
trade_tokens = st.select_slider("Prompt tokens", trade_sizes, value=trade_sizes[-1], key="long_trade_tokens")
trade_backend = st.radio("Backend, dense and sparse alike", BACKENDS, horizontal=True, key="long_trade_backend",
                         format_func=BACKEND_NAMES.get)
st.caption(f"Keep fractions {', '.join(f'{k:g}' for k in TRADE_OFF_KEEPS)}, each against dense on the same "
           f"backend: 32 greedy tokens each, the first token on {QUALITY_PROMPTS} stretches of the book, then 3 "
           "alternating timed prefills. The measured backend shows what tuning buys over the textbook's.")
if run_button("Measure the trade-off", key="long_trade_run"):
    with run_guarded("The trade-off"), progress_bar("The trade-off") as update:
        save_result("long_trade", compare_dense_sparse(loaded, min(int(trade_tokens), longest), TRADE_OFF_KEEPS,
                                                       progress=update, backend=trade_backend))
trade = get_result("long_trade")
if trade:
    table = pd.DataFrame([{
        "keep": c.keep_fraction, "FLOPs skipped": f"{c.attention_flops_skipped_fraction:.0%}",
        "KL (nats)": f"{c.first_token_kl:.2g}", "top-1 agrees": c.top1_agree,
        "top-1 agrees, prompts": f"{c.top1_agree_prompts} of {c.quality_prompts}",
        "KL, largest of the prompts": f"{max(c.first_token_kl_prompts, default=c.first_token_kl):.2g}",
        "greedy agree / 32": c.greedy_agree_32,
        "attention s dense → sparse": f"{c.dense_attention_s:.2f} → {c.sparse_attention_s:.2f}",
        "attention speedup": f"{c.attention_speedup:.2f}×",
        "TTFT s dense → sparse": f"{c.dense_ttft_s:.2f} → {c.sparse_ttft_s:.2f}",
        "TTFT speedup": f"{c.ttft_speedup:.2f}×"} for c in trade])
    st.dataframe(table, hide_index=True)
    st.plotly_chart(figures.trade_off_figure(trade), key="long_trade_figure")
    base = trade[0]
    share = sum(c.attention_share for c in trade) / len(trade)
    best = max(trade, key=lambda c: c.ttft_speedup)
    st.markdown(
        f"At N = {base.num_tokens:,}, attention is **{share:.0%}** of the dense time to first token here "
        f"({base.model_id}, {base.device}, {base.dtype}). Amdahl's law: even if attention took no time, the prefill "
        f"could be at most **{1 / (1 - share):.2f}×** faster. The best setting measured, keep "
        f"{best.keep_fraction:g}, made attention {best.attention_speedup:.2f}× faster (Amdahl predicts "
        f"{best.amdahl_prediction:.2f}× end to end from that) and the time to first token "
        f"**{best.ttft_speedup:.2f}×** faster, at a first-token KL of {best.first_token_kl:.2g} nats."
    )
    st.caption(f"Ran on: {base.backend}.")
    downloads("sparse_trade_off", "long_trade_dl", table=table, data=[c.as_json() for c in trade])
