"""scripts/isa_caps.py's own logic on canned text: oneDNN's verbose lines, which caps are reachable on
three CPUs we have (this Zen, an AVX2-only EPYC, a Xeon with AMX), pytest's counts and the exit status."""

import importlib.util
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "isa_caps.py"
spec = importlib.util.spec_from_file_location("isa_caps", SCRIPT)
isa_caps = sys.modules["isa_caps"] = importlib.util.module_from_spec(spec)  # dataclasses look their module up there
spec.loader.exec_module(isa_caps)

AVX512_BF16 = "Intel AVX-512 with Intel DL Boost and bfloat16 support"
AMX = ("Intel AVX-512 with float16, Intel DL Boost and bfloat16 support and Intel AMX with bfloat16 and 8-bit integer "
       "support")

# one probe's stdout under DNNL_MAX_CPU_ISA=AVX2: torch's oneDNN 3.12 (v1 lines) and Debian's 2.6 interleaved
VERBOSE_AVX2 = """\
onednn_verbose,v1,info,oneDNN v3.12.0 (commit 80afa71049cd69a3df32adcccb623b12cd7baa22)
onednn_verbose,v1,info,cpu,runtime:OpenMP,nthr:2
onednn_verbose,v1,info,cpu,isa:Intel AVX2
onednn_verbose,v1,primitive,exec,cpu,reorder,jit_direct_copy:uni,undef,\
src:f32::blocked:ab::f0 dst:f32::blocked:ab::f0,,,64x64,5.9
onednn_verbose,v1,primitive,exec,cpu,inner_product,brg_matmul:avx2,forward_inference,src:f32::blocked:ab::f0,,,mb8ic64oc64,0.04
onednn_verbose,info,oneDNN v2.6.3 (commit N/A)
onednn_verbose,info,cpu,runtime:OpenMP,nthr:2
onednn_verbose,info,cpu,isa:Intel AVX2
onednn_verbose,info,prim_template:operation,engine,primitive,implementation,prop_kind,memory_descriptors,attributes,auxiliary
onednn_verbose,exec,cpu,matmul,gemm:jit,undef,src_f32::blocked:ab:f0 wei_f32::blocked:ab:f0,,,7x40:40x48,0.02
onednn_verbose,v1,primitive,exec,cpu,inner_product,brg_matmul:avx2,forward_inference,src:f32::blocked:ab::f0,,,mb8ic64oc64,0.03
isa-caps-probe: {"torch_capability": "AVX512", \
"errors": {"torch packed bfloat16": "RuntimeError: bf16 path needs the cpu support"}}
"""


def found(isa, kernels=("inner_product brg_matmul:avx512_core_bf16",), torch="AVX512", errors=(), debian_isa=None,
          debian=("matmul brg:avx512_core",)):
    """A probe's answer: torch's oneDNN 3.12 and Debian's 2.6 (with its own ISA when it differs)."""
    return {"ok": True, "torch_capability": torch, "errors": dict.fromkeys(errors, "can't"),
            "onednn": {"3.12.0": {"isa": isa, "kernels": list(kernels)},
                       "2.6.3": {"isa": debian_isa or isa, "kernels": list(debian)}}}


def cap(name):
    return next(r for r in isa_caps.isa_runs() if r.env == {"DNNL_MAX_CPU_ISA": name})


def aten(name):
    return next(r for r in isa_caps.isa_runs() if r.kind == "aten" and r.env["ATEN_CPU_CAPABILITY"] == name)


def test_a_lower_aten_level_caps_onednn_to_match():
    """A level below AVX-512 stands for a CPU without it: its oneDNN is capped too (torch's bf16 flash
    attention would pack for AMX tiles with AVX-512 code the capped kernels lack), and AVX-512's is not."""
    assert aten("default").env == {"ATEN_CPU_CAPABILITY": "default", "DNNL_MAX_CPU_ISA": "AVX"}
    assert aten("avx2").env == {"ATEN_CPU_CAPABILITY": "avx2", "DNNL_MAX_CPU_ISA": "AVX2_VNNI"}
    assert aten("avx512").env == {"ATEN_CPU_CAPABILITY": "avx512"}


AVX2_CPU = isa_caps.isa_runs()[0]


