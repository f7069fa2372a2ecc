"""Building and loading the project's C++ extensions (``engine_ops``, ``onednn_linear``) for this CPU.

Nothing about the CPU is assumed. torch's own probe (``torch.backends.cpu.get_cpu_capability``:
AVX512, AVX2 or DEFAULT; ``ATEN_CPU_CAPABILITY=avx2`` lowers it, for torch and for these
extensions alike) picks the compiler flags, and a build is named by that capability, its
sources, its flags and the torch version, so a build made for another CPU or an older source is
never loaded.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from pathlib import Path

import torch

BUILD_ROOT = Path(__file__).resolve().parents[3] / "build"
# torch's own compiler flags for each CPU capability it dispatches to (aten/src/ATen/native/cpu)
CAPABILITY_FLAGS = {
    "AVX512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma", "-DCPU_CAPABILITY_AVX512"],
    "AVX2": ["-mavx2", "-mfma", "-mf16c", "-DCPU_CAPABILITY_AVX2"],
}


def capability() -> str:
    """The vector units torch dispatches to on this CPU: AVX512, AVX2 or DEFAULT (anything else)."""
    found = torch.backends.cpu.get_cpu_capability()
    return found if found in CAPABILITY_FLAGS else "DEFAULT"


def flags(cap: str) -> list[str]:
    return ["-O3", "-fopenmp", *CAPABILITY_FLAGS.get(cap, [])]


def build_name(prefix: str, sources: list[Path], cap: str | None = None, extra: str = "") -> str:
    """``prefix_cap_digest``: the digest of the sources (headers too), the flags, ``extra`` and torch's version."""
    cap = cap or capability()
    text = b"".join(path.read_bytes() for path in sources) + " ".join(flags(cap)).encode() + extra.encode()
    digest = hashlib.sha1(text + torch.__version__.encode()).hexdigest()[:10]
    return f"{prefix}_{cap.lower()}_{digest}"


def build(name: str, folder: str, sources: list[Path], cap: str, include_paths: list[str] = (), ldflags: list[str] = (),
          verbose: bool = False) -> Path:
    """Compile ``sources`` (the first one compiled, the rest its headers) with torch's cpp_extension and ninja."""
    from torch.utils import cpp_extension

    directory = BUILD_ROOT / folder / name
    directory.mkdir(parents=True, exist_ok=True)
    # ninja comes from PyPI into this interpreter's bin folder, which need not be on PATH
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    cpp_extension.load(
        name, [str(sources[0])], extra_cflags=flags(cap), extra_ldflags=["-fopenmp", *ldflags],
        extra_include_paths=list(include_paths), build_directory=str(directory), verbose=verbose,
    )
    return directory / f"{name}.so"


def load(name: str, folder: str):
    """The built module, or None where it was not built."""
    path = BUILD_ROOT / folder / name / f"{name}.so"
    if not path.exists():
        return None
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def first_line(error: BaseException, limit: int = 200) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0][:limit]}" if text else type(error).__name__
