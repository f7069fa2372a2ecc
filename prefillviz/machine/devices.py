"""Which device and dtype a model runs in here, and whether that dtype really runs on this CPU.

``resolve_device`` and ``resolve_dtype`` turn the names the sidebar and the command line
offer (``auto``, ``cpu``, ``cuda``, ``bfloat16``, ...) into torch objects. No CPU feature is
assumed: ``check_dtype`` runs the ops a forward needs on tiny tensors in that dtype, once per
process, and a dtype this CPU can't run is refused up front with a message instead of a
traceback mid-run. How fast a dtype that runs is, next to float32, is ``dtype_speed.py``'s.
"""

from __future__ import annotations

import functools
import os
import platform
import re
from pathlib import Path

import torch
import torch.nn.functional as F

from prefillviz.engine.errors import ModelLoadError
from prefillviz.machine.timers import time_call

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def dtype_name(dtype: torch.dtype | str) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"`` (names as the sidebar and the command line spell them)."""
    return str(dtype).removeprefix("torch.")


def resolve_device(name: str | torch.device = "auto") -> torch.device:
    """Picks the torch device to run on.

    Args:
        name: ``"auto"`` (CUDA, then MPS, then CPU) or a device such as ``"cpu"``,
            ``"cuda"``, ``"cuda:1"``, ``"mps"``.

    Returns:
        The device.

    Raises:
        ModelLoadError: The name is not a device, or that device is not available here.
    """
    if name is None or name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError) as exc:
        raise ModelLoadError(f"{name!r} is not a device; use auto, cpu, cuda, cuda:N or mps.") from exc
    if device.type == "cpu":
        return device
    backend = torch.backends.mps if device.type == "mps" else getattr(torch, device.type, None)
    available = backend is not None and hasattr(backend, "is_available") and backend.is_available()
    if available and device.index is not None and hasattr(backend, "device_count"):
        available = device.index < backend.device_count()
    if not available:
        raise ModelLoadError(f"Device {str(device)!r} is not available on this machine; try device 'auto' or 'cpu'.")
    return device


@functools.cache
def cuda_fallback_note() -> str:
    """Why this CUDA build of torch runs on the CPU here ('' where it has a GPU, or is a CPU build).

    ``torch.cuda.is_available()`` is quietly False when the wheel's CUDA is newer than the
    host's driver (PyPI's CUDA wheel on an older host), or when there is no driver at all;
    ``torch.cuda.init()`` raises with the reason, which this returns for the sidebar.
    """
    if torch.version.cuda is None or torch.cuda.is_available():
        return ""
    try:
        torch.cuda.init()
        reason = "torch.cuda.is_available() is False"
    except Exception as error:  # noqa: BLE001 -- any failure to start CUDA is the reason we show
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:240]
    return (
        f"This torch is built for CUDA {torch.version.cuda}, but no GPU can be used here, "
        f"so everything runs on the CPU: {reason}"
    )


BF16_AUTO_SPEEDUP = 1.25  # auto picks bfloat16 on a CPU only where it measured at least this much faster than float32


@functools.cache
def cpu_bf16_speedup() -> float | None:
    """float32 time over bfloat16 time of a prefill-shaped slice, measured on this CPU once per process.

    The slice: a 128-token linear of the bundled model's MLP width (576 -> 1536) and causal
    attention over 9 heads of 64, as torch runs them (oneDNN picks AMX, AVX512-BF16 or AVX2 code
    itself); median of 3 timed runs each (~0.2 s in all). None where bfloat16 can't run here.
    """
    if not check_dtype(torch.device("cpu"), torch.bfloat16)[0]:
        return None
    generator = torch.Generator().manual_seed(0)

    def slice_s(dtype: torch.dtype) -> float:
        x = torch.randn(128, 576, generator=generator).to(dtype)
        weight = torch.randn(1536, 576, generator=generator).to(dtype)
        q = torch.randn(1, 9, 128, 64, generator=generator).to(dtype)

        def layer_slice() -> None:
            F.linear(x, weight)
            F.scaled_dot_product_attention(q, q, q, is_causal=True)

        return time_call(layer_slice, torch.device("cpu"), runs=3, warmup=1, min_run_time_s=0.005).median_s

    return slice_s(torch.float32) / slice_s(torch.bfloat16)