def test_the_verbose_lines_of_both_onednn_versions_are_told_apart():
    probe = isa_caps.read_probe(VERBOSE_AVX2)
    assert probe["torch_capability"] == "AVX512" and probe["errors"]
    assert probe["onednn"] == {
        "3.12.0": {"isa": "Intel AVX2", "kernels": ["reorder jit_direct_copy:uni", "inner_product brg_matmul:avx2"]},
        "2.6.3": {"isa": "Intel AVX2", "kernels": ["matmul gemm:jit"]},
    }
    assert isa_caps.isas(probe) == "oneDNN 2.6.3 and 3.12.0: Intel AVX2"
    assert isa_caps.matmul_kernels(probe) == "oneDNN 2.6.3 ran gemm:jit; oneDNN 3.12.0 ran brg_matmul:avx2"


def test_no_verbose_output_means_no_isa_and_a_cap_that_cannot_be_told():
    probe = isa_caps.read_probe('isa-caps-probe: {"torch_capability": "AVX2"}\n')
    assert probe["onednn"] == {} and isa_caps.isas(probe) == ""
    verdict = isa_caps.classify([cap("AVX2")], {cap("AVX2").label: probe}, found(AVX512_BF16))[cap("AVX2").label]
    assert verdict.status == "above" and "no ISA line" in verdict.why


def test_on_a_zen_with_avx512_bf16_lower_caps_run_once_each_and_amx_is_not_reachable():
    plain = found(AVX512_BF16)
    avx2 = found("Intel AVX2", ["inner_product brg_matmul:avx2"], errors=["torch packed bfloat16"],
                 debian=["matmul gemm:jit"])
    probes = {
        cap("AVX2").label: avx2,
        cap("AVX2_VNNI").label: {**avx2, "onednn": {v: {**lib, "isa": "Intel AVX2 with Intel DL Boost"}
                                                    for v, lib in avx2["onednn"].items()}},
        # oneDNN 2.6 doesn't know the name
        cap("AVX2_VNNI_2").label: found("Intel AVX2 with Intel DL Boost", ["inner_product brg_matmul:avx2"],
                                        errors=["torch packed bfloat16"],
                                        debian_isa=AVX512_BF16, debian=["matmul brg:avx512_core"]),
        cap("AVX512_CORE_BF16").label: plain,
        cap("AVX512_CORE_AMX").label: plain,
        aten("avx2").label: {**plain, "torch_capability": "AVX2", "engine_ops": {"loaded": True, "capability": "AVX2"}},
        aten("avx512").label: plain,
    }
    runs = [r for r in isa_caps.isa_runs() if r.label in probes]
    verdicts = {label: v for label, v in isa_caps.classify(runs, probes, plain).items()}
    assert verdicts["DNNL_MAX_CPU_ISA=AVX2"].status == "run"
    assert (verdicts["DNNL_MAX_CPU_ISA=AVX2"].why
            == "reachable (oneDNN 2.6.3 ran gemm:jit; oneDNN 3.12.0 ran brg_matmul:avx2)")
    assert (verdicts["DNNL_MAX_CPU_ISA=AVX2_VNNI"].status == "same"
            and "the same kernels as DNNL_MAX_CPU_ISA=AVX2" in verdicts["DNNL_MAX_CPU_ISA=AVX2_VNNI"].why)
    vnni_2 = verdicts["DNNL_MAX_CPU_ISA=AVX2_VNNI_2"]
    assert vnni_2.status == "same" and "oneDNN 2.6.3 ignores this cap" in vnni_2.why
    assert verdicts["DNNL_MAX_CPU_ISA=AVX512_CORE_BF16"].status == "own"
    assert verdicts["DNNL_MAX_CPU_ISA=AVX512_CORE_AMX"].status == "above"
    assert verdicts["DNNL_MAX_CPU_ISA=AVX512_CORE_AMX"].why.startswith("not reachable on this CPU")
    assert (verdicts[aten("avx2").label].status == "run"
            and "the engine's C++ ops: the AVX2 build" in verdicts[aten("avx2").label].why)
    assert verdicts[aten("avx512").label].status == "own"


def test_on_an_avx2_only_cpu_avx512_is_not_reachable_and_the_avx2_cpu_run_is_the_plain_suite():
    plain = found("Intel AVX2", ["inner_product brg_matmul:avx2"], torch="AVX2", errors=["torch packed bfloat16"])
    probes = {AVX2_CPU.label: plain, aten("avx512").label: plain, cap("AVX512_CORE").label: plain,
              cap("AVX2").label: plain}
    verdicts = isa_caps.classify(isa_caps.isa_runs(), probes, plain)
    assert verdicts[aten("avx512").label].status == "above"
    assert verdicts[aten("avx512").label].why == "not reachable on this CPU (torch says AVX2)"
    assert verdicts[AVX2_CPU.label].status == "own"
    assert verdicts[cap("AVX2").label].status == "own" and verdicts[cap("AVX512_CORE").label].status == "above"


