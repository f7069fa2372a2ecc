"""Disaggregated prefill: a prefill worker and a decode worker, and the KV cache sent between them."""

import streamlit as st

from prefillviz.analysis import flop_facts
from prefillviz.disagg.experiment import SETUPS, compare_setups
from prefillviz.experiments.chunked import build_workload
from prefillviz.figures import chunked as chunked_figures
from prefillviz.figures import disagg as figures
from prefillviz.ui.output_checks import same_tokens_block
from prefillviz.ui.results import downloads, figure_section, get_result, save_result
from prefillviz.ui.running import progress_callback, run_guarded, run_label
from prefillviz.ui.shell import page_frame, run_button, stop_page
from prefillviz.ui.workload_controls import workload_controls

loaded = page_frame()

st.title("Disaggregated prefill: prefill on one worker, decode on another")
st.markdown(
    "Chunked prefill is one answer to a long prompt blocking everyone who is decoding. **Disaggregation** is the "
    "other (DistServe, OSDI'24; vLLM and NVIDIA Dynamo deployments): a **prefill worker** runs each prompt and "
    "samples its first token, then sends that request's **KV cache**, K and V of every layer, to a **decode worker**, "
    "which writes it into blocks of its own and decodes from there. Below, both are real processes, each with its own "
    "engine, paged KV cache and copy of the model; the K/V travels through `torch.distributed` (gloo on a CPU, NCCL "
    "between GPUs). The same workload as the Chunked prefill page runs three ways, greedy."
)

st.subheader("Workload")
choice = workload_controls(
    "disagg", arrival_help="One engine: after this many steps. "
    "Disaggregated: once every short request has this many tokens."
)

if run_button("Run one engine (chunking off, on), then disaggregated", type="primary",
                                    key="disagg_run"):
    with run_guarded("The disaggregated run"):
        work = build_workload(loaded.tokenizer, choice.num_short, choice.short_tokens, choice.short_new,
                              choice.long_tokens, 4, choice.arrival, choice.budget)
        progress = progress_callback(work.estimated_num_steps(False) + work.estimated_num_steps(True),
                                     "One engine, chunking off, then on")
        with st.spinner("Starting the prefill and decode workers (each loads the model) and running the workload…"):
            comparison = compare_setups(loaded, work, progress)
        save_result("disagg", {"comparison": comparison, "label": run_label(loaded, "none")})

result = get_result("disagg")
if result is None:
    stop_page()

comparison, label = result["comparison"], result["label"]
run, work, summaries = comparison.disagg, comparison.workload, comparison.summaries
report = comparison.as_json()
st.caption(
    f"Last run: {len(work.short_prompts)} short request(s) + {work.short_max_new_tokens} new tokens each; long prompt "
    f"{len(work.long_prompt):,} tokens; token budget {work.token_budget}. {comparison.threads_label}. "
    f"{run.spec.placement.label}. The workers took {run.start_s:.1f} s to start (not in any latency). "
    f"One engine: {label}."
)

columns = st.columns(4)
for column, setup in zip(columns, SETUPS):
    column.metric(f"Max ITL, {setup}", f"{summaries[setup].itl_max_ms:,.0f} ms",
                  help="The worst gap between two tokens of a decoding user")
columns[3].metric("KV sent for the long prompt", f"{report['kv_bytes_sent_per_request']['long'] / 1e6:,.1f} MB",
                  help=f"in {report['transfer_s_long'] * 1000:,.1f} ms")

gantt = figures.gantt_figure(run, "Disaggregated: the prefill worker, the decode worker and the KV transfers")
figure_section(
    "Who ran what, on which worker",
    "One lane per worker, one bar per engine step: **blue** = a prefill step (the requests it prefilled), **orange** = "
    "a decode step (how many users got a token). A **green line** is one request's KV cache on its way from the "
    "prefill worker to the decode worker. The decode lane keeps going while the long prompt is prefilled.",
    gantt, "disagg_gantt",
)
downloads("disagg_gantt", "disagg_gantt_dl", figure=gantt, table=comparison.transfer_rows())

st.subheader("The three set-ups side by side")
rows = chunked_figures.latency_rows(summaries)
one_decimal = {name: st.column_config.NumberColumn(format="%.1f") for name in rows[0] if name.endswith("(ms)")}
st.dataframe(rows, hide_index=True, column_config=one_decimal, key="disagg_latency_table")
latency = chunked_figures.latency_figure(summaries, "Latency: one engine (chunking off, on) vs disaggregated (ms)")
st.plotly_chart(latency, key="disagg_latency")
gaps = figures.gaps_figure(comparison, "The decoding users' gaps between tokens, around the long prompt's arrival")
st.plotly_chart(gaps, key="disagg_gaps")
request_rows = comparison.request_rows()
st.dataframe(request_rows, hide_index=True,
             column_config={n: st.column_config.NumberColumn(format="%.1f")
                            for n in request_rows[0] if n.endswith("(ms)")},
             key="disagg_request_table")
