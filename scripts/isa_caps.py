"""The kernel, numerics and engine tests as other CPUs run them, on this CPU, under each lower cap it allows.

Our machines' CPUs differ (AVX2 only; AVX-512 with AVX512-BF16; Xeons with AMX), and each runs
other code: oneDNN's JIT kernels, torch's vectorized kernels, the engine's C++ ops (built per
capability), the measured dispatch's candidates. A cap lowers what this CPU runs to a smaller
CPU's code:

    DNNL_MAX_CPU_ISA        oneDNN's ISA, read by torch's bundled oneDNN and by Debian's (the
                            engine's matmuls) alike: SSE41, AVX, AVX2, ... AVX512_CORE_AMX
    ATEN_CPU_CAPABILITY     torch's vectorized kernels, and which build of the engine's C++ ops
                            and oneDNN wrapper loads: default, avx2, avx512. A level below
                            AVX-512 stands for a CPU without it, so oneDNN is capped to match
                            (``ONEDNN_FOR_ATEN``): uncapped on a Xeon with AMX, torch's own bf16
                            flash attention packs for the AMX tiles oneDNN reports, with AVX-512
                            code the capped kernels lack ("pack_vnni2 is only supported when
                            avx512 is supported"), which no real CPU of that level runs
    both at AVX2            an AVX2-only CPU, as near as one run gets
    PREFILLVIZ_*            the project's switches (no C++ ops, no bf16 dot products, no oneDNN,
                            stock linears, the stock forward) and each forced candidate of the
                            measured dispatch (PREFILLVIZ_ATTENTION, PREFILLVIZ_LINEARS)

Nothing is assumed from the CPU's flags. A cap above the CPU is ignored (oneDNN) or refused
(torch), so each cap is probed first in a subprocess (``--probe``: torch's capability, oneDNN's
verbose ISA line and the kernels it ran for a small fp32 and bf16 linear, the engine's ops); a
cap that changes nothing here, or runs the same oneDNN kernels as a lower cap already run, says
so and is not run. The builds a lower ``ATEN_CPU_CAPABILITY`` loads are made first (in build/,
reused), so the run checks what that CPU runs, not the plain torch fallback.

Each run is pytest in a subprocess with the cap set, with a timeout, and its own
``PREFILLVIZ_CACHE`` (``isa-caps/<run>/`` under the cache, the bundled model's copy shared), so a
capped run's dispatch table never replaces this machine's. One line per run, its log in
``out/isa_caps/``, a summary, and exit status 1 when a reachable run fails (pytest's "no tests
collected" included).

    .venv/bin/python scripts/isa_caps.py          # every run (make test-isa)
    .venv/bin/python scripts/isa_caps.py --ci     # CI's subset (make test): an AVX2-only CPU's, a Zen 4's
    .venv/bin/python scripts/isa_caps.py --list   # what is reachable here; no builds, no tests
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOGS = ROOT / "out" / "isa_caps"
PROBE_MARK = "isa-caps-probe: "  # the probe's JSON line, among oneDNN's verbose lines

# oneDNN's caps, lowest first (dnnl_cpu_isa_t); oneDNN 2.6 knows those up to AVX512_CORE_AMX
ONEDNN_CAPS = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI",
               "AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX512_CORE_AMX", "AVX512_CORE_AMX_FP16")
ATEN_CAPS = ("default", "avx2", "avx512")  # torch's x86 capabilities, lowest first
# the most oneDNN a CPU of that level has (no AVX2; no AVX-512) that both oneDNNs know (2.6 ignores AVX2_VNNI_2)
ONEDNN_FOR_ATEN = {"default": "AVX", "avx2": "AVX2_VNNI"}
# prefillviz/backends/ops/cpp_build.py's names for a lower cap's build
BUILT_PER_CAPABILITY = {"default": "DEFAULT", "avx2": "AVX2"}
CAP_ENVS = ("DNNL_MAX_CPU_ISA", "ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY")
SWITCHES = {  # a switch: what must be on here for it to change anything, and what the engine runs instead
    "PREFILLVIZ_NO_ENGINE_OPS": ("engine_ops", "plain torch ops instead of the engine's C++ ops"),
    "PREFILLVIZ_NO_BF16_DOT": ("bf16_dots", "bf16 attention in fp32 tiles and ATen's bf16 rounding instead of "
                                            "AVX512-BF16's dot products and rounding"),
    "PREFILLVIZ_NO_ONEDNN": ("onednn", "torch's packed linear instead of oneDNN's matmul primitive"),
    "PREFILLVIZ_STOCK_LINEARS": ("packing", "stock linears instead of packed ones"),
    "PREFILLVIZ_STOCK_FORWARD": ("", "the stock transformers forward instead of the engine's own"),
}
# prefillviz/backends/dispatch.py's FORCE_ENV
FORCE_ENVS = {"attention": "PREFILLVIZ_ATTENTION", "linears": "PREFILLVIZ_LINEARS"}
# no run inherits these
CLEARED_ENVS = (*CAP_ENVS, *SWITCHES, *FORCE_ENVS.values(), "ONEDNN_VERBOSE", "DNNL_VERBOSE")

KERNELS = ("tests/model/test_paged_kernels.py", "tests/model/test_onednn_linear.py",
           "tests/model/test_brgemm_linear.py", "tests/model/test_sparse_backend.py")
NUMERICS = ("tests/model/test_llama_forward.py", "tests/model/test_packed_weights.py",
            "tests/model/test_cpu_portability.py")
ENGINE = ("tests/model/test_engine_oracle.py", "tests/model/test_capture.py", "tests/model/test_dispatch.py")
EVERY_FILE = KERNELS + NUMERICS + ENGINE
ENGINE_PATHS = NUMERICS + ENGINE  # what a switch changes: not the kernels, which the kernel tests call directly
# a forced candidate: the engine against HF (not test_dispatch, whose injected timings pick each candidate:
# a forced one wins by design)
FORCED_FILES = ("tests/model/test_llama_forward.py", "tests/model/test_engine_oracle.py")
# what fits CI's time, with the builds
CI_FILES = KERNELS + ("tests/model/test_llama_forward.py", "tests/model/test_packed_weights.py")


# --------------------------------------------------------------------------- the runs
@dataclass(frozen=True)
class Run:
    """One pytest run under ``env``: ``kind`` says how its reachability is decided."""

    env: dict
    kind: str  # "cpu" (an AVX2-only CPU), "onednn", "aten", "switch", "force"
    files: tuple[str, ...]
    ci_files: tuple[str, ...] = ()  # empty: CI does not run it
    what: str = ""  # the machine it stands for, or the candidate it forces

    @property
    def label(self) -> str:
        return " ".join(f"{name}={shlex.quote(value)}" for name, value in self.env.items())

    @property
    def title(self) -> str:
        return f"{self.label} ({self.what})" if self.what else self.label

    @property
    def slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9]+", "-", self.label).strip("-").lower()


def isa_runs() -> list[Run]:
    """The cap runs, each needing a probe under its env: an AVX2-only CPU first, then oneDNN's caps and torch's,
    lowest first."""
    runs = [Run({"ATEN_CPU_CAPABILITY": "avx2", "DNNL_MAX_CPU_ISA": "AVX2"}, "cpu", EVERY_FILE, CI_FILES,
                "an AVX2-only CPU")]
    for cap in ONEDNN_CAPS:
        zen4 = cap == "AVX512_CORE_BF16"  # a Xeon with AMX runs a Zen 4's oneDNN code under it
        runs.append(Run({"DNNL_MAX_CPU_ISA": cap}, "onednn", EVERY_FILE, CI_FILES if zen4 else (),
                        "a Zen 4: AVX512-BF16, no AMX" if zen4 else ""))
    runs += [Run({"ATEN_CPU_CAPABILITY": cap,
                  **({"DNNL_MAX_CPU_ISA": ONEDNN_FOR_ATEN[cap]} if cap in ONEDNN_FOR_ATEN else {})}, "aten", EVERY_FILE)
             for cap in ATEN_CAPS]
    return runs


def switch_runs(plain: dict) -> list[Run]:
    """The project's switches, and each candidate of the measured dispatch forced (the candidates as the plain probe
    found them)."""
    runs = [Run({name: "1"}, "switch", ENGINE_PATHS) for name in SWITCHES]
    for family, candidates in plain.get("candidates", {}).items():
        firsts = [candidate.split(",")[0].split(" ")[0] for candidate in candidates]
        for candidate, first in zip(candidates, firsts, strict=True):
            # v7, v6, ...: what dispatch accepts, where no other candidate starts so (v7 compiled and v7 tiles go by
            # their names)
            short = first if family == "attention" and firsts.count(first) == 1 else candidate
            runs.append(Run({FORCE_ENVS[family]: short}, "force", FORCED_FILES, what=candidate))
    return runs


# --------------------------------------------------------------------------- the probe (runs under the cap)
def probe() -> dict:
    """What runs here under the environment's caps (printed as one JSON line; oneDNN's verbose lines go to stdout
    too)."""
    sys.path.insert(0, str(ROOT))
    import torch

    from prefillviz.backends.ops import cpp_build, engine_ops, onednn_linear

    def built(folder: str, name: str) -> bool:  # where cpp_build.load looks
        return (cpp_build.BUILD_ROOT / folder / name / f"{name}.so").exists()

    found: dict = {"torch_capability": torch.backends.cpu.get_cpu_capability(), "errors": {}}
    for dtype in (torch.float32, torch.bfloat16):  # torch's packed linear: a oneDNN inner product
        name = str(dtype).removeprefix("torch.")
        try:
            weight = torch.randn(64, 64).to(dtype)
            packed = torch.ops.mkldnn._reorder_linear_weight(weight, 1)
            torch.ops.mkldnn._linear_pointwise(torch.randn(8, 64).to(dtype), packed, None, "none", [], "")
        except Exception as error:  # noqa: BLE001 -- what can't run under the cap is part of the answer
            found["errors"][f"torch packed {name}"] = cpp_build.first_line(error)
    cap = cpp_build.capability()
    ops, why = engine_ops.engine_ops_status()
    found["engine_ops"] = {"capability": cap, "loaded": ops is not None, "why": why,
                           "bf16_dots": bool(ops and ops.bf16_dot_products()),
                           "built": built(engine_ops.FOLDER, engine_ops.build_name(cap))}
    module, why = onednn_linear.onednn_status()
    runs = {str(d).removeprefix("torch."): onednn_linear.onednn_runs(d) for d in (torch.float32, torch.bfloat16)}
    buildable = onednn_linear.system_headers() is not None
    found["onednn_linear"] = {"loaded": module is not None, "why": why, "runs": runs, "buildable": buildable,
                              "built": buildable and built(onednn_linear.FOLDER, onednn_linear.build_name(cap))}
    if "--statuses" in sys.argv:  # the forced candidates: which can run here, per dtype (a tiny Llama: nothing loads)
        from prefillviz.backends import dispatch, dispatch_tuning
        from tests.tiny_models import make_tiny_llama

        model = make_tiny_llama()
        found["candidates"] = {family: list(names) for family, names in dispatch.CANDIDATES.items()}
        found["statuses"] = {str(d).removeprefix("torch."): dispatch_tuning.candidate_statuses(model.to(d))
                             for d in (torch.float32, torch.bfloat16)}
    return found


def clean_env(extra: dict) -> dict:
    env = {name: value for name, value in os.environ.items() if name not in CLEARED_ENVS}
    return {**env, **extra}


def probe_under(env: dict, statuses: bool = False, timeout_s: float = 180) -> dict:
    """Run ``--probe`` in a subprocess under ``env`` with oneDNN's verbose output on; its answer, parsed."""
    command = [sys.executable, str(Path(__file__).resolve()), "--probe", *(["--statuses"] if statuses else [])]
    try:
        done = subprocess.run(command, cwd=ROOT, env=clean_env({**env, "ONEDNN_VERBOSE": "1"}), capture_output=True,
                              text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"the probe took over {timeout_s:.0f} s"}
    found = read_probe(done.stdout)
    if done.returncode != 0 or "torch_capability" not in found:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1][:200]
        return {**found, "ok": False, "error": f"the probe exited with status {done.returncode}: {tail}"}
    return found