def test_a_forced_level_above_the_cpus_own_is_not_run_even_when_torch_takes_it():
    # torch 2.13 on an AVX2-only Zen 3 reports AVX512 under ATEN_CPU_CAPABILITY=avx512, then dies of SIGILL in its
    # kernels
    plain = found("Intel AVX2", ["inner_product brg_matmul:avx2"], torch="AVX2")
    probes = {aten("avx512").label: {**plain, "torch_capability": "AVX512"},
              aten("default").label: {**plain, "torch_capability": "DEFAULT"}}
    verdicts = isa_caps.classify([aten("avx512"), aten("default")], probes, plain)
    assert verdicts[aten("avx512").label].status == "above"
    assert verdicts[aten("avx512").label].why == "above this CPU's own level (torch runs AVX2 kernels unforced)"
    assert verdicts[aten("default").label].status == "run"


def test_on_a_xeon_with_amx_the_zen4_cap_runs_and_is_in_ci():
    plain = found(AMX, ["inner_product brg_matmul:avx512_core_amx"])
    zen4 = found(AVX512_BF16, ["inner_product brg_matmul:avx512_core_bf16"])
    verdicts = isa_caps.classify([cap("AVX512_CORE_BF16")], {cap("AVX512_CORE_BF16").label: zen4}, plain)
    assert verdicts[cap("AVX512_CORE_BF16").label].status == "run"
    assert cap("AVX512_CORE_BF16").ci_files and AVX2_CPU.ci_files
    assert not cap("AVX2").ci_files  # CI's time holds two runs: the machines we have


def test_a_probe_that_crashed_under_a_cap_is_a_failure():
    verdict = isa_caps.classify([cap("SSE41")],
                                {cap("SSE41").label: {"ok": False, "error": "the probe exited with status -4"}},
                                found(AVX512_BF16))[cap("SSE41").label]
    assert verdict.status == "broken"
    outcome = isa_caps.Outcome(cap("SSE41").label, verdict)
    assert outcome.failed and "FAILED before its tests" in outcome.line()
    assert isa_caps.summary([outcome], 3.0, "a CPU")[1] == 1


def test_switches_and_forced_candidates_that_change_nothing_here_are_not_run():
    plain = {"engine_ops": {"loaded": True, "bf16_dots": False},
             "onednn_linear": {"loaded": False, "why": "oneDNN is not installed"},
             "candidates": {"attention": ["v7 compiled", "v7 tiles", "v2 loop"], "linears": ["oneDNN matmul", "stock"]},
             "statuses": {"float32": {"attention": {"v7 compiled": "", "v7 tiles": "", "v2 loop": ""},
                                      "linears": {"oneDNN matmul": "not built", "stock": ""}},
                          "bfloat16": {"attention": {"v7 compiled": "", "v7 tiles": "", "v2 loop": ""},
                                       "linears": {"oneDNN matmul": "not built", "stock": ""}}}}
    runs = isa_caps.switch_runs(plain)
    verdicts = isa_caps.classify_switches(runs, plain)
    assert [r.label for r in runs if r.kind == "force"] == [  # two candidates that start alike go by their whole names
        "PREFILLVIZ_ATTENTION='v7 compiled'", "PREFILLVIZ_ATTENTION='v7 tiles'", "PREFILLVIZ_ATTENTION=v2",
        "PREFILLVIZ_LINEARS='oneDNN matmul'", "PREFILLVIZ_LINEARS=stock"]
    assert verdicts["PREFILLVIZ_NO_ENGINE_OPS=1"].runs
    assert verdicts["PREFILLVIZ_NO_BF16_DOT=1"].status == "off"
    assert verdicts["PREFILLVIZ_NO_ONEDNN=1"].why == "the same code as the plain suite here: oneDNN is not installed"
    assert verdicts["PREFILLVIZ_STOCK_LINEARS=1"].status == "off"  # nothing is packed here already
    assert (verdicts["PREFILLVIZ_STOCK_FORWARD=1"].runs and verdicts["PREFILLVIZ_ATTENTION='v7 compiled'"].runs
            and verdicts["PREFILLVIZ_ATTENTION='v7 tiles'"].runs)
    assert (verdicts["PREFILLVIZ_LINEARS='oneDNN matmul'"].why
            == "can't run here (float32: not built; bfloat16: not built)")