downloads("disagg_latency", "disagg_latency_dl", figure=latency, table=request_rows, data=report)

st.subheader("The KV cache on the wire")
st.markdown(
    f"Bytes per request = **KV bytes per token × prompt tokens** = 2 (K, V) × layers × KV heads × head dim × bytes "
    f"per element × tokens = **{comparison.kv_bytes_per_token:,} B** × tokens here. Median transfer "
    f"**{report['transfer_s_median'] * 1000:,.2f} ms**; the long prompt's **{report['transfer_gb_s_long']:,.2f} GB/s**."
)
transfer_rows = comparison.transfer_rows()
st.dataframe(transfer_rows, hide_index=True, key="disagg_transfer_table")
if comparison.bytes_match_formula and comparison.kv_bit_identical:
    st.success("Every request's bytes equal the formula × its prompt tokens, "
               "and the decode worker received the K/V bit for bit as sent.")
else:
    st.error("A transfer did not match: see the table (bytes against the formula, "
             "and the digests of what was sent and received).")

st.subheader("Same tokens every way")
checks = comparison.output_checks
same_model = loaded is not None and loaded.model_id == comparison.model_id
shown = (lambda ids: repr(loaded.tokenizer.decode(ids))) if same_model else str
same_tokens_block(
    [("", check) for check in checks], shown, ("one engine, chunking off", "disaggregated"), "disagg_output_table",
    f"Identical outputs: all {len(checks)} requests generated the same tokens on one engine and disaggregated.",
    f"The workers run on fewer threads, so their matmuls round differently, and in {comparison.dtype} that was enough "
    "to flip a near-tie between the top two tokens. float32 (sidebar) makes this much rarer.",
)

st.subheader("When disaggregation pays, and when it does not")
placement = run.spec.placement
if placement.devices[0] != placement.devices[1]:
    here = (
        f"- **Here each worker had a device of its own** ({placement.label}): the set-up disaggregation is built for. "
        "The price left is the transfer and the second copy of the model."
    )
elif placement.devices[0] == "cpu":
    here = (
        "- **It does not pay on one small machine**, as here: the two workers split the same CPU cores, so each prompt "
        "prefills on part of them (a longer TTFT than one engine), every request pays a copy and a transfer, the model "
        "is loaded twice, and the decode worker's cores idle when nobody is decoding. Chunked prefill on one engine "
        "uses the whole machine for whatever is running."
    )
else:
    here = (
        f"- **It does not pay on one shared device**, as here ({placement.label}): both workers compete for the same "
        "chip, the K/V leaves the device and comes back through host memory, and the model is loaded twice. Chunked "
        "prefill on one engine uses the whole device for whatever is running."
    )
long_tokens = len(comparison.workload.long_prompt)
if same_model:  # bytes per FLOP: flat while the prefill's FLOPs grow like N, falling once attention's N² counts
    transfer_words = (
        f"the bytes grow like the prompt (the formula above); the prefill's FLOPs like the prompt plus attention's N² "
        f"term, {100 * flop_facts.attention_share(loaded, long_tokens):.1f}% of them at {long_tokens:,} tokens. So the "
        "bytes per FLOP stay nearly flat until attention's share is large, near "
        f"{flop_facts.attention_crossover_tokens(loaded):,} tokens for {loaded.model_id}: only well past that does a "
        "longer prompt make the transfer cheaper next to its prefill."
    )
else:
    transfer_words = ("the bytes grow like the prompt, the prefill's FLOPs like the prompt plus attention's N² term: "
                      "the transfer gets cheaper next to the prefill only once that term is a large share.")
st.markdown(
    "- **It pays on separate hardware**: the prefill GPUs run compute-bound prompts at full batch, the decode GPUs run "
    "memory-bound token steps, and neither waits for the other: the decoding users' gaps stay flat when a long prompt "
    "arrives (the green dots above), with no token budget to tune.\n"
    f"- **…and when the transfer is cheap next to the prefill**: {transfer_words} **NVLink** (NVIDIA's link between "
    "the GPUs of one server) moves hundreds of GB/s each way, an **RDMA** network card (it writes into another "
    "machine's memory without its CPU) tens of GB/s: a few hundred MB move in milliseconds there.\n"
    f"{here}\n"
    "- The numbers on this page are this run's; docs/DISAGGREGATED.md does the arithmetic for a 70B-class model."
)
