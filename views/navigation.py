"""The app's navigation between the views: ``app.py`` runs ``main``, the Streamlit entry point."""

import streamlit as st

from prefillviz.ui.shell import PAGE_URL_PATH, finish_page, navigated_page


def main() -> None:
    # an emoji: a material icon as the favicon is fetched from fonts.gstatic.com, and the app works offline
    st.set_page_config(page_title="prefillviz", page_icon="⏩", layout="wide")
    pages = {  # three groups, every page listed (Streamlit folds a list of more than 10 behind "View more")
        "One prefill": [
            st.Page("views/prefill.py", title="Prefill", icon=":material/fast_forward:", default=True),
            st.Page("views/parallel_vs_sequential.py", title="Parallel vs token-by-token",
                    icon=":material/compare_arrows:"),
            st.Page("views/kv_cache.py", title="KV cache", icon=":material/storage:"),
            st.Page("views/watch.py", title="Watch it happen", icon=":material/play_circle:"),
            st.Page("views/attention.py", title="Attention", icon=":material/visibility:"),
            st.Page("views/kernels.py", title="Kernel timings", icon=":material/timer:"),
            st.Page("views/long_prompts.py", title="Long prompts", icon=":material/speed:"),
        ],
        "Serving many requests": [
            st.Page("views/chunked_prefill.py", title="Chunked prefill", icon=":material/view_timeline:"),
            st.Page("views/disaggregated.py", title="Disaggregated prefill", icon=":material/call_split:"),
            st.Page("views/prefix_cache.py", title="Prefix cache", icon=":material/recycling:"),
            st.Page("views/your_server.py", title="Your server", icon=":material/dns:"),
            st.Page("views/live_engine.py", title="Live engine", icon=":material/monitor_heart:"),
        ],
        "Learn": [
            st.Page("views/reproduce_papers.py", title="Reproduce the papers", icon=":material/science:"),
            st.Page("views/walkthrough.py", title="Guided lessons", icon=":material/school:"),
        ],
    }
    page = st.navigation(pages, expanded=True)
    st.session_state[PAGE_URL_PATH] = page.url_path  # for the page's share link
    with navigated_page():
        page.run()  # the whole page first, even while the model is being prepared (a page that ends early: stop_page)
    finish_page()  # then, if it is, the progress bar counts down until it is ready, and the page runs again
