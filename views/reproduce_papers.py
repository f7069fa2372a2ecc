"""Reproduce the papers: five published prefill results run again on the model in front of you,
beside the paper's own numbers (re-plotted from the files its authors published)."""

import streamlit as st

from prefillviz.disagg.experiment import SETUPS
from prefillviz.experiments import papers_published as published
from prefillviz.experiments.chunked import WORKLOAD_DEFAULTS, build_workload
from prefillviz.experiments.model_setup import device_and_dtype
from prefillviz.experiments.papers_chunk_cost import run_chunk_cost
from prefillviz.experiments.papers_knee import DEFAULT_SIZES, run_knee
from prefillviz.experiments.papers_piggyback import run_piggyback
from prefillviz.experiments.papers_prefix_blocks import prefix_lengths, run_block_hits, run_long_output_saving
from prefillviz.figures import papers as figures
from prefillviz.lessons.kinds.papers_knee import flat_part_text, weights_read_ms
from prefillviz.loading import bundled
from prefillviz.loading.hosted import hosted_policy
from prefillviz.measure.papers_interference import run_interference
from prefillviz.measure.peaks_history import machine_peaks
from prefillviz.peers import papers_vllm
from prefillviz.peers.vllm_client import VLLMWorker, unavailable_for
from prefillviz.ui.results import downloads, get_result, save_result
from prefillviz.ui.running import progress_bar, run_guarded, run_label
from prefillviz.ui.shell import page_frame, run_button
from prefillviz.ui.vllm_panel import _worker

loaded = page_frame()
most_points = hosted_policy().limit("sweep_points", 64)  # hosted mode caps every sweep

st.title("Reproduce the papers")
st.markdown(
    "Serving engines were shaped by a few published measurements about prefill. Each section runs one again on the "
    "model you picked, on this machine, and draws the paper's own numbers beside ours, read from the file its authors "
    "published (**dashed**: the paper; **solid**: ours; **dotted**: vLLM). Sarathi-Serve measured Yi-34B on two A100 "
    "GPUs (tensor parallel 2) and DistServe's simulator models OPT-13B on one A100; here it is "
    f"{loaded.model_id if loaded is not None else 'the model in the sidebar'} on "
    f"{loaded.device if loaded is not None else 'this machine'}, so the figures compare ratios and normalised curves, "
    "not milliseconds. The default prompt lengths below are shorter than the papers', so that every section runs in "
    "a short while on any machine; raise them where the runs are quick."
)


def source_caption(name: str) -> None:
    source = published.SOURCES[name]
    note = f" ({source.note})" if source.note else ""
    st.caption(f"Published numbers: [{source.repo} `{source.path}`]({source.url}) "
               f"at commit `{source.commit[:10]}`; {source.model} on {source.hardware}{note}.")


def vllm_button(key: str) -> bool:
    """The "Run on vLLM too" button, or why vLLM can't run here (no button then)."""
    reason = unavailable_for(loaded.model_id, loaded.device.type) if loaded is not None else "Load a model first."
    if reason:
        st.info(f"Run on vLLM too: {reason}", icon=":material/info:")
        return False
    return st.button("Run on vLLM too", key=key,
                     help="Starts vLLM once per app process (10-25 s), then runs the same token ids on it")


def vllm_worker() -> VLLMWorker:
    return _worker(device_and_dtype(loaded.model)[1])


def show(name: str, figure, rows: list[dict], data=None) -> None:
    st.plotly_chart(figure, key=f"{name}_figure")
    downloads(name, f"{name}_dl", figure=figure, table=rows, data=data)


# ---------------------------------------------------------------- 1. piggyback
st.header("1. Decodes ride along a prefill almost for free")
st.markdown(
    "Sarathi-Serve (OSDI'24), Table 2: one engine step with a **decode-only** batch of 4 users, a **prefill chunk of C "
    "tokens** alone, and **C−3 prompt tokens + 3 decodes**. Time per token = step time / tokens in the step. A decode "
    "step reads every weight to make 4 tokens; the mixed step reads them once for C tokens."
)
source_caption("piggyback")
chunk_tokens = st.select_slider("Chunk C (tokens)", [64, 128, 256, 512, 1024], 256, key="papers_piggyback_chunk")
if run_button("Time the three steps", type="primary", key="papers_piggyback_run"):
    with run_guarded("The piggyback run"), progress_bar("Three kinds of step") as report:
        save_result("papers_piggyback", {"result": run_piggyback(loaded, chunk_tokens, 3, report),
                                         "label": run_label(loaded, "none")})
