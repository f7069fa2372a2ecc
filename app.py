"""prefillviz: the prefill phase of a real language model, measured.

Entry point: the sidebar (model, device, dtype, what is loaded) and the navigation between
the views. Each view is a thin script in pages/ that starts with ``page_frame()`` (the
sidebar, the loaded model, the share box), so a page also works when it runs without this
script, as Streamlit's AppTest runs a page of a folder named pages/. The logic lives in the
prefillviz package.
"""

import streamlit as st

from prefillviz.ui.shell import PAGE_URL_PATH

st.set_page_config(page_title="prefillviz", page_icon=":material/fast_forward:", layout="wide")

PAGES = [
    st.Page("pages/prefill.py", title="Prefill", icon=":material/fast_forward:", default=True),
    st.Page("pages/parallel_vs_sequential.py", title="Parallel vs token-by-token", icon=":material/compare_arrows:"),
    st.Page("pages/kv_cache.py", title="KV cache", icon=":material/storage:"),
    st.Page("pages/attention.py", title="Attention", icon=":material/visibility:"),
    st.Page("pages/kernels.py", title="Kernel timings", icon=":material/timer:"),
    st.Page("pages/chunked_prefill.py", title="Chunked prefill", icon=":material/view_timeline:"),
    st.Page("pages/disaggregated.py", title="Disaggregated prefill", icon=":material/call_split:"),
    st.Page("pages/prefix_cache.py", title="Prefix cache", icon=":material/recycling:"),
    st.Page("pages/your_server.py", title="Your server", icon=":material/dns:"),
    st.Page("pages/walkthrough.py", title="Guided lessons", icon=":material/school:"),
]

page = st.navigation(PAGES)
st.session_state[PAGE_URL_PATH] = page.url_path  # for the page's share link
page.run()
