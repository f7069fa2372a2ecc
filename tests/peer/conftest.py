"""The peer tier needs real vLLM: without ``.venv-vllm`` its tests skip locally and fail in CI
(which builds it with ``make test``)."""

import os

import pytest

from prefillviz.peers.vllm_client import unavailable_reason


@pytest.fixture(scope="session")
def needs_vllm():
    reason = unavailable_reason()
    if reason:
        pytest.fail(reason) if os.environ.get("CI") else pytest.skip(reason)
