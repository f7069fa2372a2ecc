"""The sidebar's settings keep their values across pages.

Every page draws the sidebar itself (``shell.page_frame``). Streamlit gives a widget drawn
by a page an identity of that page, so on a page switch it would start again from its
default: the dtype picked on one page would be gone on the next, and the model reloaded.
Streamlit's documented remedy is a copy in ``st.session_state`` under a second key, saved
when the widget changes and given back to the widget before it is drawn; ``kept`` does that.
Code that sets a setting (a shared link, a lesson step) calls ``set_setting``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import streamlit as st

from prefillviz.engine.backend import Backend, TorchBackend
from prefillviz.loading.hosted import hosted_policy
from prefillviz.loading.model_registry import RECOMMENDED_MODELS

KEPT_PREFIX = "kept_"
DEVICES = ["auto", "cpu", "cuda", "mps"]
DTYPES = ["auto", "float32", "bfloat16", "float16"]
BACKEND_KEY = "sidebar_backend"
BACKENDS = {  # the sidebar's engine ops: what each runs
    "measured": "measured: the fastest kernels this machine ran",
    "textbook": "textbook: the engine's plain torch ops",
}


def backend_choice() -> str:
    """The sidebar's engine ops for this session: "measured" (the default) or "textbook"."""
    return st.session_state.get(KEPT_PREFIX + BACKEND_KEY, st.session_state.get(BACKEND_KEY)) or "measured"


def session_backend() -> Backend | None:
    """The backend this session's engines run: the textbook's, or None for the model's own (the measured one)."""
    return TorchBackend() if backend_choice() == "textbook" else None


def model_choices() -> list[str]:
    """The models the sidebar offers, the first one selected: in hosted mode only the allow-listed ones."""
    policy = hosted_policy()
    return list(policy.allowed_model_ids) if policy.enabled else [spec.model_id for spec in RECOMMENDED_MODELS]


def device_choices() -> list[str]:
    """The devices the sidebar and a shared link may pick: in hosted mode only the fixed one."""
    policy = hosted_policy()
    return [policy.device] if policy.enabled else DEVICES


def dtype_choices() -> list[str]:
    """The dtypes the sidebar and a shared link may pick: in hosted mode only the fixed one."""
    policy = hosted_policy()
    return [policy.dtype] if policy.enabled else DTYPES


def set_setting(key: str, value: Any) -> None:
    """Set a sidebar setting before its widget is drawn in this run (the widget shows it)."""
    st.session_state[key] = value
    st.session_state[KEPT_PREFIX + key] = value


def _save(key: str) -> None:
    st.session_state[KEPT_PREFIX + key] = st.session_state[key]


def kept(widget: Callable[..., Any], *args: Any, key: str, **kwargs: Any) -> Any:
    """Draw ``widget(*args, key=key, **kwargs)`` with the value it had on any page this session."""
    if KEPT_PREFIX + key in st.session_state:
        st.session_state[key] = st.session_state[KEPT_PREFIX + key]
    value = widget(*args, key=key, on_change=_save, args=(key,), **kwargs)
    st.session_state[KEPT_PREFIX + key] = value
    return value
