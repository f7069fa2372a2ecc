"""Shareable links: the URL's query string carries the prompt, the settings and the page.

A teacher copies the link from the sidebar and hands it out; opening it sets the same
widgets (once, at the start of the session). The page is the URL's path (st.navigation).
Values are checked: junk is ignored and listed in a sidebar note, never raised.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlencode

import streamlit as st

from prefillviz.loading.hosted import hosted_policy
from prefillviz.loading.model_registry import RECOMMENDED_MODELS
from prefillviz.loading.prompts import PRESETS
from prefillviz.ui.settings import BACKEND_KEY, BACKENDS, device_choices, dtype_choices, set_setting

MAX_PROMPT_CHARS = 4000


def _choice(options: Callable[[], list]) -> Callable[[str], object]:
    def parse(value: str):
        if value not in options():
            raise ValueError(value)
        return value

    return parse


def _prompt(value: str) -> str:
    if len(value) > MAX_PROMPT_CHARS or "\x00" in value:
        raise ValueError("too long or has NUL characters")
    return value


def _flag(value: str) -> bool:
    if value not in {"0", "1", "true", "false"}:
        raise ValueError(value)
    return value in {"1", "true"}


def _model_ids() -> list[str]:
    policy = hosted_policy()
    return list(policy.allowed_model_ids) if policy.enabled else [spec.model_id for spec in RECOMMENDED_MODELS]


# query name -> (session-state key of the widget, parser that raises ValueError on junk)
LINK_PARAMETERS: dict[str, tuple[str, Callable[[str], object]]] = {
    "model": ("sidebar_model", _choice(_model_ids)),
    "device": ("sidebar_device", _choice(device_choices)),
    "dtype": ("sidebar_dtype", _choice(dtype_choices)),
    "backend": (BACKEND_KEY, _choice(lambda: list(BACKENDS))),
    "presenter": ("presenter_mode", _flag),
    "preset": ("prefill_preset", _choice(lambda: list(PRESETS))),
    "prompt": ("prefill_prompt", _prompt),
}

ROOM_PARAMETERS = ("room", "member")  # never copied into a share link: a member id is that browser's own


def apply_link_parameters() -> list[str]:
    """Set the widgets named in the URL, once per session; returns the names that were ignored."""
    if st.session_state.get("_link_applied"):
        return st.session_state.get("_link_ignored", [])
    ignored = []
    for name, value in st.query_params.items():
        if name in ROOM_PARAMETERS:  # a class room's link: ui/classroom.py reads it
            continue
        if name not in LINK_PARAMETERS:
            ignored.append(name)
            continue
        key, parse = LINK_PARAMETERS[name]
        try:
            set_setting(key, parse(value))
        except ValueError:
            ignored.append(name)
    if "prompt" in st.query_params and "prefill_prompt" in st.session_state and "prefill_preset" not in st.query_params:
        st.session_state.setdefault("prefill_preset", next(iter(PRESETS)))
    st.session_state["_link_applied"] = True
    st.session_state["_link_ignored"] = ignored
    return ignored


def share_link(page_url_path: str) -> str:
    """The URL that reopens this page with the current prompt and settings."""
    query = {}
    for name, (key, _) in LINK_PARAMETERS.items():
        value = st.session_state.get(key)
        if value is None or value == "":
            continue
        if isinstance(value, bool):
            value = "1" if value else "0"
        if name == "prompt":
            value = str(value)[:MAX_PROMPT_CHARS]
        query[name] = value
    base = (st.context.url or "").split("?")[0]
    root = base.rsplit("/", 1)[0] if page_url_path and base.rstrip("/").endswith(page_url_path) else base.rstrip("/")
    return f"{root}/{page_url_path}?{urlencode(query)}"


def share_box(page_url_path: str, ignored: list[str]) -> None:
    with st.sidebar:
        with st.expander("Share this view"):
            st.caption("Copy the link (button at the right of the box): "
                       "it opens this page with this prompt and these settings.")
            st.code(share_link(page_url_path), language=None, wrap_lines=True)
        if ignored:
            st.caption(f"Ignored link settings that were not valid: {', '.join(sorted(ignored))}")
