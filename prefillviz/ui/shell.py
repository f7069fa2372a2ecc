"""The frame every page starts with: ``page_frame()`` (a shared link's settings, the sidebar and
the model chosen there, the share box), ``run_button`` for its runs, and ``finish_page`` after it.

A page is never blank while the model is made ready (``preparation.py``): ``page_frame`` draws the
progress bar and returns None, the page draws its title, text and controls, its run buttons wait
and say so, and at its end (``views/navigation.py`` calls ``finish_page`` after it; a page that
ends early calls ``stop_page``) the bar and the buttons count down until the model is ready, then
the page runs again. The rest of a page's frame, one concept a module:

    sidebar.py    the model picker, the cached model, the loaded model's card
    running.py    run_guarded (queue, inline errors), progress bars, run_label
    results.py    save_result / get_result (per session), downloads
    presenter.py  presenter mode, chart
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import streamlit as st

from prefillviz.loading.models import LoadedModel
from prefillviz.ui.links import apply_link_parameters, share_box
from prefillviz.ui.sidebar import PENDING, current_model

PAGE_URL_PATH = "page_url_path"  # session key: the URL path of the page app.py is running
PRESSED_WHILE_PREPARING = "run_pressed_while_preparing"  # session key: the run button pressed as a model was picked
PREPARE_TIMEOUT_S = 600.0  # the longest a page keeps its progress bar moving before it says so and stops
_page_run = threading.local()  # .navigated: under views/navigation.py; .bar, .buttons: what counts down


def page_frame() -> LoadedModel | None:
    """The first call of every page: the shared link's settings, the sidebar and its model,
    and the share box. Returns the loaded model (None, with a hint, when none could be).

    Pages call it themselves, once, so a page works when it runs without ``app.py``
    (``AppTest.from_file("views/x.py")``); ``app.py`` only navigates.
    """
    ignored = apply_link_parameters()  # before any widget: a shared link sets them
    loaded = current_model()
    share_box(st.session_state.get(PAGE_URL_PATH, ""), ignored)
    prepared = st.session_state.get(PENDING)
    _page_run.bar, _page_run.buttons = None, []
    if prepared is not None:
        _page_run.bar = st.progress(prepared.fraction(), text=prepared.text())
        if not getattr(_page_run, "navigated", False):  # a page run on its own (a test's AppTest): wait here
            finish_page()
    elif loaded is None:
        st.info("No model is loaded: pick one that loads in the sidebar.")
    st.session_state["loaded_model"] = loaded
    return loaded


@contextmanager
def navigated_page() -> Iterator[None]:
    """Around ``page.run()`` in ``views/navigation.py``: the page draws all of itself before anything waits."""
    _page_run.navigated = True
    try:
        yield
    finally:
        _page_run.navigated = False


def finish_page() -> None:
    """After the page: while its model is made ready, its progress bar and waiting buttons count down; once
    it is ready, the page runs again (now with the model). Returns at once when there is nothing to wait for."""
    prepared = st.session_state.get(PENDING)
    if prepared is None:
        return
    deadline, ticks, drawn = time.monotonic() + PREPARE_TIMEOUT_S, 0, None
    while not prepared.done.wait(1.0):
        if time.monotonic() > deadline:
            st.warning(f"The model is still being prepared after {PREPARE_TIMEOUT_S:.0f} s; "
                       "reload the page to look again.")
            return
        if prepared.stage == "kernels" and drawn == "kernels":  # still while this machine's kernels are timed
            continue
        ticks, drawn = ticks + 1, prepared.stage
        if getattr(_page_run, "bar", None) is not None:
            _page_run.bar.progress(prepared.fraction(), text=prepared.text())
        for placeholder, label, kwargs in getattr(_page_run, "buttons", []) if ticks % 2 == 0 else []:
            _waiting_button(placeholder, label, kwargs, prepared, ticks)
    st.rerun()


def stop_page() -> None:
    """``st.stop()`` for a page that has nothing more to draw: once its model is ready, if it is being prepared."""
    finish_page()
    st.stop()


def _waiting_button(placeholder, label: str, kwargs: dict, prepared, tick: int) -> None:
    """A run button that waits for the model, its label counting down (each redraw a key of its own)."""
    left = prepared.seconds_left()
    waiting = f"about {left:.0f} s left" if left >= 1 else "a few more seconds"
    key = f"{kwargs.get('key', label)}__waiting{tick}"
    shown = {**kwargs, "key": key, "disabled": True, "on_click": None, "args": None}
    placeholder.button(f"{label} · model loading: {waiting}", **shown)


def run_button(label: str, **kwargs) -> bool:
    """A page's run button: True when pressed with a model ready. While the model is being prepared the same
    button waits and says so ("model loading: about 6 s left"); with no model it is disabled and says why.
    A press whose own ``on_click`` picked a model that is not ready yet (a lesson step's dtype) is kept: the
    button returns True once that model is ready, without a second press."""
    prepared = st.session_state.get(PENDING)
    key = kwargs.get("key")
    if prepared is not None:
        if key is not None and st.session_state.get(key):  # pressed in this run: kept for when it is ready
            st.session_state[PRESSED_WHILE_PREPARING] = key
        placeholder = st.empty()
        _waiting_button(placeholder, label, kwargs, prepared, 0)
        _page_run.buttons = [*getattr(_page_run, "buttons", []), (placeholder, label, kwargs)]
        return False
    if loaded_model() is None:
        why = "No model is loaded: pick one that loads in the sidebar."
        st.button(label, **{**kwargs, "disabled": True, "help": why})
        return False
    pressed = st.button(label, **kwargs)
    if key is not None and st.session_state.get(PRESSED_WHILE_PREPARING) == key:
        st.session_state[PRESSED_WHILE_PREPARING] = None
        return True
    return pressed


def loaded_model() -> LoadedModel | None:
    """The model this run's ``page_frame`` loaded (for the parts a page draws)."""
    return st.session_state.get("loaded_model")
