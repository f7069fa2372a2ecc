"""Shared fixtures: a tiny random Llama (fast) and the bundled real model (loaded once).

Every test gets its tier's marker from its folder (tests/unit -> ``unit``, ...), and
``bundled`` when it uses the bundled model, so ``-m "model and not bundled"`` is the model
tier's quick part. The markers are registered in pyproject.toml.
"""

from pathlib import Path

import pytest
import torch

from tests.hf_oracle import hf_last_logits
from tests.tiny_models import make_tiny_llama
from tests.tolerances import MODEL_STEPS, assert_same_greedy_token, logits_allowed_difference

TESTS = Path(__file__).resolve().parent
TIERS = ("unit", "model", "app", "browser", "peer", "space")  # folder name = marker name


@pytest.hookimpl(tryfirst=True)  # before -m deselects by these markers
def pytest_collection_modifyitems(items):
    for item in items:
        path = item.path.resolve()
        folder = path.relative_to(TESTS).parts[0] if path.is_relative_to(TESTS) else None
        if folder in TIERS:
            item.add_marker(folder)
        params = item.callspec.params.values() if hasattr(item, "callspec") else ()
        by_param = any(isinstance(value, str) and value == "bundled" for value in params)  # request.getfixturevalue
        if "bundled" in item.fixturenames or by_param:  # by name, or through another fixture
            item.add_marker("bundled")


@pytest.fixture(scope="session", autouse=True)
def dispatch_tables_in_a_temporary_folder(tmp_path_factory):
    """The dispatch tables the suite measures (on tiny models, under its own load) stay in a folder of
    the run's, shared by its tests and the app processes they start, never the user's cache."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PREFILLVIZ_DISPATCH_CACHE", str(tmp_path_factory.mktemp("dispatch")))
        yield


@pytest.fixture(autouse=True)
def not_hosted_unless_asked(monkeypatch):
    """Every test starts off hosted mode, even where the suite runs on a Space (``SPACE_ID``) or with
    ``PREFILLVIZ_HOSTED`` exported; the hosted tests set them themselves."""
    monkeypatch.delenv("SPACE_ID", raising=False)
    monkeypatch.delenv("PREFILLVIZ_HOSTED", raising=False)


@pytest.fixture(autouse=True)
def no_shared_runs_between_tests():
    """Each test measures its own runs: the app shares identical runs between sessions for a minute
    (ui/shared_runs.py), and one test's AppTest must not get another test's result."""
    from prefillviz.ui.shared_runs import SHARED_RUNS

    SHARED_RUNS.clear()
    yield


@pytest.fixture
def one_torch_thread():
    """Test machines are shared: one intra-op thread avoids OpenMP oversubscription stalls."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(params=["textbook", "measured"])
def backend(request):
    """Each of the engine's backends in turn, for the engines a test makes without naming one: the textbook's
    plain torch ops (``engine/backend.py``) and the measured backend (``prefillviz/backends``)."""
    from prefillviz.backends.measured import MEASURED
    from prefillviz.engine.backend import TorchBackend, using_backend

    chosen = TorchBackend() if request.param == "textbook" else MEASURED
    with using_backend(chosen):
        yield chosen


@pytest.fixture(scope="session")
def tiny_llama():
    return make_tiny_llama()


@pytest.fixture(scope="session")
def bundled():
    """SmolLM2-135M-Instruct from the bundled GGUF, fp32 on CPU (the oracle tests' real model)."""
    from prefillviz.loading.models import load_model

    return load_model(device="cpu", dtype="float32")


def assert_matches_hf(model, token_ids, engine_logits, steps=MODEL_STEPS):
    """The engine's next-token logits against the plain HF forward of the whole prompt, in the model's
    dtype: within ``steps`` of its grid at max |logit| (with the fp32 sums of the model's widths and
    the prompt's keys, ``tests/tolerances.py``), and the same greedy token where the top two are apart."""
    reference = hf_last_logits(model, token_ids)
    allowed = logits_allowed_difference(model, reference, num_tokens=len(token_ids), steps=steps)
    difference = (engine_logits.float() - reference).abs().max().item()
    assert difference <= allowed, (
        f"max |engine - HF| = {difference:.2e} > {allowed:.2e} ({steps} steps of {next(model.parameters()).dtype})"
    )
    assert_same_greedy_token(reference, engine_logits, allowed)
    return difference


@pytest.fixture(scope="session")
def app_url(bundled):
    """``streamlit run app.py`` on 127.0.0.1, started once for the real-browser tests (tests/browser,
    and tests/peer's page against a real vllm serve). Its first visitor sees a fresh server."""
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "app.py", "--server.address", "127.0.0.1",
         "--server.port", str(port), "--server.headless", "true", "--browser.gatherUsageStats", "false"],
        cwd=TESTS.parent, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).read() == b"ok":
                break
        except OSError:
            time.sleep(0.5)
    else:
        server.kill()
        pytest.fail("streamlit did not start within 60 s")
    yield url
    server.terminate()
    server.wait(timeout=20)


def built_module(status, disable_env: str, what: str):
    """A C++ extension's module that `make` builds, so CI must have it (unless ``disable_env`` turns
    it off); elsewhere (no compiler or library, or before `make`) the tests that need it skip."""
    import os

    module, why = status()
    if module is None:
        if os.environ.get("CI") and disable_env not in os.environ:
            pytest.fail(f"CI builds {what} with `make`, but: {why}")
        pytest.skip(why)
    return module


@pytest.fixture(scope="session")
def onednn():
    """prefillviz/backends/ops/onednn_linear.py's module (`make` installs Debian's oneDNN as root, then builds it)."""
    from prefillviz.backends.ops.onednn_linear import DISABLE_ENV, onednn_status

    return built_module(onednn_status, DISABLE_ENV, "oneDNN's matmul")


@pytest.fixture(scope="session")
def compiled_ops():
    """The engine's C++ ops (prefillviz/backends/ops/engine_ops.py)."""
    from prefillviz.backends.ops.engine_ops import DISABLE_ENV, engine_ops_status

    return built_module(engine_ops_status, DISABLE_ENV, "the engine's C++ ops")
