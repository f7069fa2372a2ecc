"""Linear layers with their weights packed once, on a CPU (as torch.compile does with frozen weights).

A stock ``nn.Linear`` on a CPU passes its plain (out, in) weight to the matmul library at
every call. With frozen weights one can instead reorder each weight once into oneDNN's
blocked layout (``torch.ops.mkldnn._reorder_linear_weight``) and call the packed matmul
(``torch.ops.mkldnn._linear_pointwise``): the ops torch.compile's CPU freezing pass
(``torch/_inductor/fx_passes/mkldnn_fusion.py``) puts in a graph for bf16 weights. Where
``prefillviz/backends/ops/onednn_linear.py`` runs (Debian's oneDNN, built by ``make``), ``pack_weight`` packs for
oneDNN's matmul primitive instead, kept per row count as vLLM's CPU backend keeps it, which
saves the op's per-call set-up: 1.2-1.5x on a 32-row fp32 matmul, 2-4x on one row.
``python -m prefillviz bench`` times it (``details.packed_weights``: one forward of the
bundled model at 1, 32 and N tokens, packed over stock, interleaved pairs; docs/BENCHMARKS.md has the
figures): decode steps and short chunks (a prefix-cache hit, chunked prefill) gain most.

Not every CPU can run the packed op (oneDNN's bf16 path needs AVX-512 BW/VL/DQ or
AVX-NE-CONVERT), so ``cpu_runs_packed_linear`` tries it once per dtype on a tiny matrix and
the engine falls back to the stock linears, saying why, where it fails.

While ``packed_linears(model)`` is active in a thread, every plain ``nn.Linear`` of the model
computes with its packed copy; in every other thread the same module computes exactly as
before (``F.linear``). The model is shared by the app's sessions, so it follows
``shared_settings``, as the engine's attention does: the linears' forward is rerouted while
any thread is inside a block and restored when the last one leaves, and which threads run
packed is a thread-local. The module keeps its own weight: the plain Hugging Face forward,
the oracle of every test, never sees the packed copies. They cost one more copy of the
linear weights, made on first use (the app's warm-up pays it) and remade when a weight changes
(a new dtype, device or values).
"""

from __future__ import annotations

import functools
import os
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from prefillviz.backends.ops.brgemm_linear import BrgemmLinear
from prefillviz.backends.ops.onednn_linear import onednn_linear, onednn_runs
from prefillviz.backends.shared_settings import shared_setting
from prefillviz.machine.devices import dtype_name

PACKABLE_DTYPES = (torch.bfloat16, torch.float32)
FORCE_STOCK_ENV = "PREFILLVIZ_STOCK_LINEARS"
ONEDNN_SCOPE = "onednn::matmul"  # the profiler's name for a call of prefillviz/backends/ops/onednn_linear.py's Linear
BRGEMM_LINEAR = "brgemm linear"  # dispatch.BRGEMM_LINEAR
SLAB_LINEAR = "slab linear"  # dispatch.SLAB_LINEAR: the brgemm linear's packs and op, the engine's fp32 micro-kernel


def gated_packs(implementation: str) -> bool:
    """Whether ``implementation`` packs a gated MLP's [gate; up] into one call that returns the activation."""
    return implementation in (BRGEMM_LINEAR, SLAB_LINEAR)


_active = threading.local()  # .packs: {Linear: packed weight} while packed_linears runs in this thread
# model -> {implementation: ({Linear: (weight key, the storage it was packed from, packed weight)},
#                            {Linear: packed weight})}
_models: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def packing_available(device: torch.device | str, dtype: torch.dtype) -> tuple[bool, str]:
    """(whether linears on this device and dtype can run packed, why not when they can't)."""
    if torch.device(device).type != "cpu":
        return False, "pre-packed weights are a CPU path (oneDNN); on a GPU the matmuls run as they are"
    if dtype not in PACKABLE_DTYPES:
        return False, f"no pre-packed matmul for {dtype_name(dtype)} here"
    stock_forced = os.environ.get(FORCE_STOCK_ENV, "").strip() not in ("", "0")  # then the probe below says why not
    if not stock_forced and onednn_linear(dtype) is not None:
        return True, ""
    if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return False, "this torch build has no oneDNN packed linear"
    return cpu_runs_packed_linear(dtype)