def read_probe(stdout: str) -> dict:
    """The probe's JSON line, with ``onednn``: what oneDNN's verbose lines say (``onednn_verbose``)."""
    found = {}
    for line in stdout.splitlines():
        if line.startswith(PROBE_MARK):
            found = json.loads(line[len(PROBE_MARK):])
    return {**found, "ok": True, "onednn": onednn_verbose(stdout)}


def onednn_verbose(text: str) -> dict[str, dict]:
    """{oneDNN version: {"isa": its ISA line, "kernels": [primitive kernel, ...]}} from ``ONEDNN_VERBOSE=1`` output.

    torch's bundled oneDNN (3.x) writes ``onednn_verbose,v1,info,...``, Debian's 2.6 ``onednn_verbose,info,...``;
    the field after the prefix tells the two apart when both print in one process.
    """
    libraries: dict[str, dict] = {}
    version_of: dict[str, str] = {}  # the line format ("v1", or "" for 2.x) -> the version it printed
    for line in text.splitlines():
        if not line.startswith(("onednn_verbose,", "dnnl_verbose,")):
            continue
        fields = line.split(",")
        form = fields[1] if re.fullmatch(r"v\d+", fields[1]) else ""
        started = re.search(r"info,oneDNN v(\d[\w.]*)", line)
        if started:
            version_of[form] = started.group(1)
            libraries.setdefault(started.group(1), {"isa": "", "kernels": []})
            continue
        library = libraries.get(version_of.get(form, ""))
        if library is None:
            continue
        if ",cpu,isa:" in line:
            library["isa"] = line.split(",cpu,isa:", 1)[1].strip()
        elif "exec" in fields and fields.index("exec") + 3 < len(fields) and fields[fields.index("exec") + 1] == "cpu":
            at = fields.index("exec")
            kernel = f"{fields[at + 2]} {fields[at + 3]}"  # e.g. "inner_product brg_matmul:avx2", "matmul gemm:jit"
            if kernel not in library["kernels"]:
                library["kernels"].append(kernel)
    return libraries


