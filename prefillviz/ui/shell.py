"""The frame every page shares: the sidebar model picker, the loaded-model card, progress
bars for long runs, inline errors that keep earlier results, and downloads.

Pages start with ``page_frame()`` (the sidebar and the model chosen there), ``run_guarded`` around
anything that runs it, and ``save_result`` / ``get_result`` for per-session results (in
``st.session_state``: one user's results are never another's). The model itself is cached
with ``st.cache_resource`` and shared, so it holds no per-run state.
"""

from __future__ import annotations

import gc
import json
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import streamlit as st
import torch
from streamlit.errors import StreamlitAPIException

from prefillviz.engine.devices import dtype_name
from prefillviz.engine.dispatch_tables import choice_label
from prefillviz.engine.errors import OutOfMemory, PrefillVizError, is_out_of_memory
from prefillviz.engine.llama_forward import forward_label
from prefillviz.engine.packed_weights import linear_weights_label
from prefillviz.experiments.warm_up import warm_up
from prefillviz.instrument.passes import pass_label
from prefillviz.loading.hosted import hosted_policy
from prefillviz.loading.model_registry import BUNDLED_MODEL_ID, RECOMMENDED_MODELS
from prefillviz.loading.models import LoadedModel, load_model
from prefillviz.measure.dtype_speed import dtype_speed
from prefillviz.ui.links import apply_link_parameters, share_box
from prefillviz.ui.run_queue import RUN_QUEUE
from prefillviz.ui.settings import kept

logger = logging.getLogger(__name__)
DEVICES = ["auto", "cpu", "cuda", "mps"]
DTYPES = ["auto", "float32", "bfloat16", "float16"]


@st.cache_resource(show_spinner=False, max_entries=2)
def _cached_model(model_id: str, device: str, dtype: str) -> LoadedModel:
    loaded = load_model(model_id, device=device, dtype=dtype)
    loaded.warm_up_s = warm_up(loaded)  # through the engine: packing, primitives and hooks stay out of the first measured run
    return loaded


def model_choice() -> tuple[str, str, str]:
    """The sidebar's model, device and dtype widgets; returns their values.

    Every page draws them (``page_frame``); ``kept`` carries their values across pages.

    In hosted mode only the allow-listed models are offered and there is no free-text box.
    """
    policy = hosted_policy()
    labels = {spec.model_id: f"{spec.model_id} · {spec.num_parameters_label} · {spec.needs}" for spec in RECOMMENDED_MODELS}
    if policy.enabled:
        labels = {model_id: labels.get(model_id, model_id) for model_id in policy.allowed_model_ids}
    with st.sidebar:
        kept(st.toggle, "Presenter mode", key="presenter_mode", help="Large text for a projector, fewer controls on screen")
        st.header("Model")
        model_id = kept(st.selectbox, "Model", list(labels), format_func=labels.get, key="sidebar_model")
        # in presenter mode the rest folds away (still rendered, so the choices are kept)
        with st.expander("Model settings", expanded=not presenter_mode()):
            custom = "" if policy.enabled else kept(st.text_input, "…or another Hugging Face id or local folder", key="sidebar_custom_model").strip()
            device = kept(st.selectbox, "Device", DEVICES, key="sidebar_device")
            dtype = kept(st.selectbox, "dtype", DTYPES, key="sidebar_dtype", help="auto: bf16 on GPU and on a CPU where bf16 measured at least 1.25x faster than fp32, else fp32. A dtype this CPU can't run is refused with a message; a slow one is flagged with its measured factor.")
        kept(st.radio, "Chart image format (each chart's camera button)", ["png", "svg"], key="export_format", horizontal=True)
    if presenter_mode():
        st.markdown(PRESENTER_CSS, unsafe_allow_html=True)
    return custom or model_id or BUNDLED_MODEL_ID, device, dtype


def chart(figure: go.Figure, key: str, **kwargs):
    """``st.plotly_chart`` with the camera button saving PNG or SVG (the sidebar's choice)."""
    image_format = st.session_state.get("export_format", "png")
    config = {"displaylogo": False, "toImageButtonOptions": {"format": image_format, "filename": key, "scale": 2}}
    return st.plotly_chart(figure, key=key, config=config, **kwargs)


