"""A newcomer's first minute: while the model is being prepared, every page draws its title, its text and its
controls, a progress bar names the stage and about how long is left, and its run button waits and says so."""

import threading
from collections import OrderedDict
from pathlib import Path

from streamlit.testing.v1 import AppTest

from prefillviz.engine.errors import ModelLoadError
from prefillviz.ui import preparation, shell

APP = str(Path(__file__).resolve().parents[2] / "app.py")


def test_while_the_model_is_prepared_every_page_draws_itself_and_its_run_button_waits(monkeypatch):
    go = threading.Event()

    def load_model(model_id, **kwargs):  # a load that takes as long as the test needs
        go.wait(60)
        raise ModelLoadError("the test is over")

    monkeypatch.setattr(preparation, "_preparations", OrderedDict())  # not the model other tests made ready
    monkeypatch.setattr(preparation, "load_model", load_model)
    monkeypatch.setattr(shell, "PREPARE_TIMEOUT_S", 1.0)  # the page stops counting down after a second
    monkeypatch.setattr(preparation.bundled, "cache_ready", lambda: True)  # no dequantizing: loading is step 1
    try:
        app = AppTest.from_file(APP, default_timeout=60)
        app.run()
        assert not app.exception
        for page, title, preset, button, label in (
            (None, "Prefill", "prefill_preset", "prefill_run", "Run prefill"),
            ("views/kernels.py", "Kernel timings", "kernels_preset", "kernels_run", "Measure"),
            ("views/parallel_vs_sequential.py", "Parallel vs token-by-token", "parallel_preset", "parallel_run",
             "Run both ways"),
        ):
            if page is not None:
                app.switch_page(page).run()
            assert not app.exception and app.title[0].value.startswith(title)
            assert app.markdown and app.selectbox(key=preset).options  # its text and its controls
            bar = app.get("progress")[0].proto.text
            # and about how long is left, from this machine's last times ("a few more seconds" once past them)
            assert bar.startswith("Preparing bundled:SmolLM2-135M-Instruct, step 1 of 3: loading the model (")
            assert bar.endswith(" s left)") or bar.endswith("(a few more seconds)")
            waiting = [b for b in app.button if b.key.startswith(f"{button}__waiting")]
            assert len(waiting) == 1 and waiting[0].disabled
            assert waiting[0].label.startswith(f"{label} · model loading: ")
            assert any("still being prepared after 1 s" in w.value for w in app.warning)
    finally:
        go.set()
        for prepared in list(preparation._preparations.values()):
            prepared.done.wait(10)
