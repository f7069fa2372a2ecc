"""prefillviz: the prefill phase of a real language model, measured.

Entry point: the sidebar (model, device, dtype, what is loaded) and the navigation between
the views. Each view is a thin script in views/ that starts with ``page_frame()`` (the
sidebar, the loaded model, the share box), so a page also works when it runs without this
script (``AppTest.from_file("views/x.py")``). The folder is not named pages/: with one,
Streamlit runs a fresh server's first deep link (a shared link to /prefix_cache) through its
old pages-folder navigation, without this script, and the sidebar lists file names. The logic
lives in the prefillviz package.
"""

import streamlit as st

from prefillviz.ui.shell import PAGE_URL_PATH

st.set_page_config(page_title="prefillviz", page_icon=":material/fast_forward:", layout="wide")

PAGES = [
    st.Page("views/prefill.py", title="Prefill", icon=":material/fast_forward:", default=True),
    st.Page("views/parallel_vs_sequential.py", title="Parallel vs token-by-token", icon=":material/compare_arrows:"),
    st.Page("views/kv_cache.py", title="KV cache", icon=":material/storage:"),
    st.Page("views/attention.py", title="Attention", icon=":material/visibility:"),
    st.Page("views/kernels.py", title="Kernel timings", icon=":material/timer:"),
    st.Page("views/chunked_prefill.py", title="Chunked prefill", icon=":material/view_timeline:"),
    st.Page("views/disaggregated.py", title="Disaggregated prefill", icon=":material/call_split:"),
    st.Page("views/prefix_cache.py", title="Prefix cache", icon=":material/recycling:"),
    st.Page("views/your_server.py", title="Your server", icon=":material/dns:"),
    st.Page("views/reproduce_papers.py", title="Reproduce the papers", icon=":material/science:"),
    st.Page("views/walkthrough.py", title="Guided lessons", icon=":material/school:"),
]

page = st.navigation(PAGES)
st.session_state[PAGE_URL_PATH] = page.url_path  # for the page's share link
page.run()