PRESENTER_CSS = """<style>
html, body, [data-testid="stAppViewContainer"] { font-size: 22px; }
[data-testid="stMarkdownContainer"] p, [data-testid="stMarkdownContainer"] li { font-size: 1.3rem; line-height: 1.5; }
h1 { font-size: 3.2rem !important; }
h2, h3 { font-size: 2.1rem !important; }
[data-testid="stMetricValue"] { font-size: 3rem !important; }
[data-testid="stCaptionContainer"] { font-size: 1.1rem !important; }
[data-testid="stDownloadButton"] { display: none; }
</style>"""


def presenter_mode() -> bool:
    """Large fonts and fewer controls, for a projector (the sidebar toggle)."""
    return bool(st.session_state.get("presenter_mode", False))


def current_model() -> LoadedModel | None:
    """The model picked in the sidebar, loaded once per (id, device, dtype); None (with a
    message in the sidebar) when it can't be loaded."""
    model_id, device, dtype = model_choice()
    with st.sidebar:
        try:
            with st.spinner(f"Loading {model_id} and warming it up (the bundled model's very first load dequantizes its GGUF: ~10 s)…"):
                loaded = _cached_model(model_id, device, dtype)
        except PrefillVizError as error:
            st.error(str(error))
            return None
        model_card(loaded)
        if loaded.device.type == "cpu" and loaded.dtype != torch.float32:
            note = dtype_speed(loaded.device, loaded.dtype).note()  # measured once per process and dtype
            if note:
                st.warning(note, icon=":material/speed:")
    return loaded


def model_card(loaded: LoadedModel) -> None:
    info = loaded.info
    warm = f" · warmed up in {loaded.warm_up_s:.1f} s" if loaded.warm_up_s is not None else ""
    st.subheader("Loaded")
    st.markdown(
        f"**{loaded.model_id}**  \n"
        f"{info.architecture} · {info.num_parameters / 1e6:,.0f} M parameters  \n"
        f"{info.num_layers} layers · {info.num_heads} heads · {info.num_kv_heads} KV heads · head dim {info.head_dim}  \n"
        f"KV cache: **{info.kv_bytes_per_token:,} B per token**  \n"
        f"{loaded.device} · {dtype_name(loaded.dtype)} · from {loaded.source} in {loaded.load_time_s:.1f} s{warm}  \n"
        f"engine: {linear_weights_label(loaded.model, with_reason=True)}  \n"
        f"forward: {forward_label(loaded.model, 'none', with_reason=True)}; profiler passes hook the stock one  \n"
        f"dispatch: {choice_label(loaded.model, with_reason=True)}"
    )


def run_label(loaded: LoadedModel, capture: str) -> str:
    """What a number measured: the pass (``instrument.passes``), the device and its threads, for captions under results."""
    where = f"{loaded.model_id} on {loaded.device}, {dtype_name(loaded.dtype)}"
    return (
        f"{pass_label(capture)} · {where} · {forward_label(loaded.model, capture)} · {linear_weights_label(loaded.model)} · "
        f"{choice_label(loaded.model)} · "
        f"{torch.get_num_threads()} torch threads"
    )


@contextmanager
def run_guarded(what: str, queue: bool = True) -> Iterator[None]:
    """Wait for the shared model's turn, then run; show an inline error instead of a crash.

    Sessions queue for the model one run at a time (``RUN_QUEUE``) and see their place in
    line; ``queue=False`` for runs that don't use it (the server probe). After an
    out-of-memory error the caches are freed. Earlier results stay in ``st.session_state``
    untouched, so the page keeps showing them.
    """
    waiting = st.empty()
    try:
        turn = RUN_QUEUE.turn(on_wait=lambda ahead: waiting.info(f"Waiting for the shared model: {ahead} run(s) ahead of yours…")) if queue else nullcontext(0.0)
        with turn as waited_s:
            st.session_state["last_queue_wait_s"] = waited_s
            if waited_s >= 0.1:
                waiting.caption(f"Waited {waited_s:.1f} s for the shared model")
            else:
                waiting.empty()
            yield
    except PrefillVizError as error:
        if isinstance(error, OutOfMemory):
            free_memory()
        st.error(f"{what} failed: {error}")
    except Exception as error:
        if is_out_of_memory(error):
            free_memory()
            st.error(f"{what} ran out of memory. Try a shorter prompt, a smaller token budget or a smaller model.")
            return
        if isinstance(error, StreamlitAPIException):  # a bug in a page, not bad input: let tests see it
            raise
        logger.exception("%s failed", what)  # the traceback goes to the server log
        st.error(f"{what} failed unexpectedly ({type(error).__name__}: {error}). Earlier results are kept; please report this.")