def test_pytest_counts_and_failures_are_read_from_its_summary():
    output = "....F.s\n=== short test summary info ===\n" \
             "FAILED tests/model/test_x.py::test_y - AssertionError: max |engine - HF| = 2e-3\n" \
             "1 failed, 5 passed, 1 skipped in 41.20s\n"
    assert isa_caps.pytest_counts(output) == "1 failed, 5 passed, 1 skipped"
    assert isa_caps.pytest_failures(output) == [
        "FAILED tests/model/test_x.py::test_y - AssertionError: max |engine - HF| = 2e-3"]
    assert isa_caps.pytest_counts("==== 61 passed, 3 skipped in 40.12s (0:00:40) ====") == "61 passed, 3 skipped"
    assert isa_caps.pytest_counts("no tests ran in 0.01s") == ""


def test_the_exit_status_is_1_when_a_reachable_run_fails_and_exit_5_counts():
    run = isa_caps.Verdict("run", "reachable (oneDNN 3.12.0 ran brg_matmul:avx2)")
    passed = isa_caps.Outcome("DNNL_MAX_CPU_ISA=AVX2", run, 0, "61 passed, 3 skipped", 41.0)
    not_reachable = isa_caps.Outcome("DNNL_MAX_CPU_ISA=AVX512_CORE_AMX",
                                     isa_caps.Verdict("above", "not reachable on this CPU"))
    assert passed.line() == ("DNNL_MAX_CPU_ISA=AVX2: reachable (oneDNN 3.12.0 ran brg_matmul:avx2): "
                             "61 passed, 3 skipped in 41 s")
    assert not_reachable.line() == "DNNL_MAX_CPU_ISA=AVX512_CORE_AMX: not reachable on this CPU"
    text, status = isa_caps.summary([passed, not_reachable], 50.0, "AMD EPYC")
    assert status == 0 and text.splitlines() == [
        "isa caps on AMD EPYC: 1 of 1 runs passed in 50 s", "  run: DNNL_MAX_CPU_ISA=AVX2",
        "  not run: DNNL_MAX_CPU_ISA=AVX512_CORE_AMX"]
    nothing_collected = isa_caps.Outcome("ATEN_CPU_CAPABILITY=avx2", run, 5, "", 3.0, log="out/isa_caps/a.log")
    assert nothing_collected.failed and "no tests collected" in nothing_collected.line()
    timed_out = isa_caps.Outcome("DNNL_MAX_CPU_ISA=SSE41", run, -9, "12 passed", 300.0, timed_out=True,
                                 log="out/isa_caps/s.log")
    assert "timed out after 300 s (12 passed)" in timed_out.line()
    text, status = isa_caps.summary([passed, nothing_collected, timed_out, not_reachable], 400.0, "AMD EPYC")
    assert status == 1 and text.splitlines()[0] == "isa caps on AMD EPYC: 1 of 3 runs passed in 400 s"
    assert "    the run (pytest exit status 5; log: out/isa_caps/a.log): ATEN_CPU_CAPABILITY=avx2" in text
    assert "    the run (timed out; log: out/isa_caps/s.log): DNNL_MAX_CPU_ISA=SSE41" in text


def test_a_test_that_fails_in_every_run_of_its_file_is_told_from_one_that_fails_under_one_cap():
    run = isa_caps.Verdict("run", "reachable")
    everywhere = "FAILED tests/model/test_dispatch.py::test_k - assert True is False"
    files = ("tests/model/test_dispatch.py", "tests/model/test_capture.py")
    sse41 = isa_caps.Outcome("DNNL_MAX_CPU_ISA=SSE41", run, 1, "2 failed, 9 passed", 9.0,
                             [everywhere, "FAILED tests/model/test_capture.py::test_p - KeyError: 'onednn::matmul'"],
                             files=files)
    avx2 = isa_caps.Outcome("DNNL_MAX_CPU_ISA=AVX2", run, 1, "1 failed, 10 passed", 9.0, [everywhere], files=files)
    forced = isa_caps.Outcome("PREFILLVIZ_ATTENTION=v7", run, 0, "24 passed", 9.0,
                              files=("tests/model/test_engine_oracle.py",))
    text, status = isa_caps.summary([sse41, avx2, forced], 30.0, "AMD EPYC")
    assert status == 1 and text.splitlines()[-3:] == [
        "  failed, and under which runs:",
        "    tests/model/test_dispatch.py::test_k: every run of its file",
        "    tests/model/test_capture.py::test_p: DNNL_MAX_CPU_ISA=SSE41",
    ]