if (saved := get_result("papers_piggyback")) is not None:
    result = saved["result"]
    columns = st.columns(3)
    columns[0].metric("Decode token, decode-only step", f"{result.decode_only_per_token_ms:,.2f} ms")
    columns[1].metric("Decode token riding along", f"{result.mixed_per_token_ms:,.3f} ms")
    columns[2].metric("Ratio (the paper's)", f"{result.ratio:,.1f}× ({published.piggyback_ratio():,.1f}×)")
    st.caption(f"Medians of {result.runs} interleaved runs after a warm-up, "
               f"C = {result.chunk_tokens:,} · {saved['label']}.")
    show("papers_piggyback", figures.piggyback_figure(result, "Time per token of each step, over the prefill chunk's"),
         result.rows())
    if vllm_button("papers_piggyback_vllm"):
        with run_guarded("The vLLM run"), progress_bar("vLLM: three kinds of step") as report:
            save_result("papers_piggyback_vllm", papers_vllm.vllm_piggyback(
                vllm_worker(), loaded.tokenizer, loaded.model.config.vocab_size, result.chunk_tokens, 3, report))
    if (theirs := get_result("papers_piggyback_vllm")) is not None:
        st.markdown(f"**{theirs.model_id}**: "
                    f"a decode token costs {theirs.ratio:,.1f}× more in a decode-only step than riding along.")
        show("papers_piggyback_vllm",
             figures.piggyback_figure(theirs, f"{theirs.model_id}: time per token of each step"), theirs.rows())

# ---------------------------------------------------------------- 2. chunk cost
st.header("2. What chunking costs the prefill itself")
st.markdown(
    "Sarathi-Serve, Figure 9a: a prompt of N tokens prefilled in one step, and in chunks. Small chunks cost more: "
    "**every chunk reads all the weights again** (N/c times instead of once), and **every chunk after the first "
    "re-reads the K/V the chunks before it cached**, in smaller matrix multiplications that use the hardware less "
    "well. The paper ran N = 2k-16k (its rows per prompt length are in the CSV the caption names: the chunk sizes "
    "rank differently at different lengths, and at 2k a chunk of 2,048 is the whole prompt); the defaults here are "
    "512-2,048."
)
source_caption("chunk_cost")
row = st.columns(2)
prompt_sizes = row[0].multiselect("Prompt lengths N", [256, 512, 1024, 2048, 3072, 4096], [512, 1024, 2048],
                                  key="papers_chunk_prompts", max_selections=most_points)
chunk_sizes = row[1].multiselect("Chunk sizes", [64, 128, 256, 512, 1024, 2048], [128, 256, 512, 1024],
                                 key="papers_chunk_sizes", max_selections=most_points)
if run_button("Prefill whole and in chunks", type="primary", key="papers_chunk_run"):
    with run_guarded("The chunk-cost run"), progress_bar("Whole and chunked prefills") as report:
        save_result("papers_chunk_cost", {"result": run_chunk_cost(loaded, prompt_sizes, chunk_sizes, 2, report),
                                          "label": run_label(loaded, "none")})
if (saved := get_result("papers_chunk_cost")) is not None:
    result = saved["result"]
    st.caption(f"Medians of {result.runs} interleaved runs after a warm-up · {saved['label']}.")
    show("papers_chunk_cost", figures.chunk_cost_figure(result, "Prefill in chunks: time over the whole prefill's"),
         result.rows())
    if vllm_button("papers_chunk_vllm"):
        sizes = sorted({p.prompt_tokens for p in result.points})
        with run_guarded("The vLLM run"), progress_bar("vLLM: whole and chunked prefills") as report:
            save_result("papers_chunk_cost_vllm", papers_vllm.vllm_chunk_cost(
                vllm_worker(), loaded.tokenizer, loaded.model.config.vocab_size, sizes, result.chunk_sizes, 2, report))
    if (theirs := get_result("papers_chunk_cost_vllm")) is not None:
        show("papers_chunk_cost_vllm",
             figures.chunk_cost_figure(theirs, f"{theirs.model_id}: prefill in chunks over whole"), theirs.rows())

# ---------------------------------------------------------------- 3. knee
st.header("3. Where prefill turns compute-bound")
st.markdown(
    "Time to first token against N, finely at small N. A step pays costs that hardly depend on N (reading every "
    "weight once, launching its kernels, the host's Python): while those outweigh the math, TTFT is **flat**; past "
    "the **knee** it grows with N. The roofline predicts the knee where reading the weights is the floor: the N whose "
    "FLOPs per byte reach this machine's **ridge point** (its measured matmul peak over its measured bandwidth). "
    "Sarathi-Serve's Figure 2 (Yi-34B, two A100 GPUs, tensor parallel 2) is not a smooth fall to a floor: time per "
    "prompt token rises from 128 to 256 tokens, is lowest from 512 to 4k and rises again past 4k; the A100's bf16 "
    "ridge (312 TFLOP/s over about 1.9 TB/s, NVIDIA's datasheet) is about 160 tokens. "
    "[vllm#7635](https://github.com/vllm-project/vllm/issues/7635) reports a flat TTFT of about 100 ms below 400 "
    "tokens (Llama-3-8B on V100 GPUs), the same at tensor parallel 1, 2 and 4: a floor set by reading the weights "
    "would halve with each doubling, so there it is fixed per-request overhead. The caption under the chart says "
    "which it is here: the weights' read time at this machine's measured bandwidth, beside the flat part."
)
source_caption("knee")
knee_sizes = st.multiselect("Prompt lengths N", [2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024],
                            list(DEFAULT_SIZES)[::-1][:most_points][::-1], key="papers_knee_sizes",
                            max_selections=most_points)