def free_memory() -> None:
    """Give back what a failed run held: Python garbage and the CUDA caching allocator's blocks."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def progress_callback(total_steps: int, label: str) -> Callable[[int, Any], None]:
    """An ``engine.run(progress=...)`` callback that drives a progress bar: steps done of total, and the phase."""
    bar = st.progress(0.0, text=f"{label}: starting")

    def update(steps_done: int, record) -> None:
        phase = "prefill" if record.num_prefill_tokens else "decode"
        fraction = min(1.0, steps_done / max(total_steps, 1))
        bar.progress(fraction, text=f"{label}: step {steps_done} of ~{total_steps} ({phase}, {record.num_scheduled_tokens} tokens)")

    return update


@contextmanager
def progress_bar(label: str) -> Iterator[Callable[[float, str], None]]:
    """A progress bar driven by an experiment's (fraction, text) callback; gone when the run ends or fails."""
    bar = st.progress(0.0, text=f"{label}: starting")
    try:
        yield lambda fraction, text: bar.progress(fraction, text=f"{label}: {text}")
    finally:
        bar.empty()


def save_result(page: str, value: Any) -> None:
    st.session_state.setdefault("results", {})[page] = value


def get_result(page: str) -> Any:
    return st.session_state.get("results", {}).get(page)


def downloads(name: str, key: str, figure: go.Figure | None = None, table: pd.DataFrame | list[dict] | None = None, data: Any = None) -> None:
    """Download buttons for a figure's data (CSV and/or JSON) and the figure as standalone HTML.

    Files are built only when clicked (deferred data), and the HTML embeds plotly.js so
    it opens offline. PNG and SVG come from each chart's own toolbar (camera icon).
    Presenter mode hides them (fewer controls on the projector).
    """
    if presenter_mode():
        return
    columns = st.columns(3)
    if table is not None:
        frame = table if isinstance(table, pd.DataFrame) else pd.DataFrame(table)
        columns[0].download_button(
            "Data (CSV)", lambda: frame.to_csv(index=False), f"{name}.csv", "text/csv", key=f"{key}_csv", on_click="ignore"
        )
    if data is not None:
        columns[1].download_button(
            "Data (JSON)", lambda: json.dumps(data, default=str), f"{name}.json", "application/json", key=f"{key}_json", on_click="ignore"
        )
    if figure is not None:
        columns[2].download_button(
            "Figure (HTML)", lambda: figure.to_html(include_plotlyjs=True), f"{name}.html", "text/html", key=f"{key}_html", on_click="ignore"
        )


PAGE_URL_PATH = "page_url_path"  # session key: the URL path of the page app.py is running


def page_frame() -> LoadedModel | None:
    """The first call of every page: the shared link's settings, the sidebar and its model,
    and the share box. Returns the loaded model (None, with a hint, when none could be).

    Pages call it themselves, once, so a page works when it runs without ``app.py``
    (``AppTest.from_file("views/x.py")``); ``app.py`` only navigates.
    """
    ignored = apply_link_parameters()  # before any widget: a shared link sets them
    loaded = current_model()
    share_box(st.session_state.get(PAGE_URL_PATH, ""), ignored)
    if loaded is None:
        st.info("No model is loaded: pick one that loads in the sidebar.")
    st.session_state["loaded_model"] = loaded
    return loaded


def loaded_model() -> LoadedModel | None:
    """The model this run's ``page_frame`` loaded (for the parts a page draws)."""
    return st.session_state.get("loaded_model")
