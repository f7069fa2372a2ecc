"""prefillviz: the prefill phase of a real language model, measured.

Entry point: the sidebar (model, device, dtype, what is loaded) and the navigation between
the views. Each view is a thin script in app_pages/; the logic lives in the prefillviz package.
(Not "pages/": Streamlit treats a folder of that name as old-style pages, and AppTest then
reruns a page without this script.)
"""

import streamlit as st

from prefillviz.ui.links import apply_link_parameters, share_box
from prefillviz.ui.shell import current_model

st.set_page_config(page_title="prefillviz", page_icon=":material/fast_forward:", layout="wide")

PAGES = [
    st.Page("app_pages/prefill.py", title="Prefill", icon=":material/fast_forward:", default=True),
    st.Page("app_pages/parallel_vs_sequential.py", title="Parallel vs token-by-token", icon=":material/compare_arrows:"),
    st.Page("app_pages/kv_cache.py", title="KV cache", icon=":material/storage:"),
    st.Page("app_pages/attention.py", title="Attention", icon=":material/visibility:"),
    st.Page("app_pages/kernels.py", title="Kernel timings", icon=":material/timer:"),
    st.Page("app_pages/chunked_prefill.py", title="Chunked prefill", icon=":material/view_timeline:"),
    st.Page("app_pages/prefix_cache.py", title="Prefix cache", icon=":material/recycling:"),
    st.Page("app_pages/walkthrough.py", title="Guided lessons", icon=":material/school:"),
]

ignored_link_settings = apply_link_parameters()  # before any widget: a shared link sets them
st.session_state["loaded_model"] = current_model()
page = st.navigation(PAGES)
share_box(page.url_path, ignored_link_settings)
page.run()