def resolve_dtype(name: str | torch.dtype = "auto", device: str | torch.device | None = None) -> torch.dtype:
    """Picks the dtype to run the model in.

    Args:
        name: ``"auto"``, ``"float32"``, ``"bfloat16"`` or ``"float16"`` (or a ``torch.dtype``).
            ``"auto"`` is bfloat16 on CUDA, float32 on MPS, and on CPU bfloat16 where it
            measured at least ``BF16_AUTO_SPEEDUP`` times faster than float32 here
            (``cpu_bf16_speedup``: no CPU flag is read), else float32.
        device: The device the model will run on; None means ``resolve_device("auto")``.

    Returns:
        The dtype.

    Raises:
        ModelLoadError: The name is not one of the dtypes above.
    """
    if isinstance(name, torch.dtype):
        if name not in DTYPES.values():
            raise ModelLoadError(f"dtype {name} is not supported; use one of auto, {', '.join(DTYPES)}.")
        return name
    if name in DTYPES:
        return DTYPES[name]
    if name != "auto":
        raise ModelLoadError(f"Unknown dtype {name!r}; use one of auto, {', '.join(DTYPES)}.")
    device_type = resolve_device(device if device is not None else "auto").type
    if device_type == "cuda":
        return torch.bfloat16
    if device_type == "cpu" and (cpu_bf16_speedup() or 0.0) >= BF16_AUTO_SPEEDUP:
        return torch.bfloat16
    return torch.float32


def _forward_ops(device: torch.device, dtype: torch.dtype) -> None:
    """The op kinds a decoder forward runs, on tiny tensors: embedding, RMSNorm, linear, RoPE,
    SiLU, SDPA with a causal mask, the paged KV write (index_copy_), softmax and top-k."""
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(1, 5, 32, generator=generator).to(device=device, dtype=dtype)  # (B, T, D)
    table = torch.randn(10, 32, generator=generator).to(device=device, dtype=dtype)
    weight = torch.randn(32, 32, generator=generator).to(device=device, dtype=dtype)
    tokens = torch.tensor([[1, 2, 3, 4, 5]], device=device)
    with torch.inference_mode():
        x = F.embedding(tokens, table) + hidden
        x = x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5).to(dtype)
        x = F.silu(F.linear(x, weight)) * F.linear(x, weight)
        q = x.view(1, 5, 4, 8).transpose(1, 2)  # (B, H, T, d)
        q = torch.cat((-q[..., 4:], q[..., :4]), dim=-1) * q.cos() + q * q.sin()
        cache = torch.zeros(8, 4, 8, device=device, dtype=dtype)  # (slots, KVH, d)
        cache.index_copy_(0, torch.arange(5, device=device), q[0].transpose(0, 1))
        keys = cache[:5].transpose(0, 1).unsqueeze(0)
        out = F.scaled_dot_product_attention(q, keys, keys, is_causal=True)
        logits = F.linear(out.transpose(1, 2).reshape(1, 5, 32), table)
        torch.softmax(logits[:, -1].float(), dim=-1).topk(3)
        if not bool(torch.isfinite(logits).all()):
            raise RuntimeError("non-finite results")


@functools.cache
def check_dtype(device: torch.device | str, dtype: torch.dtype) -> tuple[bool, str]:
    """(whether a forward's ops run in ``dtype`` on ``device``, why not), tried once per process."""
    device = torch.device(device)
    try:
        _forward_ops(device, dtype)
    except (RuntimeError, NotImplementedError, TypeError) as error:
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
        return False, f"{dtype_name(dtype)} can't run on this {device.type} ({reason})"
    return True, ""


def require_dtype(device: torch.device, dtype: torch.dtype) -> None:
    """Refuses up front a dtype whose ops fail on this device.

    Raises:
        ModelLoadError: with what failed and what to pick instead.
    """
    runs, why = check_dtype(device, dtype)
    if not runs:
        raise ModelLoadError(f"{why}. Pick float32 (or dtype auto, which picks what runs here).")


def machine_name(device: str | torch.device = "cpu") -> str:
    """The GPU name for CUDA devices, else the CPU model name (``/proc/cpuinfo`` on Linux)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown cpu"


def machine_slug(device: str | torch.device = "cpu") -> str:
    """``machine_name`` as a file name's part: lower case, runs of other characters as one ``-``."""
    return re.sub(r"[^A-Za-z0-9]+", "-", machine_name(device)).strip("-").lower() or "unknown"


def cache_root() -> Path:
    """Where prefillviz keeps what it makes once per machine (the bundled model's copy, the peaks, the
    dispatch tables): ``$PREFILLVIZ_CACHE``, default ``~/.cache/prefillviz``."""
    return Path(os.environ.get("PREFILLVIZ_CACHE", "~/.cache/prefillviz")).expanduser()