@functools.cache
def cpu_runs_packed_linear(dtype: torch.dtype) -> tuple[bool, str]:
    """Whether this CPU can run the packed op in ``dtype``: tried once per process on a tiny matmul.

    oneDNN's packed bf16 path needs vector units that many CPUs lack (AVX-512 BW/VL/DQ or
    AVX-NE-CONVERT; an AVX2-only CPU raises ``mkldnn_reorder_linear_weight: bf16 path needs
    the cpu support ...``). No CPU flag is assumed: the op is run, and compared with
    ``F.linear``. Where it fails, the engine runs the stock linears and says why.
    ``PREFILLVIZ_STOCK_LINEARS=1`` makes it answer no on any CPU (to run the suite, or the app,
    as an AVX2-only machine would).
    """
    if os.environ.get(FORCE_STOCK_ENV, "").strip() not in ("", "0"):
        return False, f"{FORCE_STOCK_ENV} is set: stock linear layers run, as on a CPU that can't pack"
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(16, 32, generator=generator).to(dtype)  # (out, in)
    x = torch.randn(3, 32, generator=generator).to(dtype)
    try:
        with torch.inference_mode():
            packed = packed_linear(x, pack_weight(weight, "torch packed"))
            expected = F.linear(x, weight)
    except RuntimeError as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return False, (f"this CPU can't run oneDNN's packed {dtype_name(dtype)} matmul ({reason}); "
                       "stock linear layers run instead")
    # each side rounds its outputs once (a step of dtype each) + two fp32 sums of 32 unit-normal products
    # (sqrt(32) eps_fp32 x sum |x w| ~ 32)
    tolerance = 2 * torch.finfo(dtype).eps + 2 * 32**1.5 * torch.finfo(torch.float32).eps
    if packed.shape != expected.shape or not torch.allclose(packed.float(), expected.float(),
                                                            rtol=tolerance, atol=tolerance):
        return False, (f"oneDNN's packed {dtype_name(dtype)} matmul gave wrong results on this CPU; "
                       "stock linear layers run instead")
    return True, ""


def packing_status(model: torch.nn.Module) -> tuple[bool, str]:
    """(whether ``packed_linears`` packs this model's linears, why not when it doesn't)."""
    parameter = next(model.parameters(), None)
    if parameter is None:
        return False, "the model has no weights"
    return packing_available(parameter.device, parameter.dtype)


def linear_weights_label(model: torch.nn.Module, with_reason: bool = False) -> str:
    """How the engine runs this model's linear layers, for captions next to its timings.

    Args:
        model: the loaded model.
        with_reason: add why the weights are not packed, when they are not (the sidebar's card).
    """
    packed, why = packing_status(model)
    if packed:
        dtype = next(model.parameters()).dtype
        if not with_reason:
            return "linear weights pre-packed for oneDNN"
        runs, why_onednn = onednn_runs(dtype)
        return f"linear weights pre-packed for oneDNN ({why_onednn if runs else f'torch mkldnn linear: {why_onednn}'})"
    return f"stock linear layers ({why})" if with_reason and why else "stock linear layers"


def pack_weight(weight: torch.Tensor, implementation: str | None = None, gated: bool = False):
    """A (out, in) weight packed once for one of the engine's packed linears.

    Args:
        implementation: ``"oneDNN matmul"`` (``prefillviz/backends/ops/onednn_linear.py``'s ``Linear``: oneDNN's
            matmul primitive, kept per row count, as vLLM's CPU backend runs it),
            ``"brgemm linear"`` (``brgemm_linear.BrgemmLinear``: the engine's C++ linear on oneDNN's brgemm
            micro-kernel), ``"slab linear"`` (the same, fp32, on the engine's own micro-kernel) or
            ``"torch packed"`` (an opaque tensor for ``torch.ops.mkldnn._linear_pointwise``);
            None: oneDNN's matmul where it runs here, else torch's packed linear (what the peaks and
            the dtype speed time).
            The engine runs whichever the measured dispatch chose (``dispatch.py``).
        gated: ``weight`` is a gated MLP's [gate; up], and the pack returns silu(x G^T) * (x U^T)
            (the brgemm and slab linears only: ``gated_packs``).
    """
    if implementation in (BRGEMM_LINEAR, SLAB_LINEAR):
        return BrgemmLinear(weight.detach(), gated, own=implementation == SLAB_LINEAR)
    if gated:
        raise ValueError(f"{implementation} has no gated pack")
    onednn = onednn_linear(weight.dtype) if implementation in (None, "oneDNN matmul") else None
    if implementation == "oneDNN matmul" and onednn is None:
        raise RuntimeError(f"oneDNN's matmul does not run {dtype_name(weight.dtype)} here: "
                           f"{onednn_runs(weight.dtype)[1]}")
    with torch.no_grad():
        if onednn is not None:
            return onednn.Linear(weight.detach())
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 1)


