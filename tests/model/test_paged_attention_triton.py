"""The Triton paged-prefill attention kernel against a plain torch reference written here.

How it runs without a GPU: ``@triton.jit`` reads TRITON_INTERPRET when it decorates the
kernel (at import of ``prefillviz.kernels.paged_attention_triton``; triton 3.9.0 checks
``knobs.runtime.interpret`` inside ``triton.jit``), so setting the variable inside an already
running pytest process is too late for a module that is already imported, and would leak
into other tests. Instead this file runs ITSELF as a script in one fresh subprocess with
TRITON_INTERPRET=1 (``python test_paged_attention_triton.py --interpreter-json``): that
process imports the kernel module under the interpreter, runs every case on CPU tensors and
prints {case: max |kernel - reference|} as JSON; the parametrized tests read their case
from it (one subprocess for all cases: torch + triton import once, ~10 s in all).

The cases: a fresh prompt, a chunk after cached context, decodes, mixed steps packing all
three (plus an idle request with q_len 0), GQA (H=6, KVH=2) and MHA, head_dim 64 and 40
(padded to 64 with masking), cache block sizes 16 and 5, each request's blocks scattered
over shuffled physical block ids, q given as a strided (T, H, D)->(H, T, D) view, every
cache slot outside the contexts filled with NaN (a masked load that leaks shows up), fp32 and
bf16, each within a few steps of its dtype per unit of max |v| (``allowed_for``). The real CUDA
compile path is checked only by the skipped-without-GPU test at the end.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

triton = pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # when run as a script (the interpreter subprocess)
    sys.path.insert(0, str(ROOT))

import prefillviz.kernels.paged_attention_triton as pat  # noqa: E402
from tests.tolerances import OP_STEPS, allowed_difference  # noqa: E402

# name: (H, KVH, D, block_size, context_lens, q_lens, dtype, block_m, block_n)
CASES = {
    "fresh prompt, GQA, D64, bs16": (6, 2, 64, 16, [37], [37], "float32", None, None),
    "chunk after cached context, MHA, D40, bs5": (4, 4, 40, 5, [45], [13], "float32", None, None),
    "decodes, GQA, D64, bs16": (6, 2, 64, 16, [20, 33, 1], [1, 1, 1], "float32", None, None),
    "mixed step, GQA, D40, bs5": (6, 2, 40, 5, [30, 41, 17, 8], [30, 12, 1, 1], "float32", None, None),
    "mixed step, MHA, D64, bs16, idle request": (3, 3, 64, 16, [18, 9, 40, 26], [18, 0, 7, 1], "float32", None, None),
    "mixed step, GQA, D40, bs16, tiles 32x64": (6, 2, 40, 16, [50, 35, 3], [50, 19, 1], "float32", 32, 64),
    "mixed step bf16, GQA, D40, bs5": (6, 2, 40, 5, [30, 41, 17, 8], [30, 12, 1, 1], "bfloat16", None, None),
    "mixed step bf16, MHA, D64, bs16": (4, 4, 64, 16, [33, 21, 5], [33, 4, 1], "bfloat16", None, None),
}


# ------------------------------------------------------------------------------ helpers
def make_case(num_heads, num_kv_heads, head_dim, block_size, context_lens, q_lens, dtype,
              seed=0, device="cpu", spare_blocks=3):
    """Random q and a paged cache: every request's blocks at shuffled physical ids, every
    slot outside the contexts NaN. Returns the kernel's arguments and the slots."""
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    gen = torch.Generator().manual_seed(seed)
    blocks_per_request = [math.ceil(n / block_size) for n in context_lens]
    num_blocks = sum(blocks_per_request) + spare_blocks
    physical = torch.randperm(num_blocks, generator=gen).tolist()
    key_cache = torch.full((num_blocks, block_size, num_kv_heads, head_dim), float("nan"))
    value_cache = torch.full_like(key_cache, float("nan"))
    context_slots = []
    for n, nb in zip(context_lens, blocks_per_request):
        blocks = torch.tensor([physical.pop() for _ in range(nb)], dtype=torch.int64)
        positions = torch.arange(n)
        slots = blocks[positions // block_size] * block_size + positions % block_size
        context_slots.append(slots)
        flat_k = key_cache.view(-1, num_kv_heads, head_dim)
        flat_v = value_cache.view(-1, num_kv_heads, head_dim)
        flat_k[slots] = torch.randn(n, num_kv_heads, head_dim, generator=gen)
        flat_v[slots] = torch.randn(n, num_kv_heads, head_dim, generator=gen)
    block_tables, lens = pat.block_tables_from_slots(context_slots, block_size)
    query_start_loc = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    total = int(query_start_loc[-1])
    q = torch.randn(total, num_heads, head_dim, generator=gen).transpose(0, 1)  # strided (H, T, D)
    to = dict(device=device)
    return dict(
        q=q.to(dtype=dtype, **to),
        key_cache=key_cache.to(dtype=dtype, **to),
        value_cache=value_cache.to(dtype=dtype, **to),
        block_tables=block_tables.to(**to),
        context_lens=lens.to(**to),
        query_start_loc=query_start_loc.to(**to),
        scale=head_dim ** -0.5,
    )


def reference(q, key_cache, value_cache, block_tables, context_lens, query_start_loc, scale):
    """Plain torch, fp32: gather each request's keys through its block table, repeat KV
    heads, full scores with the offset causal mask, softmax, times V."""
    num_heads = q.shape[0]
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    groups = num_heads // num_kv_heads
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    for r in range(context_lens.shape[0]):
        start, end = int(query_start_loc[r]), int(query_start_loc[r + 1])
        n_ctx, n_q = int(context_lens[r]), end - start
        if n_q == 0:
            continue
        positions = torch.arange(n_ctx, device=q.device)
        blocks = block_tables[r, positions // block_size].long()
        k = key_cache[blocks, positions % block_size].float()  # (n_ctx, KVH, D)
        v = value_cache[blocks, positions % block_size].float()
        k = k.permute(1, 0, 2).repeat_interleave(groups, dim=0)  # (H, n_ctx, D)
        v = v.permute(1, 0, 2).repeat_interleave(groups, dim=0)
        scores = q[:, start:end].float() @ k.transpose(-1, -2) * scale  # (H, n_q, n_ctx)
        query_pos = torch.arange(n_ctx - n_q, n_ctx, device=q.device)
        scores = scores.masked_fill(positions[None, :] > query_pos[:, None], float("-inf"))
        out[:, start:end] = torch.softmax(scores, dim=-1) @ v
    return out


def allowed_for(name, dtype=None):
    """The allowed error per unit of max |v| (``relative_error``): p and the output rounded to the
    dtype (a step each), and fp32 sums over the longest context or the head dimension."""
    _, _, head_dim, _, context_lens, _, case_dtype, _, _ = CASES[name]
    return allowed_difference(getattr(torch, dtype or case_dtype), 1.0, OP_STEPS, max(*context_lens, head_dim))


def relative_error(case_args, out, ref):
    """max |out - ref| per unit of max |v| (over the cache's written, non-NaN values)."""
    v = reference_values(case_args)
    return ((out.float() - ref).abs().max() / max(v.abs().max().item(), 1e-12)).item()


def reference_values(case_args):
    value_cache = case_args["value_cache"].float()
    return value_cache[~value_cache.isnan()]


def run_case(name, device="cpu"):
    h, kvh, d, bs, ctx, ql, dtype, block_m, block_n = CASES[name]
    args = make_case(h, kvh, d, bs, ctx, ql, dtype, device=device)
    out = pat.paged_prefill_attention(**args, block_m=block_m, block_n=block_n)
    assert out.shape == args["q"].shape and out.dtype == args["q"].dtype
    ref = reference(**args)
    finite = bool(torch.isfinite(out).all())
    return {"error": relative_error(args, out, ref), "finite": finite}


def _interpreter_main():
    """Run in the TRITON_INTERPRET=1 subprocess: every case, JSON on the last line."""
    torch.set_num_threads(1)
    result = {"available_cpu": list(pat.available("cpu")), "cases": {}}
    for name in CASES if result["available_cpu"][0] else ():  # else its reason is the tests' skip
        try:
            result["cases"][name] = run_case(name)
        except Exception as exc:  # reported to the parent test, which fails with it
            result["cases"][name] = {"exception": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(result))


# ------------------------------------------------------------------------------ interpreter
@pytest.fixture(scope="module")
def interpreted():
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--interpreter-json"],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=300,
    )
    assert proc.returncode == 0, f"interpreter subprocess failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_available_under_interpreter(interpreted):
    ok, reason = interpreted["available_cpu"]
    if not ok:  # the probe's refusal names the interpreter's version and error (triton 3.6 with numpy 2.4+)
        assert "interpreter can't loop to a bound loaded from memory" in reason, reason
        pytest.skip(reason)
    assert reason == "triton interpreter"


@pytest.mark.parametrize("name", list(CASES))
def test_matches_reference_under_interpreter(interpreted, name):
    ok, reason = interpreted["available_cpu"]
    if not ok:
        pytest.skip(reason)
    result = interpreted["cases"][name]
    assert "exception" not in result, result.get("exception")
    assert result["finite"], "NaN/inf in the output (a masked slot leaked?)"
    tolerance = allowed_for(name)
    assert result["error"] <= tolerance, f"{name}: error {result['error']:.2e} > {tolerance:.2e} per unit of max |v|"


# ------------------------------------------------------------------------------ in-process
def test_reference_sees_the_offset_causal_mask():
    """The oracle itself: a decode equals the last row of the same request's full prompt."""
    args = make_case(4, 2, 16, 5, [12], [12], "float32")
    full = reference(**args)
    decode = dict(args, q=args["q"][:, -1:], query_start_loc=torch.tensor([0, 1], dtype=torch.int32))
    # the same sums, in matmuls of other shapes
    allowed = allowed_difference(torch.float32, reference_values(args), OP_STEPS, 16)
    assert (reference(**decode) - full[:, -1:]).abs().max().item() <= allowed


@pytest.mark.skipif(pat._INTERPRETED, reason="this process imported the kernel under TRITON_INTERPRET=1")
def test_available_and_refusal_without_interpreter():
    ok, reason = pat.available("cpu")
    assert not ok and "CUDA" in reason and "TRITON_INTERPRET" in reason
    ok, reason = pat.available(torch.device("cuda"))
    assert (ok, reason) == ((True, "cuda") if torch.cuda.is_available() else (False, reason))
    args = make_case(2, 1, 16, 4, [5], [5], "float32")
    with pytest.raises(RuntimeError, match="unavailable"):
        pat.paged_prefill_attention(**args)


def test_imports_and_refuses_without_triton(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` now raises ImportError
    monkeypatch.setitem(sys.modules, "triton.language", None)
    spec = importlib.util.spec_from_file_location("_pat_without_triton", pat.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.available("cpu") == (False, "triton is not installed")
    assert module.available("cuda") == (False, "triton is not installed")
    args = make_case(2, 1, 16, 4, [5], [5], "float32")
    with pytest.raises(RuntimeError, match="triton is not installed"):
        module.paged_prefill_attention(**args)


def test_block_tables_from_slots():
    block_size = 5
    requests = [[7, 2, 9], [4], [], [0, 3]]  # physical blocks per request
    lens = [12, 5, 0, 6]  # 12: two full blocks + 2; 5: one full; 0: empty; 6: one + 1
    slots = []
    for blocks, n in zip(requests, lens):
        positions = torch.arange(n)
        slots.append(torch.tensor(blocks, dtype=torch.int64)[positions // block_size] * block_size
                     + positions % block_size)
    table, context_lens = pat.block_tables_from_slots(slots, block_size)
    assert table.dtype == torch.int32 and context_lens.dtype == torch.int32
    assert table.tolist() == [[7, 2, 9], [4, 0, 0], [0, 0, 0], [0, 3, 0]]
    assert context_lens.tolist() == lens


def test_block_tables_from_slots_rejects_inconsistent_slots():
    with pytest.raises(ValueError, match="slots"):
        pat.block_tables_from_slots([torch.tensor([10, 11, 3])], 5)  # position 2 jumps block


def test_block_tables_from_slots_empty():
    table, lens = pat.block_tables_from_slots([], 16)
    assert table.shape == (0, 1) and lens.shape == (0,)


# ------------------------------------------------------------------------------ CUDA compile
@pytest.mark.skipif(pat._INTERPRETED, reason="this process imported the kernel under TRITON_INTERPRET=1")
@pytest.mark.parametrize(
    "dtype, head_dim, block_m, block_n, arch",
    [("bf16", 64, 64, 64, 90), ("fp32", 40, 32, 32, 90), ("fp16", 128, 64, 64, 80)],
    ids=["bf16 D64 sm_90", "fp32 D40 sm_90", "fp16 D128 sm_80"],
)
def test_compiles_for_cuda_without_a_gpu(monkeypatch, tmp_path, dtype, head_dim, block_m, block_n, arch):
    """Ahead-of-time compile the kernel to a cubin for a CUDA target (triton's frontend, its
    tl.dot shape / dtype checks for that target, the LLVM/PTX passes and the bundled ptxas):
    everything of the CUDA path except running it. The wrapper's default tile sizes."""
    import triton.backends

    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource, make_backend
    except ImportError as exc:  # another triton version's internal API
        pytest.skip(f"triton's AOT API differs: {exc}")
    if "nvidia" not in getattr(triton.backends, "backends", {}):
        pytest.skip("this triton has no NVIDIA backend")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))  # a real compile, no cached cubin
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")  # triton 3.9's runtime default, said out loud

    kernel = pat._paged_prefill_kernel
    signature = {name: "i32" for name in kernel.arg_names}  # strides, block_size, head_dim
    signature.update({name: f"*{dtype}" for name in ("q_ptr", "k_cache_ptr", "v_cache_ptr", "out_ptr")})
    signature.update({name: "*i32" for name in ("block_tables_ptr", "context_lens_ptr", "query_start_loc_ptr")})
    signature["qk_scale"] = "fp32"
    constexprs = {
        "QUERIES_PER_KV": 3, "BLOCK_M": block_m, "BLOCK_N": block_n,
        "BLOCK_D": max(16, pat._next_power_of_2(head_dim)),
        "DOT_PRECISION": "ieee" if dtype == "fp32" else None, "DOT_FP32": False,
        # what triton's launcher specializes for contiguous tensors: unit strides are constants
        "stride_qd": 1, "stride_kd": 1, "stride_vd": 1, "stride_od": 1, "stride_btb": 1,
    }
    signature.update({name: "constexpr" for name in constexprs})
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
    target = GPUTarget("cuda", arch, 32)
    options = make_backend(target).parse_options({"num_warps": 4, "num_stages": 2})
    compiled = triton.compile(source, target=target, options=options.__dict__)

    assert compiled.asm["cubin"], "no cubin"
    ptx = compiled.asm["ptx"]
    if dtype == "fp32":
        assert "mma" not in ptx  # input_precision="ieee": fp32 FMAs, not TF32 tensor cores
    else:
        assert "mma" in ptx  # 16-bit dots on tensor cores


# ------------------------------------------------------------------------------ GPU
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the compiled Triton path)")
@pytest.mark.parametrize("name", list(CASES))
def test_matches_reference_on_cuda(name):
    h, kvh, d, bs, ctx, ql, _, block_m, block_n = CASES[name]
    for dtype in ("bfloat16", "float32"):
        tolerance = allowed_for(name, dtype)
        args = make_case(h, kvh, d, bs, ctx, ql, dtype, device="cuda")
        out = pat.paged_prefill_attention(**args, block_m=block_m, block_n=block_n)
        torch.cuda.synchronize()
        ref = reference(**args)
        assert torch.isfinite(out).all()
        error = relative_error(args, out, ref)
        assert error <= tolerance, f"{name} {dtype}: error {error:.2e} > {tolerance:.2e} per unit of max |v|"


if __name__ == "__main__" and "--interpreter-json" in sys.argv:
    _interpreter_main()