# --------------------------------------------------------------------------- reachability
@dataclass
class Verdict:
    """Whether a run is made here: status "run", "own" (this CPU's level: the plain suite runs it), "above" (not
    reachable), "same" (the same code as another run), "off" (a switch that changes nothing here) or "broken" (the
    probe failed: a failure)."""

    status: str
    why: str

    @property
    def runs(self) -> bool:
        return self.status == "run"


def isas(found: dict, versions=None) -> str:
    """'oneDNN 2.6.3 and 3.12.0: Intel AVX2' (or each library's ISA line when they differ)."""
    lines = {v: library["isa"] for v, library in sorted(found.get("onednn", {}).items())
             if library["isa"] and (versions is None or v in versions)}
    if len(set(lines.values())) == 1:
        return f"oneDNN {' and '.join(lines)}: {next(iter(lines.values()))}"
    return "; ".join(f"oneDNN {version}: {isa}" for version, isa in lines.items())


def ignored_by(found: dict, plain: dict) -> list[str]:
    """The oneDNN versions that ran their own ISA under a cap another version followed (a cap name it doesn't know)."""
    mine, theirs = found.get("onednn", {}), plain.get("onednn", {})
    same = [v for v in mine if v in theirs and mine[v]["isa"] == theirs[v]["isa"]]
    return same if len(same) < len(mine) else []


