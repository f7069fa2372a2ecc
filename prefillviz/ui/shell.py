"""The frame every page starts with: ``page_frame()`` (a shared link's settings, the sidebar and
the model chosen there, the share box). The rest of a page's frame, one concept a module:

    sidebar.py    the model picker, the cached model, the loaded model's card
    running.py    run_guarded (queue, inline errors), progress bars, run_label
    results.py    save_result / get_result (per session), downloads
    presenter.py  presenter mode, chart
"""

from __future__ import annotations

import streamlit as st

from prefillviz.loading.models import LoadedModel
from prefillviz.ui.links import apply_link_parameters, share_box
from prefillviz.ui.sidebar import current_model

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
