"""The sidebar: the model picker (the model made ready once per id, device and dtype in a thread of its
own and shared, so it holds no per-run state: ``preparation.py``) and the loaded model's card."""

from __future__ import annotations

import streamlit as st
import torch

from prefillviz.backends.dispatch_tables import choice_label
from prefillviz.backends.labels import forward_label
from prefillviz.backends.packed_weights import linear_weights_label
from prefillviz.loading.hosted import hosted_policy
from prefillviz.loading.model_registry import BUNDLED_MODEL_ID, RECOMMENDED_MODELS
from prefillviz.loading.models import LoadedModel
from prefillviz.machine.devices import cuda_fallback_note, dtype_name
from prefillviz.measure.dtype_speed import dtype_speed
from prefillviz.ui.preparation import forget, preparation
from prefillviz.ui.presenter import PRESENTER_CSS, presenter_mode
from prefillviz.ui.settings import (
    BACKEND_KEY,
    BACKENDS,
    device_choices,
    dtype_choices,
    kept,
    model_choices,
    session_backend,
)

PENDING = "model_preparing"  # session key: the preparation this run's page waits for (None: nothing to wait for)


def model_choice() -> tuple[str, str, str]:
    """The sidebar's model, device and dtype widgets; returns their values.

    Every page draws them (``page_frame``); ``kept`` carries their values across pages.

    In hosted mode only the allow-listed models are offered, there is no free-text box, and
    device and dtype are fixed (switching them would reload the shared model for everyone).
    """
    policy = hosted_policy()
    described = {spec.model_id: f"{spec.model_id} · {spec.num_parameters_label} · {spec.needs}"
                 for spec in RECOMMENDED_MODELS}
    labels = {model_id: described.get(model_id, model_id) for model_id in model_choices()}
    with st.sidebar:
        kept(st.toggle, "Presenter mode", key="presenter_mode",
             help="Large text for a projector, fewer controls on screen")
        st.header("Model")
        model_id = kept(st.selectbox, "Model", list(labels), format_func=labels.get, key="sidebar_model")
        # in presenter mode the rest folds away (still rendered, so the choices are kept)
        with st.expander("Model settings", expanded=not presenter_mode()):
            custom = "" if policy.enabled else kept(st.text_input, "…or another Hugging Face id or local folder",
                                                    key="sidebar_custom_model").strip()
            fixed = {"disabled": True, "help": "Fixed in this hosted demo: the model is shared, and a switch would "
                                               f"reload it for everyone ({policy.why})."} if policy.enabled else {}
            device = kept(st.selectbox, "Device", device_choices(), key="sidebar_device", **fixed)
            dtype = kept(st.selectbox, "dtype", dtype_choices(), key="sidebar_dtype",
                         **(fixed or {"help": "auto: bf16 on GPU and on a CPU where bf16 measured at least 1.25x "
                                              "faster than fp32, else fp32. A dtype this CPU can't run is refused "
                                              "with a message; a slow one is flagged with its measured factor."}))
        if policy.enabled:
            st.caption(f"Hosted demo ({policy.why}): allow-listed models only, "
                       "fixed device and dtype, bounded prompts.")
        kept(
            st.radio, "Engine ops", list(BACKENDS), format_func=BACKENDS.get, key=BACKEND_KEY,
            help="The same engine either way. Textbook: every op in a few lines of plain torch "
            "(prefillviz/engine/backend.py). "
            "Measured: C++ and oneDNN kernels, each chosen by timing it on this machine (prefillviz/backends). "
            "The Kernel timings page runs both on one prompt.",
        )
        kept(st.radio, "Chart image format (each chart's camera button)", ["png", "svg"], key="export_format",
             horizontal=True)
    if presenter_mode():
        st.markdown(PRESENTER_CSS, unsafe_allow_html=True)
    if policy.enabled:  # whatever a widget or a link holds, the shared model stays as it is
        device, dtype = policy.device, policy.dtype
    return custom or model_id or BUNDLED_MODEL_ID, device, dtype


def current_model() -> LoadedModel | None:
    """The model picked in the sidebar once it is ready (loaded, its kernels timed, warmed up; shared by
    every session). None while it is being made ready, with the preparation in ``st.session_state[PENDING]``
    for the page to show, or when it can't be, with the error in the sidebar."""
    model_id, device, dtype = model_choice()
    prepared = preparation(model_id, device, dtype)
    st.session_state[PENDING] = None
    with st.sidebar:
        if prepared.error is not None:
            st.error(prepared.error)
            forget(prepared)  # the next visit tries again
            return None
        if not prepared.ready:
            st.caption(f"Preparing {model_id}: the page shows how far it is.")
            st.session_state[PENDING] = prepared
            return None
        loaded = prepared.loaded
        model_card(loaded)
        if loaded.device.type == "cpu" and cuda_fallback_note():
            st.warning(cuda_fallback_note(), icon=":material/memory:")
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
        f"{info.num_layers} layers · {info.num_heads} heads · {info.num_kv_heads} KV heads · "
        f"head dim {info.head_dim}  \n"
        f"KV cache: **{info.kv_bytes_per_token:,} B per token**  \n"
        f"{loaded.device} · {dtype_name(loaded.dtype)} · from {loaded.source} in {loaded.load_time_s:.1f} s{warm}  \n"
        f"forward: {forward_label(loaded.model, session_backend(), with_reason=True)}  \n"
        f"measured backend's linears: {linear_weights_label(loaded.model, with_reason=True)}  \n"
        f"measured backend's dispatch: {choice_label(loaded.model, with_reason=True)}"
    )