def matmul_kernels(found: dict) -> str:
    """'oneDNN 3.12.0 ran brg_matmul:avx2; oneDNN 2.6.3 ran gemm:jit': the matmul kernels of each library."""
    parts = []
    for version, library in sorted(found.get("onednn", {}).items()):
        names = [k.split(" ", 1)[1] for k in library["kernels"] if k.split(" ", 1)[0] in ("matmul", "inner_product")]
        if names:
            parts.append(f"oneDNN {version} ran {', '.join(names)}")
    return "; ".join(parts) or "no oneDNN matmul ran"


def code_of(found: dict, ignored=()) -> tuple:
    """What oneDNN ran for the probe's linears, and what could not run: two caps with the same code are one run
    (``ignored``: versions left out, as ``ignored_by`` names them)."""
    kernels = tuple(sorted(f"{v} {k}" for v, library in found.get("onednn", {}).items() if v not in ignored
                           for k in library["kernels"]))
    return kernels, tuple(sorted(found.get("errors", {}))), found.get("torch_capability")


def classify(runs: list[Run], probes: dict[str, dict], plain: dict) -> dict[str, Verdict]:
    """{run label: Verdict} for the cap runs, in ``isa_runs``'s order (lowest cap first: a higher cap with the same
    code is the copy)."""
    own = [r.label for r in runs
           if r.kind == "onednn" and probes.get(r.label, {}).get("ok") and isas(probes[r.label]) == isas(plain)]
    # the lowest cap under which oneDNN runs what it runs without one: this CPU's own ISA
    own_cap = own[0] if own else None
    verdicts: dict[str, Verdict] = {}
    ran = [("the plain suite", plain)]
    for run in runs:
        if run.label in probes:
            verdicts[run.label] = cap_verdict(run, probes[run.label], plain, own_cap, ran)
            if verdicts[run.label].runs and run.kind != "aten":
                ran.append((run.label, probes[run.label]))
    return verdicts


