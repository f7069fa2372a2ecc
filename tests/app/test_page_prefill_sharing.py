"""Two sessions (two AppTests, one server process) on the Prefill page: the same preset is measured
once and the second session says it joined; a different prompt is measured by its own session; a
session pressing "Run prefill" again measures anew."""

from prefillviz.ui.shared_runs import SHARED_RUNS
from tests.app.pages import open_page


def run_prefill(app, preset: str | None = None, prompt: str | None = None):
    if preset is not None:
        app.selectbox(key="prefill_preset").set_value(preset).run()
    if prompt is not None:
        app.text_area(key="prefill_prompt").set_value(prompt).run()
    app.button(key="prefill_run").click().run()
    assert not app.exception
    return " ".join(c.value for c in app.caption)


def test_the_same_preset_is_measured_once_for_two_sessions_and_different_prompts_are_not(bundled):
    first, second, third = open_page(), open_page(), open_page()
    prompt = "Shared runs, checked at 14:02: what is a KV cache?"  # a prompt no other test measured
    before = SHARED_RUNS.measured
    assert "Measured by this session: measured once for 1 viewer(s)." in run_prefill(first, prompt=prompt)
    caption = run_prefill(second, prompt=prompt)
    assert "Joined an identical run another session started: measured once for 2 viewer(s)." in caption
    assert SHARED_RUNS.measured == before + 1  # one measurement for both sessions
    assert "Measured by this session" in run_prefill(third, prompt=prompt + " And why?")  # other inputs: its own run
    assert SHARED_RUNS.measured == before + 2
    assert "Measured by this session" in run_prefill(first)  # the same session asking again measures anew
    assert SHARED_RUNS.measured == before + 3
