"""prefillviz: the prefill phase of a real language model, measured.

Entry point: the sidebar (model, device, dtype, what is loaded) and the navigation between
the views. Each view is a thin script in views/ that starts with ``page_frame()`` (the
sidebar, the loaded model, the share box), so a page also works when it runs without this
script (``AppTest.from_file("views/x.py")``). The folder is not named pages/: with one,
Streamlit runs a fresh server's first deep link (a shared link to /prefix_cache) through its
old pages-folder navigation, without this script, and the sidebar lists file names. The logic
lives in the prefillviz package; the navigation in views/navigation.py, where import-linter checks it.
"""

from views.navigation import main

main()