if run_button("Measure TTFT against N", type="primary", key="papers_knee_run"):
    with run_guarded("The knee sweep"), progress_bar("TTFT against N") as report:
        report(0.0, "reading (or measuring) this machine's peaks")
        peaks = machine_peaks(*device_and_dtype(loaded.model))
        save_result("papers_knee", {"result": run_knee(loaded, knee_sizes, 3, peaks, report),
                                    "label": run_label(loaded, "none")})
if (saved := get_result("papers_knee")) is not None:
    result = saved["result"]
    if vllm_button("papers_knee_vllm_run"):
        with run_guarded("The vLLM run"), progress_bar("vLLM: TTFT against N") as report:
            save_result("papers_knee_vllm", papers_vllm.vllm_knee(
                vllm_worker(), loaded.tokenizer, loaded.model.config.vocab_size, result.sizes, 3, report))
    theirs = get_result("papers_knee_vllm")
    columns = st.columns(3)
    columns[0].metric("Knee of the measured TTFT", f"N ≈ {result.fit.knee_tokens:,.0f}")
    columns[1].metric("Roofline ridge (measured peaks)", f"N ≈ {result.ridge_tokens:,}",
                      help=f"{result.peaks.ridge_intensity:,.1f} FLOP/byte")
    columns[2].metric("vLLM's knee", f"N ≈ {theirs.fit.knee_tokens:,.0f}" if theirs else "not run")
    st.caption("Medians of 3 interleaved runs after a warm-up; "
               f"the fit is t = a + b·max(0, N − knee) · {saved['label']}. The flat part: "
               f"{flat_part_text(weights_read_ms(loaded.model, result.peaks), result.fit.flat_ms)}.")
    rows = result.rows() + ([{**r, "engine": theirs.model_id} for r in theirs.rows()] if theirs else [])
    show("papers_knee", figures.knee_figure(result, theirs, "Time to first token against N (ms)"), rows)
    st.plotly_chart(
        figures.knee_per_token_figure(result, theirs, "Time per prompt token: Sarathi-Serve Figure 2's view"),
        key="papers_knee_per_token"
    )

# ---------------------------------------------------------------- 4. prefix blocks
st.header("4. Prefix caching works in whole blocks")
st.markdown(
    "Two requests share a prefix of L tokens, then differ. The second reuses only the prefix's **full** blocks: a "
    "block's hash covers all of its tokens, so a prefix one token short of a block gets **no** hit. vLLM does the same "
    "([vllm#3942](https://github.com/vllm-project/vllm/issues/3942): token-level reuse is not feasible; "
    "[vllm#40696](https://github.com/vllm-project/vllm/issues/40696): on Mamba-hybrid models such as Qwen3.5, whose "
    "attention blocks vLLM sizes to 528 tokens to match the Mamba state's pages, prompts under 528 tokens never "
    "hit). And a hit skips prefill only: with long outputs it saves a small share of the request's time."
)
row = st.columns(4)
block_sizes = row[0].multiselect("Block sizes", [8, 16, 32, 64], [16, 32], key="papers_block_sizes",
                                 max_selections=most_points)
prefix_tokens = row[1].number_input("Long-output run: shared prefix (tokens)", 16, 2048, 256,
                                    key="papers_prefix_tokens")
output_tokens = row[2].number_input("… tokens generated", 1, 256, 32, key="papers_output_tokens")
if run_button("Run the prefixes", type="primary", key="papers_prefix_run"):
    with run_guarded("The prefix-block run"), progress_bar("Shared prefixes") as report:
        hits = run_block_hits(loaded, block_sizes, None, report)
        report(1.0, f"the same request with the cache on and off, {output_tokens} new tokens")
        saving = run_long_output_saving(loaded.model, loaded.tokenizer, int(prefix_tokens), int(output_tokens),
                                        loaded.model_id)
        save_result("papers_prefix_blocks", {"hits": hits, "saving": saving, "label": run_label(loaded, "none")})
