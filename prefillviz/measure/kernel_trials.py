"""Before a compiled kernel is timed: a trial launch that turns a compile failure into a skip with its
reason, and torch.compile's recompile limit raised for a benchmark that compiles once per shape."""

from __future__ import annotations

import torch

from prefillviz.kernels import paged_attention as paged


def first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:200] if text else ''}"


def recompile_limit(limit: int):
    """torch.compile's per-function recompile limit raised to ``limit`` for the block (never lowered):
    FlexAttention compiles once per shape, and past the default of 8 it would fall back to eager."""
    import torch._dynamo.config as dynamo_config

    return dynamo_config.patch(recompile_limit=max(limit, dynamo_config.recompile_limit))


def trial_launch(kernel, num_heads: int, num_kv_heads: int, head_dim: int, device: str,
                 dtype: torch.dtype) -> tuple[bool, str]:
    """(whether ``kernel`` compiles and agrees with v1 at this shape on a small mixed step, why not):
    a compile failure is a skip with its reason before any size runs, not an exception mid-benchmark."""
    try:
        inputs = paged.random_step([(20, 12), (0, 23), (31, 1)], num_heads, num_kv_heads, head_dim, device=device,
                                   dtype=dtype, seed=1, workload="mixed")
        paged.check_paged(kernel, inputs)
    except Exception as error:  # noqa: BLE001 -- any failure (compile, launch, a wrong result) means "does not run here"
        return False, f"its trial launch failed on {device}: {first_line(error)}"
    return True, ""
