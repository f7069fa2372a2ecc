"""Linear layers on oneDNN's matmul primitive, as vLLM's CPU backend runs them (``csrc/onednn_linear.cpp``).

torch's packed linear (``torch.ops.mkldnn._linear_pointwise``) describes, looks up and runs a
oneDNN primitive at every call; ``Linear`` here packs the weight once into the layout oneDNN's
matmul picks and keeps the primitive made for each row count (the last 8 used: a primitive holds
its own JIT code, ~0.2-0.4 MB, and takes ~0.8 ms to make), so a call is one execute. On two
AVX-512 cores that makes an fp32 matmul of 32 rows of the bundled model 1.2-1.5x faster, one row
2-4x (``python -m prefillviz.backends.ops.onednn_linear`` times them), which is how vLLM's CPU backend prefills a
prefix-cache hit and decodes faster than torch's linears can.

It links Debian's oneDNN (``apt-get install libdnnl-dev``; ``make`` installs it where it runs as
root on Debian or Ubuntu). torch ships newer oneDNN headers of its own, so the build copies the
system's headers into ``build/`` and compiles against those. Where anything is missing or wrong
(no library, a dtype this CPU's oneDNN can't run, a result that differs from ``F.linear``) the
engine packs with torch's op instead, and ``onednn_status``/``onednn_runs`` say why.

    python -m prefillviz.backends.ops.onednn_linear --build   # what `make` runs (~20 s)
    python -m prefillviz.backends.ops.onednn_linear           # whether it loads here, and its timings against torch's

``PREFILLVIZ_NO_ONEDNN=1`` turns it off (the engine then packs with torch's op, as before).
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from prefillviz.backends.ops import cpp_build

SOURCES = [Path(__file__).resolve().parent / "csrc" / "onednn_linear.cpp"]
FOLDER = "onednn_linear"  # under build/
DISABLE_ENV = "PREFILLVIZ_NO_ONEDNN"
# where Debian (or a source install) puts oneDNN's headers
INCLUDE_ROOTS = (Path("/usr/include"), Path("/usr/local/include"))
# the kernels ``Linear`` runs on: brgemm (AVX-512, AMX) and, where oneDNN 2.6 has none (AVX2), its
# JIT gemm, a weight wider than 1,024 in blocks of 768 columns (csrc/onednn_linear.cpp says why).
# On AVX2 code (this Zen 4 under DNNL_MAX_CPU_ISA=AVX2) that made whole engine steps 1.04x
# (512-token prefill), 1.16-1.29x (41-256 tokens) and 1.29x (decode) faster than torch's packed
# linear, A/B in one process.
JIT_KERNELS = ("brg", "gemm:jit")


def system_headers() -> Path | None:
    """The folder holding the system's ``oneapi/dnnl/dnnl.hpp``, or None."""
    return next((root for root in INCLUDE_ROOTS if (root / "oneapi" / "dnnl" / "dnnl.hpp").exists()), None)


def _version_of(headers: Path) -> str:
    text = (headers / "oneapi" / "dnnl" / "dnnl_version.h").read_text()
    fields = {line.split()[1]: line.split()[2] for line in text.splitlines()
              if line.startswith("#define DNNL_VERSION_") and len(line.split()) > 2}
    return ".".join(fields.get(f"DNNL_VERSION_{part}", "?") for part in ("MAJOR", "MINOR", "PATCH"))


def build_name(cap: str | None = None) -> str:
    headers = system_headers()
    return cpp_build.build_name("prefillviz_onednn_linear", SOURCES, cap, extra=_version_of(headers) if headers else "")


def build(cap: str | None = None, verbose: bool = False) -> Path:
    """Compile against a copy of the system's oneDNN headers (ahead of torch's newer ones) and link its library."""
    headers = system_headers()
    if headers is None:
        raise FileNotFoundError("oneDNN's headers are not installed (Debian: apt-get install libdnnl-dev)")
    cap = cap or cpp_build.capability()
    name = build_name(cap)
    copied = cpp_build.BUILD_ROOT / FOLDER / "include"
    shutil.rmtree(copied, ignore_errors=True)
    shutil.copytree(headers / "oneapi", copied / "oneapi")
    return cpp_build.build(name, FOLDER, SOURCES, cap, include_paths=[str(copied)], ldflags=["-ldnnl"], verbose=verbose)


@functools.cache
def onednn_status() -> tuple[object | None, str]:
    """(the loaded module, or None; why not). Loaded once per process."""
    if os.environ.get(DISABLE_ENV, "").strip() not in ("", "0"):
        return None, f"{DISABLE_ENV} is set: torch's packed linear runs instead of oneDNN's matmul primitives"
    try:
        module = cpp_build.load(build_name(), FOLDER)
    except Exception as error:  # noqa: BLE001 -- any failure means "not here", with its reason
        return None, (f"oneDNN's matmul failed to load ({cpp_build.first_line(error)}); "
                      "torch's packed linear runs instead")
    if module is None:
        missing = "" if system_headers() else " (oneDNN is not installed: apt-get install libdnnl-dev)"
        return None, f"oneDNN's matmul is not built here{missing}; torch's packed linear runs instead"
    return module, f"oneDNN {module.version()} matmul primitives, one per row count"


