"""oneDNN's matmul primitive as the engine's packed linear (prefillviz/backends/ops/onednn_linear.py): the same
product as F.linear (each output within the bound of its dtype and length, tests/tolerances.py) at
every row count, with a bias and leading dimensions, past its cache of 8 row counts, from two
threads at once on one weight (the app's sessions share the model), and on oneDNN's JIT gemm in
column blocks (AVX2)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from prefillviz.backends.ops.onednn_linear import onednn_runs
from tests.tolerances import assert_linear_close, assert_linear_close_from_two_threads


def test_fp32_matches_f_linear_at_every_row_count(onednn):
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(96, 80, generator=generator)
    linear = onednn.Linear(weight)
    assert (linear.out_features, linear.in_features) == (96, 80)
    for rows in [1, 2, 5, 31, 32, 33, 100, 1, 32]:  # new row counts, then cached ones
        x = torch.randn(rows, 80, generator=generator)
        assert_linear_close(linear(x), x, weight)
    assert linear(torch.empty(0, 80)).shape == (0, 96)


def test_bias_leading_dimensions_and_a_strided_input(onednn):
    generator = torch.Generator().manual_seed(1)
    weight, bias = torch.randn(24, 16, generator=generator), torch.randn(24, generator=generator)
    x = torch.randn(2, 3, 16, generator=generator)
    assert_linear_close(onednn.Linear(weight, bias)(x), x, weight, bias)
    wide = torch.randn(5, 32, generator=generator)[:, ::2]  # not contiguous
    assert_linear_close(onednn.Linear(weight)(wide), wide, weight)


def test_more_row_counts_than_it_keeps(onednn):
    weight = torch.randn(40, 24)
    linear = onednn.Linear(weight)
    # 79 counts, past the 8 kept: the oldest primitives are dropped and made again
    for rows in list(range(1, 80)) + [3, 70]:
        x = torch.randn(rows, 24)
        assert_linear_close(linear(x), x, weight)


def test_bf16_where_this_cpu_runs_it(onednn):
    runs, why = onednn_runs(torch.bfloat16)
    if not runs:
        pytest.skip(why)
    weight = torch.randn(64, 48).to(torch.bfloat16)
    x = torch.randn(9, 48).to(torch.bfloat16)
    got = onednn.Linear(weight)(x)
    assert got.dtype == torch.bfloat16
    assert_linear_close(got, x, weight)  # against the fp32 product: one bf16 rounding of each output


def test_two_threads_on_one_weight(onednn):
    weight = torch.randn(256, 128)
    linear = onednn.Linear(weight)
    assert_linear_close_from_two_threads(linear, weight, (1, 17, 64, 3), loops=40)


def test_wrong_inputs_raise_a_clear_error(onednn):
    linear = onednn.Linear(torch.randn(8, 4))
    with pytest.raises(RuntimeError, match="x \\(..., 4\\) of the weight's dtype"):
        linear(torch.randn(2, 5))
    with pytest.raises(RuntimeError, match="x \\(..., 4\\) of the weight's dtype"):
        linear(torch.randn(2, 4, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="float32 or bfloat16 only"):
        onednn.Linear(torch.randn(8, 4, dtype=torch.float64))


JIT_GEMM_CHECK = """
import json, torch, torch.nn.functional as F
from prefillviz.backends.ops.onednn_linear import onednn_status
from tests.tolerances import linear_difference_bound
module = onednn_status()[0]
generator = torch.Generator().manual_seed(3)
weight, bias = torch.randn(1800, 40, generator=generator), torch.randn(1800, generator=generator)
linear = module.Linear(weight, bias)
errors = {}
for rows in (1, 2, 33, 300, 2, 1):
    x = torch.randn(rows, 40, generator=generator)
    excess = (linear(x) - F.linear(x, weight, bias)).abs() - linear_difference_bound(x, weight, bias)
    errors[rows] = excess.max().item()  # <= 0: every output within its bound
print(json.dumps({"kernel": linear.implementation(64), "one_row": linear.implementation(1), "errors": errors}))
"""


def test_a_wide_weight_on_the_jit_gemm_runs_in_column_blocks(onednn):
    """oneDNN capped at AVX2, where 2.6 has no brgemm: a weight wider than 1,024 runs in blocks of
    768 columns (1,800: 768 + 768 + 264), one row whole, each the same product as F.linear."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "DNNL_MAX_CPU_ISA": "AVX2", "PYTHONPATH": str(root)}
    done = subprocess.run(
        [sys.executable, "-c", JIT_GEMM_CHECK], capture_output=True, text=True, cwd=root, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    if not result["one_row"].startswith("gemm"):
        pytest.skip(f"oneDNN runs {result['one_row']} here under DNNL_MAX_CPU_ISA=AVX2, not its JIT gemm")
    assert result["kernel"] == f"{result['one_row']}, in 3 blocks of 768 columns"
    assert max(result["errors"].values()) <= 0, result
