"""Your server: the prefill views for any OpenAI-compatible server (vLLM, SGLang, TGI, llama.cpp), measured from
outside."""

import pandas as pd
import streamlit as st

from prefillviz.engine.errors import ConfigError
from prefillviz.figures import probe as figures
from prefillviz.figures import probe_load as load_figures
from prefillviz.loading.hosted import hosted_policy
from prefillviz.probe.client import ProbeBudget
from prefillviz.probe.load_sweep import LoadSettings, load_sweep
from prefillviz.probe.report import DEFAULT_SIZES, EXPERIMENTS, WHAT_OUTSIDE_CAN_MEASURE, ProbeSettings, probe_server
from prefillviz.ui.results import downloads, figure_section, get_result, save_result
from prefillviz.ui.running import progress_bar, run_guarded
from prefillviz.ui.shell import page_frame, stop_page

page_frame()  # the sidebar; the probe itself doesn't use the local model

st.title("Your server: prefill, chunking and the prefix cache in your own deployment")
st.markdown(
    "The other pages run a small engine here. Your real one runs elsewhere: **vLLM, SGLang, TGI or llama.cpp's "
    "server**, often on GPUs and many machines. Give its OpenAI-compatible URL and the probe measures it from outside, "
    "with the same experiments: **time to first token against prompt length**, a **prefix-cache** miss and hit, and "
    "what a long prompt does to the **gaps between other users' tokens**, "
    "next to what the server counted itself at `/metrics`."
)
with st.expander("What can and can't be measured from outside"):
    st.markdown(WHAT_OUTSIDE_CAN_MEASURE)
    st.markdown(
        "No server at hand? `make vllm-serve` starts real vLLM with the bundled model on http://127.0.0.1:8000 "
        "(after `make vllm`)."
    )

policy = hosted_policy()
if policy.enabled and not policy.allowed_probe_urls:
    st.info(
        "Probing a server is off in this hosted demo: a public page that fetched any URL it is given would let "
        "strangers reach the host's private network. Run prefillviz on your own machine to probe yours."
    )
    stop_page()

st.subheader("Server")
row = st.columns([3, 2, 2])
default_url = policy.allowed_probe_urls[0] if policy.enabled else "http://127.0.0.1:8000"
if policy.enabled:
    url = row[0].selectbox("Server URL (this demo's allow-list)", policy.allowed_probe_urls, key="probe_url")
else:
    url = row[0].text_input("Server URL", value=default_url, key="probe_url", help="with or without /v1, e.g. http://127.0.0.1:8000")
model = row[1].text_input("Model name", value="", key="probe_model",
                          help="as the server names it; empty: the first it lists")
api_key = row[2].text_input("API key (if it needs one)", value="", type="password", key="probe_api_key")

st.subheader("Experiments")
row = st.columns(4)
chosen = row[0].multiselect("Run", EXPERIMENTS, default=list(EXPERIMENTS), key="probe_experiments",
                            format_func={"ttft": "TTFT vs N", "prefix": "prefix cache",
                                         "interference": "interference"}.get)
sizes = row[1].multiselect("Prompt lengths N (tokens)", DEFAULT_SIZES, default=[64, 128, 256, 512, 1024],
                           key="probe_sizes", help="those that fit the server's context are run")
runs = row[2].slider("Runs per point (medians)", 1, 7, 3, key="probe_runs")
streams = row[3].slider("Streams generating when the long prompt arrives", 1, 6, 3, key="probe_streams")

if st.button("Probe the server", type="primary", key="probe_run"):
    with run_guarded("The probe", queue=False):
        if not chosen:
            raise ConfigError("Pick at least one experiment.")
        policy.check_probe_url(url)
        settings = ProbeSettings(sizes=tuple(sizes) or None, runs=runs, num_streams=streams, experiments=tuple(chosen))
        budget = ProbeBudget(max_requests=policy.limit("probe_requests", 200))
        budget.max_prompt_tokens = policy.limit("probe_prompt_tokens", budget.max_prompt_tokens)
        with progress_bar("Probing") as update:
            report = probe_server(url, model.strip() or None, settings, progress=update, budget=budget,
                                  api_key=api_key or None)
        save_result("probe", report)