@functools.cache
def onednn_runs(dtype: torch.dtype) -> tuple[bool, str]:
    """Whether ``Linear`` runs in ``dtype`` on this CPU and matches ``F.linear``: tried once per dtype."""
    module, why = onednn_status()
    if module is None:
        return False, why
    generator = torch.Generator().manual_seed(0)
    # each side rounds its outputs once (a step of dtype each) + two fp32 sums of 40 unit-normal products
    # (sqrt(40) eps_fp32 x sum |x w| ~ 40)
    tolerance = 2 * torch.finfo(dtype).eps + 2 * 40**1.5 * torch.finfo(torch.float32).eps
    try:
        weight = torch.randn(48, 40, generator=generator).to(dtype)
        bias = torch.randn(48, generator=generator).to(dtype)
        linear = module.Linear(weight)
        for rows in (1, 7, 33):
            x = torch.randn(rows, 40, generator=generator).to(dtype)
            got, want = linear(x), F.linear(x, weight)
            if got.shape != want.shape or not torch.allclose(got.float(), want.float(), rtol=tolerance, atol=tolerance):
                return False, (f"oneDNN's {dtype} matmul gave a wrong result on this CPU; "
                               "torch's packed linear runs instead")
        x = torch.randn(2, 3, 40, generator=generator).to(dtype)
        if not torch.allclose(module.Linear(weight, bias)(x).float(), F.linear(x, weight, bias).float(),
                              rtol=tolerance, atol=tolerance):
            return False, (f"oneDNN's {dtype} matmul with a bias gave a wrong result on this CPU; "
                           "torch's packed linear runs instead")
        implementation = linear.implementation(32)
    except RuntimeError as error:
        return False, (f"this CPU's oneDNN can't run a {dtype} matmul ({cpp_build.first_line(error)}); "
                       "torch's packed linear runs instead")
    if not implementation.startswith(JIT_KERNELS):
        # a reference kernel (plain C++ loops) is far slower than torch's op
        return False, (f"this CPU's oneDNN {module.version()} has no JIT matmul for {dtype} "
                       f"(it would run {implementation}); torch's packed linear runs instead")
    return True, f"{why} ({implementation})"


def onednn_linear(dtype: torch.dtype):
    """The module where ``Linear`` runs in ``dtype`` here, else None."""
    return onednn_status()[0] if onednn_runs(dtype)[0] else None


def compare(shapes=((3072, 576), (576, 1536), (960, 576)), rows=(1, 32, 512),
            dtype: torch.dtype = torch.float32) -> list[dict]:
    """Each (N, K) and row count: GFLOP/s of torch's packed linear and of ``Linear`` (medians of 7 runs, same
    process)."""
    from prefillviz.machine.timers import time_call

    def median_seconds(call) -> float:
        return time_call(call, torch.device("cpu"), runs=7, warmup=5).median_s

    module = onednn_linear(dtype)
    results = []
    for n, k in shapes:
        weight = torch.randn(n, k).to(dtype)
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, 1)
        ours = module.Linear(weight) if module else None
        for m in rows:
            x = torch.randn(m, k).to(dtype)
            flops = 2 * m * n * k
            torch_s = median_seconds(lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""))
            onednn_s = median_seconds(lambda: ours(x)) if ours else None
            results.append({"N": n, "K": k, "M": m, "torch_gflops": flops / torch_s / 1e9,
                            "onednn_gflops": flops / onednn_s / 1e9 if onednn_s else None})
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m prefillviz.backends.ops.onednn_linear",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--build", action="store_true",
                        help="compile it against the system's oneDNN (what `make install` runs)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                        help="the dtype to time (without --build)")
    args = parser.parse_args(argv)
    if args.build:
        started = time.perf_counter()
        try:
            path = build()
        except Exception as error:  # noqa: BLE001 -- the engine runs torch's packed linear without it; say so and go on
            errors = [line for line in str(error).splitlines() if "error:" in line][:3]
            print(f"oneDNN's matmul did not build ({cpp_build.first_line(error, 300)}); "
                  "the engine will pack with torch's op", *errors, sep="\n", file=sys.stderr)
            return 1
        print(f"built {path} in {time.perf_counter() - started:.0f} s")
    for dtype in (torch.float32, torch.bfloat16):
        print(f"{dtype}: {'yes' if onednn_runs(dtype)[0] else 'no'}: {onednn_runs(dtype)[1]}")
    if not args.build and onednn_linear(getattr(torch, args.dtype)):
        for row in compare(dtype=getattr(torch, args.dtype)):
            print(f"N={row['N']:5d} K={row['K']:5d} M={row['M']:4d}: torch's packed linear "
                  f"{row['torch_gflops']:6.1f} GFLOP/s, oneDNN matmul {row['onednn_gflops']:6.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
