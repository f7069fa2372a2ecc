"""scripts/peer_llamacpp.py needs llama-cpp-python, which is not a dependency: without it the
script says how to install it and exits with status 2 (with it, it is a benchmark, not a test)."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is not None, reason="llama-cpp-python is installed here")
def test_without_llama_cpp_the_peer_script_says_how_to_get_it():
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "peer_llamacpp.py")], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 2 and "pip install llama-cpp-python" in done.stderr