def show_probe(report) -> None:
    """The one-request experiments' results (kept in the session until the next probe)."""
    server = report.server
    st.success(
        f"Measured **{server['model']}** at {server['url']} "
        f"({server.get('version') and 'version ' + server['version'] or 'version not reported'}"
        f"{', server ' + server['server_header'] if server.get('server_header') else ''}): {report.requests_sent} "
        f"requests, {report.prompt_tokens_sent:,} prompt tokens. Times are this machine's clock, network included: "
        "streamed answers timed chunk by chunk, medians over the runs, after two warm-up requests."
    )

    if report.ttft:
        figure = figure_section("Time to first token against prompt length",
                                "Unique prompts (each starts with its own tag), so no prefix cache helps; "
                                "`max_tokens=1`, streamed. A straight line is a fixed cost plus a cost per token. An "
                                "upward bend may be attention's N² share, or a GPU that is under-used by short prompts "
                                "(TTFT flat) and then fills up (TTFT rising): the Parallel vs token-by-token page "
                                "compares the bend with what attention's FLOPs predict for a model it runs.",
                                figures.ttft_figure(report), "probe_ttft_chart", caption=True)
        table = [{"num_tokens": p.num_tokens, "target_tokens": p.target_tokens, "ttft_ms_median": p.ttft_s_median * 1e3,
                  "runs_ms": [round(t * 1e3, 2) for t in p.runs]} for p in report.ttft]
        st.dataframe(pd.DataFrame(table), hide_index=True)
        if (server_mean := report.server_ttft_s_mean()) is not None:
            client_mean = report.client_ttft_s_mean()
            st.caption(f"The server timed these first tokens at {server_mean * 1e3:,.0f} ms on average (its own TTFT "
                       f"histogram); this client saw {client_mean * 1e3:,.0f} ms: "
                       "the difference is the network and the HTTP layers.")
        downloads("server_ttft", "probe_ttft", figure=figure, table=table)

    if report.prefix:
        figure = figure_section("The prefix cache",
                                "One long prefix, twice, with different suffixes. A server with prefix caching "
                                "computes the prefix only the first time; whole cached blocks are reused, "
                                "so the hit covers the prefix rounded down to its block size.",
                                figures.prefix_figure(report), "probe_prefix_chart", caption=True)
        downloads("server_prefix", "probe_prefix", figure=figure, data=report.to_json())

    if report.interference:
        result = report.interference
        figure = figure_section("A long prompt arrives while others are decoding",
                                "The streams' gaps between tokens, before and while the long prompt is prefilled. A "
                                "server that runs the whole prompt in one step stalls every stream for that long; "
                                "chunked prefill caps the stall at one chunk.",
                                figures.interference_figure(report), "probe_interference_chart", caption=True)
        cols = st.columns(3)
        cols[0].metric("Worst gap before (ms)", f"{result.itl_max_ms(False):,.0f}")
        cols[1].metric("Worst gap during (ms)", f"{result.itl_max_ms(True):,.0f}")
        cols[2].metric("Long prompt's TTFT (ms)", f"{result.ttft_long_s * 1e3:,.0f}")
        if not result.streams_outlived_long_prompt:
            st.warning("A stream ended before the long prompt's first token: "
                       "the 'during' gap may miss part of its prefill.")
        gaps = [{"stream": i + 1, "end_s": end, "gap_ms": length * 1e3} for i, end, length in result.gaps()]
        downloads("server_interference", "probe_interference", figure=figure, table=gaps)

    st.subheader("What the server counted itself (/metrics)")
    if not server["metrics_available"]:
        st.info("This server has no Prometheus /metrics page, so only the client's view is shown.")
    else:
        rows = [row for name, delta in report.metrics.items() for row in delta.rows(name)]
        st.caption("Counters by how much each experiment raised them; "
                   "gauges before and after. vLLM's prefill counters first.")
        st.dataframe(pd.DataFrame(rows), hide_index=True)
        downloads("server_metrics", "probe_metrics", table=rows, data=report.metrics_delta())


if (report := get_result("probe")) is not None:
    show_probe(report)


st.subheader("Under load: is time to first token prefill, or the queue?")
st.markdown(
    "One request at a time shows what prefill costs. Under traffic a request may also **wait in the server's queue** "
    "before its prefill starts. The sweep sends streamed requests at increasing load (**Poisson arrivals** at a rate, "
    "or a fixed number of **users** who each send again as soon as they get an answer), and reads the server's own "
    "histograms before and after each load: vLLM times each request's TTFT, its wait in its scheduler's queue and its "
    "prefill. The **knee** is the highest load whose TTFT p99 stays within 2× its lightest-load level; "
    "**goodput** is the share of requests that met both your targets."
)
row = st.columns(4)
mode = row[0].radio("Load", ["rate", "concurrency"], key="load_mode", horizontal=True,
                    format_func={"rate": "requests/s (open loop)", "concurrency": "users (closed loop)"}.get,
                    help="rates default to ½×…4× the rate the server answers one request at a time; "
                         "users to 1, 2, 4, 8, 16")
requests_per_point = row[1].slider("Requests per load point (at most)", 4, 32, 8 if policy.enabled else 12,
                                   key="load_requests")
