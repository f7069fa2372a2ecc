"""Helpers for the AppTests: open the app on a page (bundled model, fp32) and read its charts."""

import base64
import json
from pathlib import Path

import numpy as np
from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parents[2] / "app.py")


def open_page(page: str | None = None, dtype: str | None = "float32") -> AppTest:
    """The app with the sidebar dtype set to ``dtype`` (None: left as it is, e.g. fixed in hosted mode),
    switched to ``views/<page>.py``."""
    app = AppTest.from_file(APP, default_timeout=240)
    app.run()
    if dtype is not None:
        app.selectbox(key="sidebar_dtype").set_value(dtype).run()
    if page is not None:
        app.switch_page(f"views/{page}.py").run()
    return app


def chart_specs(app: AppTest) -> dict[str, dict]:
    """Every plotly chart on the page: element id -> its JSON spec."""
    return {chart.proto.id: json.loads(chart.proto.spec) for chart in app.get("plotly_chart")}


def chart_titled(app: AppTest, title_start: str) -> dict:
    return next(spec for spec in chart_specs(app).values() if spec["layout"]["title"]["text"].startswith(title_start))


def plotly_array(value) -> np.ndarray:
    """A plotly spec array: a plain list, or numpy's base64 typed array (plotly >= 6)."""
    if isinstance(value, dict) and "bdata" in value:
        flat = np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"])
        return flat.reshape([int(d) for d in str(value.get("shape", len(flat))).split(",")])
    return np.array(value)


def small_chunked_workload(app: AppTest, prefix: str = "chunked") -> None:
    """A page's chunked-prefill workload controls (``ui.workload_controls``) set to a workload small
    enough to check by hand: 2 short requests of 8 tokens + 3 new, a 64-token prompt arriving at step 1, budget 24."""
    app.slider(key=f"{prefix}_num_short").set_value(2)
    app.slider(key=f"{prefix}_short_prompt_tokens").set_value(8)
    app.slider(key=f"{prefix}_short_new_tokens").set_value(3)
    app.slider(key=f"{prefix}_long_prompt_tokens").set_value(64)
    app.slider(key=f"{prefix}_arrival_step").set_value(1)
    app.number_input(key=f"{prefix}_token_budget").set_value(24)


INSPECTION_PROMPT = "The capital of France is Paris, and the capital of Italy is"


def after_a_prefill_run(page: str) -> AppTest:
    """The app after a Prefill-page run of "The capital of France is" (5 tokens), switched to ``page``."""
    app = open_page()
    app.selectbox(key="prefill_preset").set_value("Short question").run()
    app.button(key="prefill_run").click().run()
    app.switch_page(f"views/{page}.py").run()
    return app


def run_inspection_here(app: AppTest, prefix: str, prompt: str = INSPECTION_PROMPT, chunk_size: int = 0) -> None:
    """Fill the shared inspection-run controls (ui/inspection_source) of a page and click run."""
    app.text_area(key=f"{prefix}_prompt").set_value(prompt)
    app.number_input(key=f"{prefix}_chunk_size").set_value(chunk_size)
    app.button(key=f"{prefix}_run").click().run()
