"""The Kernel timings page's two views of the backends: what the measured backend runs on this
machine (its dispatch table, and why), and what tuning buys (the textbook ops against it, one
prompt's prefill each, timed in turns: ``experiments/tuning.py``)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from prefillviz.backends.dispatch_buckets import BUCKETS
from prefillviz.backends.dispatch_tables import table_for
from prefillviz.backends.dispatch_tuning import RUNS
from prefillviz.experiments import tuning
from prefillviz.figures import kernels as figures
from prefillviz.loading.models import LoadedModel
from prefillviz.ui.results import downloads, get_result, save_result
from prefillviz.ui.running import run_guarded
from prefillviz.ui.shell import run_button


def dispatch_panel(loaded: LoadedModel | None, hosted: bool) -> None:
    """The measured dispatch: the sentence of each family's choice, its timings, and Measure again
    (not on a hosted demo)."""
    st.subheader("What the measured backend runs on this machine")
    if loaded is None:
        return
    table = table_for(loaded.model, part_will_do=True)  # measured at the start; read here
    if table.partial:  # a first start timed the first page's step shapes only: this page shows all five
        with run_guarded("Timing the other step shapes"), st.spinner(  # in the run queue's turn
                "This machine's first start timed the first page's step shapes; timing the other "
                f"{len(BUCKETS) - len(table.timings)} now (a few seconds)…"):
            table = table_for(loaded.model)
    st.markdown(
        "The engine has several correct ways to compute attention and the linear layers, and which is fastest depends "
        "on the CPU: on a Zen 4 the engine's own C++ kernel (v7) beat torch's SDPA; on a Xeon with AMX, SDPA (whose "
        "flash attention runs on the AMX tiles) beat v7 4x at 2,048 tokens. So nothing is chosen by the CPU's name: "
        "each candidate is checked against its oracle here, then timed on this model's shapes for five step shapes, "
        "and every engine step runs the fastest for its shape.  \n"
        f"**{table.sentence('attention')}.**  \n**{table.sentence('linears')}.**"
    )
    dispatch_rows = table.rows()
    columns = st.columns(2)
    for column, family in zip(columns, ("attention", "linears")):
        dispatch_chart = figures.dispatch_figure(dispatch_rows, family,
                                                 f"{loaded.model_id}, {table.dtype}, {table.num_threads} threads")
        column.plotly_chart(dispatch_chart, key=f"kernels_dispatch_{family}_chart")
    excluded = [f"{name} ({why})" for reasons in table.excluded.values() for name, why in reasons.items()]
    st.caption(
        f"Timings {table.provenance()}; one layer's attention on random q/k/v of the model's heads, and layer 0's four "
        f"linears on its own weights, median of {RUNS} runs (a candidate over 3x the best on its first call is timed "
        "once). " + (f"Not candidates here: {'; '.join(excluded)}." if excluded else "Every candidate runs here.")
    )
    downloads("kernels_dispatch", "kernels_dispatch_dl", table=dispatch_rows, data=table.as_dict())
    if st.button("Measure again", key="kernels_dispatch_again", disabled=hosted,
                 help="time every candidate again now (a few seconds); "
                      "the choice is kept per machine and re-measured after a week"):
        with run_guarded("Measuring the dispatch again"), st.spinner("Timing every candidate on every step shape…"):
            table_for(loaded.model, refresh=True)
        st.rerun()


def backends_panel(loaded: LoadedModel | None, prompt: str) -> None:
    """What tuning buys: the Compare button, then both backends' time to first token, per-layer
    figure, what each step ran and the downloads."""
    st.subheader("What tuning buys: the textbook ops against the measured backend")
    st.markdown(
        "The engine runs one forward whatever computes its ops. Its **textbook** backend runs each op in a few lines "
        "of plain torch (`prefillviz/engine/backend.py`: the model's `nn.Linear`, RMSNorm and RoPE in torch, torch's "
        "SDPA over the paged cache). The **measured** backend (`prefillviz/backends/`) runs the same ops on C++ "
        "kernels and oneDNN, each chosen by timing it here. Both prefill your prompt in one step, timing passes in "
        "turns."
    )
    if run_button("Compare the two backends", key="kernels_backends_run"):
        bar = st.progress(0.0, text="starting")
        with run_guarded("The comparison of the backends"):
            save_result("kernels_backends", tuning.compare_backends(
                loaded, prompt, progress=lambda done, text: bar.progress(min(done, 1.0), text=text)))
        bar.empty()
    comparison = get_result("kernels_backends")
    if comparison is None:
        return
    textbook, tuned = comparison.runs["textbook"], comparison.runs["measured"]
    columns = st.columns(3)
    columns[0].metric("Textbook, time to first token", f"{textbook.ttft_s * 1e3:,.1f} ms")
    columns[1].metric("Measured, time to first token", f"{tuned.ttft_s * 1e3:,.1f} ms")
    faster = "faster" if comparison.speedup >= 1 else "slower"
    columns[2].metric("What tuning buys", f"{max(comparison.speedup, 1 / comparison.speedup):.2f}x {faster}")
    subtitle = f"{comparison.num_tokens:,} tokens, {comparison.model_id} on {comparison.device}, {comparison.dtype}"
    backends_chart = figures.backends_figure(comparison.rows(), subtitle)
    st.plotly_chart(backends_chart, key="kernels_backends_chart")
    ran = [{"backend": run.name,
            "what its step ran": ", ".join(f"{k}: {v}" for k, v in run.ran.items() if k != "backend"),
            "median time to first token (ms)": round(run.ttft_s * 1e3, 1)} for run in comparison.runs.values()]
    st.dataframe(pd.DataFrame(ran), hide_index=True)
    st.caption(
        f"Medians of {len(tuned.ttft_runs_s)} timing passes of each backend, taken in turns, after an untimed pass of "
        f"each; the layers' parts from the median pass's clocks. {comparison.machine_load.label().capitalize()}."
    )
    downloads("kernels_backends", "kernels_backends_dl", figure=backends_chart, table=comparison.rows(),
              data=comparison.as_dict())