def cap_verdict(run: Run, found: dict, plain: dict, own_cap: str | None, ran: list[tuple[str, dict]]) -> Verdict:
    """One cap run's verdict from its probe; ``ran``: the runs made so far, with their probes (a run with the same
    code is not made twice)."""
    if not found.get("ok"):
        return Verdict("broken", found.get("error", "the probe failed"))
    torch_says = found.get("torch_capability", "?")
    if run.kind in ("aten", "cpu"):
        if torch_says != run.env["ATEN_CPU_CAPABILITY"].upper():
            return Verdict("above", f"not reachable on this CPU (torch says {torch_says})")
        own_level = str(plain.get("torch_capability", "")).lower()
        if own_level in ATEN_CAPS and ATEN_CAPS.index(run.env["ATEN_CPU_CAPABILITY"]) > ATEN_CAPS.index(own_level):
            # torch takes a forced level above the CPU's at its word (an AVX2-only Zen 3 then dies of SIGILL in
            # AVX-512 code)
            return Verdict("above", f"above this CPU's own level (torch runs {own_level.upper()} kernels unforced)")
        if torch_says == plain.get("torch_capability") and (run.kind == "aten" or isas(found) == isas(plain)):
            return Verdict("own", f"this CPU's own level (torch says {torch_says}"
                           + (f"; {isas(found)}" if run.kind == "cpu" else "") + "): the plain suite runs it")
        if run.kind == "aten":
            return Verdict("run", reach_sentence(run, found))
    if not isas(found):
        return Verdict("above", "not reachable: oneDNN printed no ISA line under it "
                                "(is this torch built without oneDNN?)")
    if run.kind == "onednn" and isas(found) == isas(plain):
        if run.label == own_cap:
            return Verdict("own", f"this CPU's own ISA ({isas(found)}): the plain suite runs it")
        return Verdict("above", f"not reachable on this CPU ({isas(found)}, as without a cap)")
    ignored = ignored_by(found, plain)
    note = f"; {' and '.join(f'oneDNN {v}' for v in ignored)} ignores this cap" if ignored else ""
    earlier = next((label for label, other in ran if code_of(other, ignored) == code_of(found, ignored)), None)
    if run.kind == "onednn" and earlier:
        followed = [v for v in found.get("onednn", {}) if v not in ignored]
        return Verdict("same", f"{isas(found, followed)}{note}: the same kernels as {earlier}, not run again")
    return Verdict("run", reach_sentence(run, found) + note)


def reach_sentence(run: Run, found: dict) -> str:
    parts = []
    if "ATEN_CPU_CAPABILITY" in run.env:
        ops = found.get("engine_ops", {})
        parts.append(f"torch runs {found.get('torch_capability')} kernels; the engine's C++ ops: "
                     + (f"the {ops.get('capability')} build" if ops.get("loaded") else f"off ({ops.get('why', '?')})"))
    if "DNNL_MAX_CPU_ISA" in run.env:
        parts.append(matmul_kernels(found))
    return "reachable (" + "; ".join(parts) + ")"


