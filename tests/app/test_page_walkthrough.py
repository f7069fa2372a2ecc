"""The Guided lessons page on the bundled model (fp32): lesson 1, step 1 runs the real model,
the answer stays hidden until a prediction is made, Next/Back move between steps, and the
Prefill page then shows the same run with the lesson's prompt."""

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from prefillviz.loading.prompts import PRESETS

APP = str(Path(__file__).resolve().parents[2] / "app.py")
PAGE = "views/walkthrough.py"
LESSON = "01_prefill_and_ttft"
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def texts(elements) -> str:
    return " ".join(str(element.value) for element in elements)


def test_lesson_one_predict_run_reveal_navigate_and_the_prefill_page(bundled):
    app = AppTest.from_file(APP, default_timeout=240)
    app.session_state["sidebar_dtype"] = "float32"
    app.run()
    app.switch_page(PAGE).run()
    assert not app.exception and app.title[0].value == "Guided lessons"
    assert len(app.radio(key="lesson_choice").options) >= 5
    assert app.header[0].value == "1. One forward pass, or several?"
    assert app.button(key="lesson_back_top").disabled and app.button(key="lesson_reveal").disabled
    glossary = next(e for e in app.expander if e.label.startswith("Glossary"))  # beside every step
    assert "**TTFT**: Time to first token" in texts(glossary.markdown)

    app.button(key="lesson_run").click().run()  # the real model
    assert not app.exception and not app.error
    assert "Ran in" in texts(app.caption)
    assert app.button(key="lesson_reveal").disabled  # run, but nothing predicted yet: still hidden
    assert "Measured:" not in texts(app.markdown) and not app.get("plotly_chart")

    app.radio(key=f"lesson_predict_{LESSON}/0").set_value(1).run()  # "A few steps": the budget (24) is below the prompt
    assert not app.button(key="lesson_reveal").disabled
    app.button(key="lesson_reveal").click().run()
    assert not app.exception
    num_tokens = len(bundled.tokenizer(PRESETS["Chat with a system prompt"])["input_ids"])
    num_steps = -(-num_tokens // 24)
    assert f"**Measured:** A few steps (2 to 9) (measured: {num_steps})" in texts(app.markdown)
    # the text after the reveal, from the run
    assert f"{num_steps} steps for {num_tokens} prompt tokens" in texts(app.markdown)
    assert app.success[0].value.startswith("Right")
    assert app.get("plotly_chart") and app.radio(key=f"lesson_predict_{LESSON}/0").disabled  # the prediction is locked

    app.button(key="lesson_next_top").click().run()
    assert app.header[0].value == "2. Where the time to first token goes"
    assert app.button(key="lesson_reveal").disabled and not app.metric
    app.button(key="lesson_run").click().run()  # the default budget: one step, a run of its own
    assert not app.exception and not app.error
    app.button(key="lesson_lock").click().run()  # keep the slider's value as the prediction
    app.button(key="lesson_reveal").click().run()
    assert [metric.label for metric in app.metric[:2]] == ["Measured", "Your prediction"]
    assert app.metric[0].value.endswith("%") and app.metric[1].value == "50%"

    assert "(float32) the forward pass was" in texts(app.markdown)  # the reveal text names the run's device and dtype

    app.button(key="lesson_back_bottom").click().run()
    assert app.header[0].value == "1. One forward pass, or several?" and app.success  # still revealed

    app.switch_page("views/prefill.py").run()
    assert not app.exception
    assert app.text_area(key="prefill_prompt").value == PRESETS["Chat with a system prompt"]
    assert "Last run: “<|im_start|>system" in texts(app.caption)  # step 2's one-step run, not a new one


def test_a_step_sets_the_sidebar_dtype_before_it_runs(bundled):
    app = AppTest.from_file(APP, default_timeout=240)
    app.session_state["sidebar_dtype"] = "float32"
    app.run()
    app.switch_page(PAGE).run()
    app.radio(key="lesson_choice").set_value(2).run()  # lesson 3: the KV cache and GQA
    for _ in range(4):
        app.button(key="lesson_next_bottom").click().run()
    assert app.header[0].value == "5. Grouped-query attention"
    assert "dtype = auto" in texts(app.caption)

    app.button(key="lesson_run").click().run()
    assert not app.exception and not app.error
    assert app.selectbox(key="sidebar_dtype").value == "auto"  # the step's setting, applied before the run
    app.radio(key="lesson_predict_03_kv_cache_and_gqa/4").set_value(1).run()  # "3× larger"
    app.button(key="lesson_reveal").click().run()
    assert app.success[0].value.startswith("Right") and "3× larger (measured: 3)" in texts(app.markdown)
    assert app.button(key="lesson_next_bottom").label == "Next lesson ▶"
    app.button(key="lesson_next_bottom").click().run()
    assert (app.radio(key="lesson_choice").value == 3
            and app.header[0].value == "1. A long prompt arrives while others are decoding")


def test_the_full_views_show_the_lessons_runs(bundled):
    """A step saves its run where its view reads it: each page draws the lesson's run (small scale)."""
    from prefillviz import lessons

    results = {}
    for kind in ("parallel_vs_sequential", "roofline", "chunked", "prefix"):
        action = next(s.action for lesson in lessons.load_lessons() for s in lesson.steps if s.action["kind"] == kind)
        results.update(lessons.page_results(lessons.run_action(bundled, action, scale=0.05), "timing pass · test"))
    app = AppTest.from_file(APP, default_timeout=240)
    app.session_state["sidebar_dtype"] = "float32"
    app.run()
    app.session_state["results"] = results
    for page, expected in [
        ("views/parallel_vs_sequential.py", "Last run: 20 prompt tokens (the first 20 of"),
        ("views/chunked_prefill.py", "Last run: 3 short request(s)"),
        ("views/prefix_cache.py", "Last run: 3 requests"),
    ]:
        app.switch_page(page).run()
        assert not app.exception and expected in texts(app.caption), page
        assert app.get("plotly_chart")


def test_the_watch_and_long_prompt_views_show_the_lessons_runs(bundled):
    """The replay step's run plays on Watch it happen, the block-sparse step's fills the Long prompts table."""
    from prefillviz import lessons

    results = {}
    for kind in ("kv_write_order", "sparse_speedup"):
        action = next(s.action for lesson in lessons.load_lessons() for s in lesson.steps if s.action["kind"] == kind)
        results.update(lessons.page_results(lessons.run_action(bundled, action, scale=0.05), "test"))
    app = AppTest.from_file(APP, default_timeout=240)
    app.session_state["sidebar_dtype"] = "float32"
    app.run()
    app.session_state["results"] = results
    app.switch_page("views/watch.py").run()
    frames = results["watch"]["payload"]["num_frames"]
    assert not app.exception and f"{frames:,} recorded events · {bundled.model_id}" in texts(app.caption)
    app.switch_page("views/long_prompts.py").run()
    assert not app.exception and "At N = 512, attention is" in texts(app.markdown)
