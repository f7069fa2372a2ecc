"""The placeholder page runs a real prefill of the bundled model and survives bad input."""

from pathlib import Path

from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parents[2] / "app.py")


def make_app():
    app = AppTest.from_file(APP, default_timeout=240)
    app.run()
    app.selectbox(key="dtype").set_value("float32")
    return app


def test_run_prefill_shows_the_first_token(bundled):
    app = make_app()
    app.button(key="run").click().run()
    assert not app.exception and not app.error
    assert app.metric[0].value == "' Paris'"
    assert app.metric[2].value == "5 / 1"


def test_empty_prompt_shows_an_error_and_keeps_the_last_result(bundled):
    app = make_app()
    app.button(key="run").click().run()
    app.text_area(key="prompt").set_value("   ")
    app.button(key="run").click().run()
    assert "empty" in app.error[0].value
    assert app.metric[0].value == "' Paris'"  # the earlier result is still shown