prompt_tokens = row[2].slider("Mean prompt length (tokens)", 32, 1024, 256, step=32, key="load_prompt_tokens")
output_tokens = row[3].slider("Output tokens per request", 1, 64, 8, key="load_output_tokens")
row = st.columns(4)
spread = row[0].slider("Prompt lengths: ± share of the mean", 0.0, 0.9, 0.5, key="load_spread",
                       help="uniform in mean × [1 − s, 1 + s]")
prefix_share = row[1].slider("Share starting with a shared system prompt", 0.0, 1.0, 0.0, key="load_prefix_share",
                             help="those requests start with the same 128-token prefix, "
                                  "which a prefix cache computes once")
ttft_target_ms = row[2].number_input("TTFT target (ms)", 10, 600_000, 1000, key="load_ttft_target")
itl_target_ms = row[3].number_input("Inter-token gap target (ms)", 1, 60_000, 250, key="load_itl_target")
buttons = st.columns([1, 1, 4])
sweep_pressed = buttons[0].button("Sweep the load", type="primary", key="load_run")
if buttons[1].button("Stop", key="load_stop",
                     help="stops sending at once, cancels the requests in flight, keeps the finished load points"):
    if st.session_state.pop("load_sweep_running", False) and (partial := get_result("probe_load")) is not None:
        partial.stopped_reason = "Stopped by the user; the load points finished before are kept."
if sweep_pressed:
    with run_guarded("The load sweep", queue=False):
        policy.check_probe_url(url)
        settings = LoadSettings(mode=mode, requests_per_point=requests_per_point, prompt_tokens=prompt_tokens,
                                output_tokens=output_tokens, prompt_spread=spread, shared_prefix_share=prefix_share,
                                ttft_target_s=ttft_target_ms / 1e3, itl_target_s=itl_target_ms / 1e3)
        budget = ProbeBudget(max_requests=policy.limit("probe_requests", 200))
        budget.max_prompt_tokens = policy.limit("probe_prompt_tokens", budget.max_prompt_tokens)
        # until it returns: a Stop click reruns the page and the sweep cancels on the way out
        st.session_state["load_sweep_running"] = True
        try:
            with progress_bar("Sweeping") as update:
                final = load_sweep(url, model.strip() or None, settings, progress=update, budget=budget,
                                   api_key=api_key or None,
                                   # each point kept as it finishes
                                   on_point=lambda partial: save_result("probe_load", partial))
        except Exception:
            st.session_state["load_sweep_running"] = False
            raise
        st.session_state["load_sweep_running"] = False
        save_result("probe_load", final)

load_report = get_result("probe_load")
if load_report is not None:
    if load_report.stopped_reason:
        failing = "started failing" in load_report.stopped_reason
        (st.error if failing else st.info)(load_report.stopped_reason)
    if load_report.points:
        st.markdown(f"**{load_report.reading()}**")
        figure = figure_section("TTFT and goodput against load",
                                "TTFT percentiles over each load point's successful requests (p99 of a few requests is "
                                "close to their worst); goodput on the right axis. Past the knee the server can't keep "
                                "up and requests wait longer the longer the load lasts.",
                                load_figures.ttft_load_figure(load_report), "load_ttft_chart", caption=True)
        split = figure_section("Where the time to first token went",
                               "The server's own means per load point, stacked: the wait before its scheduler saw the "
                               "request (its TTFT less the two below: vLLM's engine takes new requests only between "
                               "steps, so a request that arrives during a long step waits for it to end, uncounted by "
                               "its queue histogram; plus the API server's tokenizing), the wait in the scheduler's "
                               "queue, and prefill (first scheduled to first token); the dash is the mean TTFT this "
                               "client saw (network and HTTP included). vLLM admits a request into the running batch "
                               "while the batch has room, so at first load shows up as longer prefill (each step is "
                               "shared with more requests) and the queue grows only once the batch is full: "
                               "sequences, token budget or KV cache.",
                               load_figures.split_figure(load_report), "load_split_chart", caption=True)
        data = load_report.to_json()
        rows = [{k: v for k, v in p.items() if k not in ("split", "metrics_delta", "gauge_peaks")}
                | {f"split_{k}": v for k, v in p["split"].items()}
                | {f"peak {k}": v for k, v in p["gauge_peaks"].items()}  # requests waiting, KV cache in use
                for p in data["load_points"]]
        st.dataframe(pd.DataFrame(rows), hide_index=True)
        missing = sorted({m for p in data["load_points"] for m in p["split"]["missing"]})
        if missing:
            st.info(f"Not exported by this server: {', '.join(missing)}. "
                    "The client's own timings are shown; the split needs vLLM's histograms.")
        downloads("server_load", "probe_load", figure=figure, table=rows, data=data)
        downloads("server_load_split", "probe_load_split", figure=split)