if (saved := get_result("papers_prefix_blocks")) is not None:
    hits, saving = saved["hits"], saved["saving"]
    if vllm_button("papers_prefix_vllm"):
        lengths = prefix_lengths([32, 64])
        with run_guarded("The vLLM run"), progress_bar("vLLM at block sizes 32 and 64") as report:
            runs = [papers_vllm.vllm_block_hits(vllm_worker(), loaded.tokenizer, loaded.model.config.vocab_size,
                                                lengths, report)]
            with VLLMWorker(bundled.bundled_cache_dir(), dtype=device_and_dtype(loaded.model)[1],
                            block_size=64) as worker:
                runs.append(papers_vllm.vllm_block_hits(worker, loaded.tokenizer, loaded.model.config.vocab_size,
                                                        lengths, report))
            save_result("papers_prefix_blocks_vllm", [run_block_hits(loaded, [32, 64], lengths), *runs])
    theirs = get_result("papers_prefix_blocks_vllm") or []
    sizes = sorted({p.block_size for p in hits.points})
    columns = st.columns(len(sizes))
    for column, b in zip(columns, sizes):
        column.metric(f"Block {b}: prefix of {b - 1} / {b} tokens",
                      f"{hits.cached(b, b - 1) if b > 1 else 0} / {hits.cached(b, b)} cached")
    show("papers_prefix_blocks",
         figures.block_hits_figure([hits, *theirs], "Share of the shared prefix served from the cache"),
         hits.rows() + [r for t in theirs for r in t.rows()])
    if theirs:
        st.caption("vLLM's CPU attention needs blocks of a multiple of 32: "
                   "the vLLM lines (dotted) are at 32 and 64, next to ours at the same sizes.")
    st.subheader("A high hit rate, long outputs")
    columns = st.columns(3)
    columns[0].metric("Prompt tokens from the cache", f"{saving.cached_tokens} of {saving.prompt_tokens}")
    columns[1].metric("TTFT saved", f"{saving.ttft_saved_percent:.0f}%",
                      help=f"{saving.ttft_off_ms:,.0f} → {saving.ttft_on_ms:,.0f} ms")
    columns[2].metric(f"Whole request saved ({saving.output_tokens} tokens)", f"{saving.total_saved_percent:.0f}%",
                      help=f"{saving.total_off_ms:,.0f} → {saving.total_on_ms:,.0f} ms")
    show("papers_long_output",
         figures.long_output_figure(saving, "What the hit saved, had the request stopped after k tokens"),
         saving.curve())

# ---------------------------------------------------------------- 5. interference
st.header("5. Interference, and when disaggregation pays")
st.markdown(
    "DistServe (OSDI'24): on one engine a long prefill stalls everyone decoding (**interference**); a prefill worker "
    "and a decode worker never share a step. These are the **Disaggregated page's runs** (one engine with chunking off "
    "and on, then the two workers), repeated as the long prompt grows: the decoding users' worst gap over their median "
    "gap, and the **crossover** where disaggregation's worst gap beats one engine's. DistServe's figure points are not "
    "in its repository; the dashed line is its simulator's fitted model of a colocated engine (OPT-13B on an A100)."
)
source_caption("interference")
long_sizes = st.multiselect("Long prompt lengths", [32, 64, 128, 256, 512, 1024, 2048], [64, 256, 1024],
                            key="papers_interference_sizes", max_selections=most_points)
if run_button("Run the three set-ups at each length", type="primary", key="papers_interference_run"):
    with run_guarded("The interference sweep"), progress_bar("One engine, then the two workers, per length") as report:
        workload = build_workload(loaded.tokenizer, **{**WORKLOAD_DEFAULTS.as_dict(), "short_max_new_tokens": 12,
                                                       "long_max_new_tokens": 2})
        save_result("papers_interference", {"sweep": run_interference(loaded, workload, long_sizes, report),
                                            "label": run_label(loaded, "none")})
if (saved := get_result("papers_interference")) is not None:
    sweep = saved["sweep"]
    crossover = sweep.crossover()
    columns = st.columns(3)
    columns[0].metric("Disaggregated beats chunking off from", f"N = {crossover:,}" if crossover else "none of these")
    on_crossover = sweep.crossover(SETUPS[1])
    columns[1].metric("… beats chunking on from", f"N = {on_crossover:,}" if on_crossover else "none of these")
    columns[2].metric("Same tokens in every set-up",
                      "yes" if all(p.comparison.outputs_equal for p in sweep.points) else "no")
    st.caption(f"{sweep.points[-1].comparison.threads_label}. "
               f"{sweep.points[-1].comparison.disagg.spec.placement.label}. {saved['label']}.")
    show("papers_interference",
         figures.interference_figure(sweep, "Interference: the decoding users' worst gap over their median"),
         sweep.rows())
    st.plotly_chart(figures.worst_gap_figure(sweep, "The decoding users' worst gap, per set-up (ms)"),
                    key="papers_worst_gap")
    st.caption("vLLM is not run here: it has no disaggregated mode on a CPU. "
               "The Disaggregated page shows each run in full.")