def classify_switches(runs: list[Run], plain: dict) -> dict[str, Verdict]:
    """Switches and forced candidates: decided from the plain probe (nothing under them needs probing)."""
    ops, onednn = plain.get("engine_ops", {}), plain.get("onednn_linear", {})
    statuses = plain.get("statuses", {})
    packing = any(not why for s in statuses.values() for name, why in s.get("linears", {}).items() if name != "stock")
    present = {
        "engine_ops": ("" if ops.get("loaded") else ops.get("why", "the engine's C++ ops are not loaded")),
        "bf16_dots": ("" if ops.get("bf16_dots") else "bf16 runs without AVX512-BF16 here already"),
        "onednn": ("" if onednn.get("loaded") else onednn.get("why", "oneDNN's matmul is not loaded")),
        "packing": ("" if packing else "no linear is packed here already"),
        "": "",
    }
    verdicts = {}
    for run in runs:
        if run.kind == "switch":
            needs, instead = SWITCHES[next(iter(run.env))]
            why_not = present[needs]
            verdicts[run.label] = (Verdict("off", f"the same code as the plain suite here: {why_not}") if why_not
                                   else Verdict("run", f"reachable ({instead})"))
        elif run.kind == "force":
            family = next(f for f, name in FORCE_ENVS.items() if name in run.env)
            refused = "; ".join(f"{dtype}: {s[family][run.what]}" for dtype, s in statuses.items()
                                if s.get(family, {}).get(run.what))
            verdicts[run.label] = (Verdict("off", f"can't run here ({refused})") if refused
                                   else Verdict("run", "reachable (the engine runs it at every step)"))
    return verdicts


# --------------------------------------------------------------------------- running pytest
@dataclass
class Outcome:
    """A run's end: pytest's counts ('61 passed, 3 skipped'), its exit status, the wall time and the failed tests."""

    label: str
    verdict: Verdict
    returncode: int | None = None  # None: not run
    counts: str = ""
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)
    timed_out: bool = False
    log: str = ""
    files: tuple[str, ...] = ()  # the test files it ran

    @property
    def failed(self) -> bool:
        if self.verdict.status == "broken":
            return True
        # 5: no tests collected is a failure too
        return self.returncode is not None and (self.returncode != 0 or self.timed_out)

    def line(self) -> str:
        if self.verdict.status == "broken":
            return f"{self.label}: FAILED before its tests: {self.verdict.why}"
        if self.returncode is None:
            return f"{self.label}: {self.verdict.why}"
        if self.timed_out:
            result = f"timed out after {self.seconds:.0f} s ({self.counts or 'no counts'})"
        elif self.returncode == 5:
            result = f"no tests collected (pytest exit status 5) in {self.seconds:.0f} s"
        else:
            result = f"{self.counts or f'pytest exit status {self.returncode}'} in {self.seconds:.0f} s"
        return (f"{self.label}: {self.verdict.why}: {result}"
                + ("" if not self.failed else f"  [FAILED; log: {self.log}]"))


def pytest_counts(output: str) -> str:
    """'61 passed, 3 skipped' from pytest's last summary line ('' when there is none)."""
    for line in reversed(output.strip().splitlines()):
        match = re.search(r"((?:\d+ (?:passed|failed|skipped|deselected|xfailed|xpassed|errors?|warnings?)(?:, )?)+)"
                          r"(?: in [\d.]+s)", line)
        if match:
            return match.group(1).rstrip(", ")
    return ""


def pytest_failures(output: str, limit: int = 10) -> list[str]:
    """The FAILED/ERROR lines of pytest's short summary (-ra), each with its assertion."""
    return [line for line in output.splitlines() if line.startswith(("FAILED ", "ERROR "))][:limit]


