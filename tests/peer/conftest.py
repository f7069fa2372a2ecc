"""The peer tier needs real vLLM: without ``.venv-vllm`` its tests skip locally and fail in CI
(which builds it with ``make test``). ``vllm_worker`` is the app's own fp32 worker, shared by the
tests and the pages' "Run on vLLM too" (one vLLM start, 10-20 s on 2 cores, instead of two)."""

import os

import pytest

from prefillviz.peers.vllm_client import unavailable_reason


@pytest.fixture(scope="session")
def needs_vllm():
    reason = unavailable_reason()
    if reason:
        pytest.fail(reason) if os.environ.get("CI") else pytest.skip(reason)


@pytest.fixture(scope="session")
def vllm_worker(needs_vllm, bundled):  # bundled: its first load writes the safetensors copy vLLM reads
    """The app process's fp32 vLLM worker (``ui.vllm_panel``'s cached one), closed at the end."""
    from prefillviz.ui.vllm_panel import _worker

    worker = _worker("float32")
    yield worker
    worker.close()
    assert not worker.alive
