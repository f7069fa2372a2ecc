"""The engine's brgemm linear (prefillviz/backends/ops/csrc/linear_brgemm.h, ops/brgemm_linear.py's BrgemmLinear),
and the slab linear (the same op and packs in fp32 on the engine's own micro-kernel, ``own``): the same product as
F.linear, each output within the bound of its dtype and length (tests/tolerances.py), at row
counts that take one call, several calls, one group of rows per thread and more groups than threads;
a width that is not a multiple of its 64-column slabs; the gated MLP's silu(x G^T) * (x U^T) within the
bound that follows from the two products' (linear_checks.activation_bound); two threads on one
weight; and a clear refusal where it can't run (bf16 below AMX, an odd bf16 width; the slab linear in bf16
or on a build without AVX-512)."""


import pytest
import torch
import torch.nn.functional as F

from prefillviz.backends import linear_checks
from prefillviz.backends.ops.brgemm_linear import BrgemmLinear, brgemm_linear_why, slab_linear_why
from tests.tolerances import assert_linear_close, assert_linear_close_from_two_threads

ROWS = [1, 2, 7, 33, 255, 256, 300, 513, 1100]  # 1,100 rows: 3 groups of rows on 2 threads (at most 512 a group)


KERNELS = [  # (dtype, own): oneDNN's micro-kernel in both dtypes, the engine's (the slab linear) in fp32
    pytest.param(torch.float32, False, id="float32"),
    pytest.param(torch.bfloat16, False, id="bfloat16"),
    pytest.param(torch.float32, True, id="float32-slab"),
]


def runs_here(compiled_ops, dtype, width, own=False):
    why = slab_linear_why("cpu", dtype) if own else brgemm_linear_why("cpu", dtype, width)
    if why:
        pytest.skip(why)


@pytest.mark.parametrize("dtype,own", KERNELS)
def test_matches_f_linear_at_every_row_count_and_width(compiled_ops, dtype, own):
    runs_here(compiled_ops, dtype, 48, own)
    generator = torch.Generator().manual_seed(0)
    for out_features in (64, 100, 192):  # a whole slab, a part of the last one, several
        weight = torch.randn(out_features, 48, generator=generator).to(dtype)
        linear = BrgemmLinear(weight, own=own)
        for rows in ROWS:
            x = torch.randn(rows, 48, generator=generator).to(dtype)
            got = linear(x)
            assert got.dtype == dtype
            assert_linear_close(got, x, weight)
    assert linear(torch.empty(0, 48, dtype=dtype)).shape == (0, 192)


def test_leading_dimensions_and_a_strided_input(compiled_ops):
    runs_here(compiled_ops, torch.float32, 16)
    generator = torch.Generator().manual_seed(1)
    weight = torch.randn(24, 16, generator=generator)
    linear = BrgemmLinear(weight)
    x = torch.randn(2, 3, 16, generator=generator)
    assert linear(x).shape == (2, 3, 24)
    assert_linear_close(linear(x), x, weight)
    strided = torch.randn(5, 32, generator=generator)[:, ::2]
    assert_linear_close(linear(strided), strided, weight)


@pytest.mark.parametrize("dtype,own", KERNELS)
def test_gated_is_silu_of_gate_times_up_within_the_bound_of_both_products(compiled_ops, dtype, own):
    runs_here(compiled_ops, dtype, 64, own)
    generator = torch.Generator().manual_seed(2)
    for intermediate in (96, 128):
        gate, up = (torch.randn(intermediate, 64, generator=generator).to(dtype) for _ in range(2))
        weight = torch.cat([gate, up])
        linear = BrgemmLinear(weight, gated=True, own=own)
        assert (linear.in_features, linear.out_features) == (64, intermediate)
        for rows in (1, 33, 300, 1100):
            x = torch.randn(rows, 64, generator=generator).to(dtype)
            want, bound = linear_checks.activation_bound(
                F.linear(x.float(), weight.float()), linear_checks.linear_tolerance(x, weight), dtype
            )
            got = linear(x)
            assert got.shape == (rows, intermediate) and got.dtype == dtype
            excess = (got.float() - want).abs() - bound
            assert float(excess.max()) <= 0, f"exceeds its bound by {float(excess.max()):.3g} ({dtype}, {rows} rows)"
            # torch's own path (three roundings in bf16) is within the same bound
            g, u = F.linear(x, weight).chunk(2, dim=-1)
            assert float(((F.silu(g) * u).float() - want).abs().sub(bound).max()) <= 0


@pytest.mark.parametrize("own", [False, True], ids=["brgemm", "slab"])
def test_two_threads_on_one_weight(compiled_ops, own):
    runs_here(compiled_ops, torch.float32, 128, own)
    weight = torch.randn(256, 128)
    linear = BrgemmLinear(weight, own=own)
    assert_linear_close_from_two_threads(linear, weight, (1, 17, 300, 3), loops=20)