def run_pytest(run: Run, files: tuple[str, ...], verdict: Verdict, timeout_s: float, cache_root: Path) -> Outcome:
    cache = cache_root / "isa-caps" / run.slug
    shared_models = cache_root / "models"
    shared_models.mkdir(parents=True, exist_ok=True)
    cache.mkdir(parents=True, exist_ok=True)
    if not (cache / "models").exists():
        (cache / "models").symlink_to(shared_models, target_is_directory=True)  # the bundled model's copy, made once
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *files]
    LOGS.mkdir(parents=True, exist_ok=True)
    log = LOGS / f"{run.slug}.log"
    # torch's compiled code in a folder of the run's own: inductor's cache key leaves out ATEN_CPU_CAPABILITY,
    # and torch 2.13's FlexAttention compiled under one cap and loaded under another gave wrong results
    # here (2.08 off the oracle: its probe then reports it can't run) in the later runs and the suite after
    inductor = cache / "torchinductor"
    env = clean_env({**run.env, "PREFILLVIZ_CACHE": str(cache), "TORCHINDUCTOR_CACHE_DIR": str(inductor),
                     "COLUMNS": "400"})  # wide: pytest's short summary keeps each assertion
    started = time.perf_counter()
    with open(log, "w") as out:
        out.write(f"$ {run.label} PREFILLVIZ_CACHE={cache} {' '.join(command)}\n")
        out.flush()
        # its own group: a timeout ends its children too
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        timed_out = False
        try:
            returncode = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            returncode, timed_out = process.wait(), True
    seconds = time.perf_counter() - started
    output = log.read_text(errors="replace")
    return Outcome(run.title, verdict, returncode, pytest_counts(output), seconds, pytest_failures(output), timed_out,
                   str(log.relative_to(ROOT)), files)


# --------------------------------------------------------------------------- builds
def builds_needed(found: dict) -> list[str]:
    """The modules a lower ATEN_CPU_CAPABILITY would load but finds unbuilt: python -m targets to build."""
    needed = []
    if not found.get("engine_ops", {}).get("built"):
        needed.append("prefillviz.backends.ops.engine_ops")
    if found.get("onednn_linear", {}).get("buildable") and not found.get("onednn_linear", {}).get("built"):
        needed.append("prefillviz.backends.ops.onednn_linear")
    return needed


def build_for(cap: str, modules: list[str], timeout_s: float = 900) -> list[str]:
    """Build ``modules`` for ATEN_CPU_CAPABILITY=cap, side by side (each is one compiler process); the problems, if
    any."""
    env = clean_env({"ATEN_CPU_CAPABILITY": cap})
    started = time.perf_counter()
    processes = {name: subprocess.Popen([sys.executable, "-m", name, "--build"], cwd=ROOT, env=env,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        start_new_session=True) for name in modules}
    problems = []
    for name, process in processes.items():
        try:
            output, _ = process.communicate(timeout=max(1.0, timeout_s - (time.perf_counter() - started)))
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            output, _ = process.communicate()
            problems.append(f"{name}: timed out")
            continue
        if process.returncode != 0:
            problems.append(f"{name}: {(output.strip().splitlines() or ['?'])[-1][:200]}")
    print(f"built the {BUILT_PER_CAPABILITY[cap]} variants of {', '.join(modules)} in "
          f"{time.perf_counter() - started:.0f} s"
          + (f" ({'; '.join(problems)})" if problems else ""), flush=True)
    return problems


# --------------------------------------------------------------------------- the summary
def summary(outcomes: list[Outcome], seconds: float, machine: str) -> tuple[str, int]:
    """(the last lines, the exit status): 1 when a reachable run failed. Each failed test is named once, with the runs
    it failed under, so a test that fails in every run of its file (not a cap's code) stands apart from one that fails
    under one cap."""
    ran = [o for o in outcomes if o.returncode is not None or o.verdict.status == "broken"]
    failed = [o for o in ran if o.failed]
    lines = [f"isa caps on {machine}: {len(ran) - len(failed)} of {len(ran)} runs passed in {seconds:.0f} s",
             f"  run: {', '.join(o.label for o in ran) or 'none'}",
             f"  not run: {', '.join(o.label for o in outcomes if o not in ran) or 'none'}"]
    under: dict[str, list[str]] = {}
    for outcome in failed:
        for test in failed_tests(outcome):
            under.setdefault(test, []).append(outcome.label)
    if under:
        lines.append("  failed, and under which runs:")
        for test, labels in under.items():
            with_file = [o for o in ran if test.split("::")[0] in o.files]
            lines.append(f"    {test}: "
                         f"{'every run of its file' if len(labels) == len(with_file) > 1 else ', '.join(labels)}")
    return "\n".join(lines), (1 if failed else 0)