def packed_linear(x: torch.Tensor, packed, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` with the weight from ``pack_weight``."""
    if isinstance(packed, torch.Tensor):
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    if torch._C._autograd._profiler_enabled():  # a profile pass: the call is no torch op, so name it for the op table
        with torch.profiler.record_function(getattr(packed, "scope", ONEDNN_SCOPE)):
            out = packed(x)
    else:
        out = packed(x)
    return out if bias is None else out.add_(bias)


def _weight_key(weight: torch.Tensor) -> tuple[int, int]:
    """Changes when the weight does: new storage (a new dtype or device) or an in-place write.

    The storage a pack was made from is kept alive with it (``_model_packs``), so no later tensor
    can reuse its address. Not seen: a write through ``.data``, which torch does not count.
    """
    return weight.data_ptr(), weight._version


def _model_packs(model: torch.nn.Module, implementation: str | None) -> dict:
    """{Linear: packed weight} for the model, (re)packing the weights that changed (~0.2 ms when none did)."""
    with _lock:  # sessions share the model: pack once
        by_implementation = _models.setdefault(model, {})
        entries, packs = by_implementation.get(implementation, (None, None))
        if entries is None:
            entries = dict.fromkeys(m for m in model.modules()
                                    if type(m) is torch.nn.Linear and m.weight.dtype in PACKABLE_DTYPES)
        changed = packs is None
        for module, entry in entries.items():
            key = _weight_key(module.weight)
            if entry is None or entry[0] != key:
                entries[module] = (key, module.weight.untyped_storage(), pack_weight(module.weight, implementation))
                changed = True
        if changed:
            packs = {module: entry[2] for module, entry in entries.items()}
            by_implementation[implementation] = (entries, packs)
        return packs


def _linear_forward(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    packs = getattr(_active, "packs", None)
    packed = packs.get(module) if packs else None
    if packed is None or x.dtype != module.weight.dtype:
        return F.linear(x, module.weight, module.bias)
    return packed_linear(x, packed, module.bias)


def _is_routed(forward: object) -> bool:
    return isinstance(forward, functools.partial) and forward.func is _linear_forward


def _route(linears: list[torch.nn.Linear]) -> Callable[[], None]:
    """Route each module's forward through ``_linear_forward`` (threads outside a block get F.linear); returns the undo.

    A ``partial`` over the module, so a deep copy made meanwhile computes with its own weights
    (and loses the copied route the first time it is packed and released). A forward someone
    else put on the module is left alone.
    """
    routed = [m for m in linears if "forward" not in m.__dict__ or _is_routed(m.__dict__["forward"])]
    for module in routed:
        module.__dict__["forward"] = functools.partial(_linear_forward, module)

    def undo() -> None:
        for module in routed:
            module.__dict__.pop("forward", None)

    return undo


@contextmanager
def packed_linears(model: torch.nn.Module, enabled: bool = True, implementation: str | None = None) -> Iterator[bool]:
    """Run the model's ``nn.Linear`` layers with packed weights in this thread, inside the block.

    Args:
        model: the loaded model (its linears are packed on first use and kept for later calls).
        enabled: False makes this a no-op (the engine's ``pack_linear_weights`` setting).
        implementation: which pack (``pack_weight``); ``"stock"`` is a no-op too.

    Yields:
        Whether the linears are packed in this block (False off a CPU, for other dtypes, or
        when disabled).
    """
    if not enabled or implementation == "stock" or not packing_status(model)[0]:
        yield False
        return
    packs = _model_packs(model, implementation)
    with shared_setting(model, "linears", lambda: _route(list(packs))):
        previous = getattr(_active, "packs", None)
        _active.packs = packs
        try:
            yield True
        finally:
            _active.packs = previous