@pytest.mark.parametrize("threads", [1, 3, 5])
@pytest.mark.parametrize("dtype,own", KERNELS)
def test_the_thread_counts_of_other_machines(compiled_ops, dtype, own, threads):
    """A machine with more cores than CI's two splits the rows into more groups (one a thread, each of
    at least 128 rows), and each thread's run of tasks may start in the middle of a group's slabs; one
    thread runs every task. Each output still comes from one micro-kernel call over the whole of K, so
    the slab linear (K in order) gives the same bits as at the default count, and oneDNN's within the bound."""
    runs_here(compiled_ops, dtype, 64, own)
    generator = torch.Generator().manual_seed(6)
    weight, gate_up = (
        torch.randn(200, 64, generator=generator).to(dtype), torch.randn(256, 64, generator=generator).to(dtype)
    )
    plain, gated = BrgemmLinear(weight, own=own), BrgemmLinear(gate_up, gated=True, own=own)
    xs = [torch.randn(rows, 64, generator=generator).to(dtype) for rows in (5, 300, 700, 1100)]
    by_default = [(plain(x), gated(x)) for x in xs]  # CI's two threads; a test machine's own count
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        on_these = [(plain(x), gated(x)) for x in xs]
    finally:
        torch.set_num_threads(before)
    for x, (got, got_gated), (want, want_gated) in zip(xs, on_these, by_default):
        assert_linear_close(got, x, weight)
        if own:
            assert torch.equal(got, want) and torch.equal(got_gated, want_gated)
        else:
            wanted, bound = linear_checks.activation_bound(
                F.linear(x.float(), gate_up.float()), linear_checks.linear_tolerance(x, gate_up), dtype
            )
            assert float(((got_gated.float() - wanted).abs() - bound).max()) <= 0


def test_what_it_refuses_says_why(compiled_ops):
    assert "odd" in brgemm_linear_why("cpu", torch.bfloat16, 47)
    assert "bf16 and fp32 only" in brgemm_linear_why("cpu", torch.float16, 48)
    assert "CPU path" in brgemm_linear_why("meta", torch.float32, 48)
    if not brgemm_linear_why("cpu", torch.float32, 48):
        linear = BrgemmLinear(torch.randn(64, 48))
        with pytest.raises(RuntimeError, match="packed for 48 inputs"):
            compiled_ops.brgemm_linear(torch.randn(3, 40), linear.packed, 64, False, False)
        with pytest.raises(RuntimeError, match="one dtype"):
            linear(torch.randn(3, 48).to(torch.bfloat16))
    assert "fp32 only" in slab_linear_why("cpu", torch.bfloat16)
    # a build for AVX2 or plain C++ (the ISA caps run one): no micro-kernel of its own
    if compiled_ops.vector_width() < 16:
        assert "AVX-512" in slab_linear_why("cpu", torch.float32)
    assert "CPU path" in slab_linear_why("meta", torch.float32)
    if not brgemm_linear_why("cpu", torch.bfloat16, 48):
        with pytest.raises(RuntimeError, match="fp32 only"):
            BrgemmLinear(torch.randn(64, 48).to(torch.bfloat16), own=True)
        packed = BrgemmLinear(torch.randn(64, 48).to(torch.bfloat16)).packed
        with pytest.raises(RuntimeError, match="fp32 on an AVX-512 build only"):  # the op refuses too
            compiled_ops.brgemm_linear(torch.randn(3, 48).to(torch.bfloat16), packed, 64, False, True)


def test_packs_made_in_an_arena_share_its_huge_page_region_and_still_match(compiled_ops, monkeypatch):
    import mmap

    from prefillviz.backends.host_memory import NO_HUGE_PAGES_ENV, huge_page_arena

    runs_here(compiled_ops, torch.float32, 64)
    monkeypatch.delenv(NO_HUGE_PAGES_ENV, raising=False)
    generator = torch.Generator().manual_seed(5)
    weights = [torch.randn(out, 64, generator=generator) for out in (64, 100, 192)]
    with huge_page_arena():  # as LlamaWeights packs a model's linears
        linears = [BrgemmLinear(weight) for weight in weights]
    advised = hasattr(mmap, "MADV_HUGEPAGE")
    assert [linear.huge_pages for linear in linears] == [advised] * 3
    if advised:  # one region, each pack on a 4 KiB boundary of it
        assert len({linear.packed.untyped_storage().data_ptr() for linear in linears}) == 1
        assert all(linear.packed.data_ptr() % 4096 == 0 for linear in linears)
    x = torch.randn(33, 64, generator=generator)
    for linear, weight in zip(linears, weights):
        assert_linear_close(linear(x), x, weight)
    assert not BrgemmLinear(weights[0]).huge_pages  # outside an arena, a pack under 2 MiB stays on the heap