def failed_tests(outcome: Outcome) -> list[str]:
    """The ids of a failed run's failed tests, or what failed when no test did (the probe, a timeout, no tests
    collected)."""
    tests = [line.split(" ", 1)[1].split(" - ", 1)[0] for line in outcome.failures]
    if tests:
        return tests
    if outcome.verdict.status == "broken":
        return [f"the probe ({outcome.verdict.why})"]
    if outcome.timed_out:
        return [f"the run (timed out; log: {outcome.log})"]
    return [f"the run (pytest exit status {outcome.returncode}; log: {outcome.log})"]


def machine_line(plain: dict) -> str:
    name = "this CPU"
    try:
        name = next((line.partition(":")[2].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("model name")), name)
    except OSError:
        pass
    return f"{name} (torch: {plain.get('torch_capability', '?')}; {isas(plain) or 'oneDNN: no ISA line'})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/isa_caps.py", description=__doc__.splitlines()[0])
    parser.add_argument("--ci", action="store_true", help="only CI's runs, on CI's files (make test)")
    parser.add_argument("--list", action="store_true", help="say what is reachable here; no builds, no tests")
    parser.add_argument("--only", default="", help="only the runs whose label contains this text")
    parser.add_argument("--files", nargs="+", help="these test files instead of each run's own")
    parser.add_argument("--no-build", action="store_true",
                        help="don't build a lower capability's C++ ops first (the engine then runs plain torch ops)")
    parser.add_argument("--timeout", type=float, default=None, help="seconds per pytest run (default 900; --ci 300)")
    parser.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--statuses", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.probe:
        print(PROBE_MARK + json.dumps(probe()), flush=True)
        return 0
    timeout_s = args.timeout or (300 if args.ci else 900)
    cache_root = Path(os.environ.get("PREFILLVIZ_CACHE", "~/.cache/prefillviz")).expanduser()
    started = time.perf_counter()

    plain = probe_under({}, statuses=not args.ci)
    if not plain.get("ok"):
        print(f"isa caps: the probe failed without a cap ({plain.get('error')}); nothing can be compared",
              file=sys.stderr)
        return 1
    machine = machine_line(plain)
    print(f"isa caps on {machine}", flush=True)
    caps = [r for r in isa_runs() if (r.ci_files or not args.ci) and args.only in r.label]
    probes = {run.label: probe_under(run.env) for run in caps}
    verdicts = classify(caps, probes, plain)
    others = [] if args.ci else [r for r in switch_runs(plain) if args.only in r.label]
    verdicts.update(classify_switches(others, plain))
    runs = caps + others
    if args.list:
        for run in runs:
            print(f"{run.title}: {verdicts[run.label].status}: {verdicts[run.label].why}")
        return 0

    for run in caps:  # a lower capability loads its own builds: make them, then ask again what loads
        cap = run.env.get("ATEN_CPU_CAPABILITY", "").lower()
        needed = (builds_needed(probes[run.label])
                  if verdicts[run.label].runs and cap in BUILT_PER_CAPABILITY and not args.no_build else [])
        if needed:
            build_for(cap, needed)
            for again in caps:
                if again.env.get("ATEN_CPU_CAPABILITY", "").lower() == cap and verdicts[again.label].runs:
                    found = probes[again.label] = probe_under(again.env)
                    verdicts[again.label] = (Verdict("run", reach_sentence(again, found)) if found["ok"]
                                             else Verdict("broken", found["error"]))

    outcomes = []
    for run in runs:
        verdict = verdicts[run.label]
        if not verdict.runs:
            outcome = Outcome(run.title, verdict)
        else:
            outcome = run_pytest(run, tuple(args.files or (run.ci_files if args.ci else run.files)), verdict,
                                 timeout_s, cache_root)
        outcomes.append(outcome)
        print(outcome.line(), flush=True)
        for failure in outcome.failures:
            print(f"    {failure}", flush=True)
    text, status = summary(outcomes, time.perf_counter() - started, machine)
    print(text)
    return status


if __name__ == "__main__":
    sys.exit(main())
