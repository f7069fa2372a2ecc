"""The model made ready behind the page (ui/preparation.py): its stages in order, what the progress bar says,
the seconds left from this machine's own last times, a failure kept as one message and tried again."""

import threading
import time
from types import SimpleNamespace

import pytest

from prefillviz.loading.model_registry import BUNDLED_MODEL_ID
from prefillviz.ui import preparation


@pytest.fixture
def slow_stages(monkeypatch, tmp_path):
    """A preparation whose stages each wait for the test's go (no model): load, time the kernels, warm up."""
    monkeypatch.setenv("PREFILLVIZ_CACHE", str(tmp_path))
    go = {stage: threading.Event() for stage in ("load", "kernels", "warm up")}

    def load(*args, progress=None, **kwargs):
        progress("saving a safetensors copy to the cache for fast loads")  # past the dequantizing
        go["load"].wait(10)
        return SimpleNamespace(warm_up_s=None, model=None)

    monkeypatch.setattr(preparation, "load_model", load)
    go["timed"] = []  # the buckets of each prepare_dispatch call, in order (None: every bucket)

    def prepare_dispatch(loaded, buckets=None):
        go["timed"].append(buckets)
        go["kernels"].wait(10)

    monkeypatch.setattr(preparation, "prepare_dispatch", prepare_dispatch)
    left = ["mixed", "prefill_512", "prefill_2048"]  # the other step shapes, one a turn once the queue is idle

    def time_next_bucket(model):
        go["timed"].append(left.pop(0) if left else None)
        return bool(go["timed"][-1])

    monkeypatch.setattr(preparation, "time_next_bucket", time_next_bucket)
    monkeypatch.setattr(preparation, "IDLE_BEFORE_TIMING_S", 0.01)
    monkeypatch.setattr(preparation, "warm_up", lambda loaded: go["warm up"].wait(10) and 0.5)
    monkeypatch.setattr(preparation.bundled, "bundled_package_installed", lambda: True)
    monkeypatch.setattr(preparation.bundled, "cache_ready", lambda: False)  # an empty cache: the first start
    return go


def wait_for(condition, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_a_first_start_goes_through_each_stage_and_says_where_it_is(slow_stages):
    prepared = preparation.Preparation(BUNDLED_MODEL_ID, "cpu", "float32")
    assert prepared.stages == ["dequantize", "load", "kernels", "warm up"]
    wait_for(lambda: prepared.stage == "load")
    assert "step 2 of 4: loading the model" in prepared.text() and not prepared.ready
    expected = prepared.expected  # no times of this machine yet: each stage's estimate
    assert prepared.seconds_left() <= expected["load"] + expected["kernels"] + expected["warm up"]
    assert prepared.seconds_left() > expected["kernels"] + expected["warm up"] - 1e-9
    assert 0 < prepared.fraction() < 1
    slow_stages["load"].set()
    wait_for(lambda: prepared.stage == "kernels")
    assert "step 3 of 4: timing this machine's kernels (first start only)" in prepared.text()
    slow_stages["kernels"].set()
    wait_for(lambda: prepared.stage == "warm up")
    assert "step 4 of 4: warming up" in prepared.text()
    slow_stages["warm up"].set()
    assert prepared.done.wait(10) and prepared.ready and prepared.error is None
    assert prepared.loaded.warm_up_s == 0.5 and prepared.seconds_left() == 0 and prepared.fraction() == 1
    assert set(prepared.durations) == {"dequantize", "load", "kernels", "warm up"}
    # the first page's step shapes timed before it is ready, the others after, one at a time
    wait_for(lambda: len(slow_stages["timed"]) == 5)
    assert slow_stages["timed"] == [preparation.FIRST_BUCKETS, "mixed", "prefill_512", "prefill_2048", None]
    # the next start on this machine counts down from what this one took
    assert preparation.measured_seconds() == pytest.approx(prepared.durations, abs=1e-3)


def test_a_failed_preparation_is_one_message_and_the_next_visit_tries_again(monkeypatch, tmp_path):
    from prefillviz.engine.errors import ModelLoadError

    monkeypatch.setenv("PREFILLVIZ_CACHE", str(tmp_path))
    attempts = []

    def load(model_id, **kwargs):
        attempts.append(model_id)
        raise ModelLoadError(f"Could not load {model_id!r}: no such folder.")

    monkeypatch.setattr(preparation, "load_model", load)
    prepared = preparation.preparation("/no/such/model", "cpu", "float32")
    assert prepared.done.wait(10) and not prepared.ready
    assert prepared.error == "Could not load '/no/such/model': no such folder."
    assert preparation.preparation("/no/such/model", "cpu", "float32") is prepared  # shared until shown
    preparation.forget(prepared)
    again = preparation.preparation("/no/such/model", "cpu", "float32")
    assert again is not prepared and again.done.wait(10) and attempts == ["/no/such/model"] * 2
    preparation.forget(again)


@pytest.mark.parametrize("hosted", ["0", "1"])
def test_make_run_starts_preparing_the_model_the_first_page_opens_with(monkeypatch, hosted):
    """``make run`` (ui/start.py) starts the preparation of the sidebar's first model, device and dtype before the
    server takes its first visitor, so the pages find that same preparation (hosted: the allow-listed model)."""
    from prefillviz.loading.hosted import hosted_policy
    from prefillviz.ui import settings, start

    monkeypatch.setenv("PREFILLVIZ_HOSTED", hosted)
    started = []
    monkeypatch.setattr(preparation, "preparation", lambda *key: started.append(key))
    start.prepare_first_page()
    policy = hosted_policy()
    expected_model = policy.allowed_model_ids[0] if policy.enabled else BUNDLED_MODEL_ID
    assert started == [(expected_model, settings.device_choices()[0], settings.dtype_choices()[0])]
    assert settings.model_choices()[0] == expected_model
