"""The linears family of the measured dispatch (``dispatch_tuning.py``): layer 0's linears grouped as
the engine's forward calls them, each candidate's calls on them, and their oracle.

- ``layer_linears``: [q, k, v], [o], [gate, up], [down] for a Llama-shaped model (each group one
  packed matmul in ``llama_weights``), else each ``nn.Linear`` of the first block on its own.
- ``linear_layer``: a candidate's calls on those groups, as the forward makes them; a gated MLP's
  [gate, up] gives silu(gate) * up, in the pack's own call where it fuses the SiLU (the brgemm
  linear, ``ops/brgemm_linear.py``) or with ``silu_mul`` after, so every candidate is timed on the
  same work.
- ``check_linears``: each group against an fp32 ``F.linear`` within ``linear_tolerance``, the
  bound of the dtype's precision, and gate|up's activation within ``activation_bound``.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch
import torch.nn.functional as F

from prefillviz.backends.llama_weights import linear_of, stacked
from prefillviz.backends.ops.engine_ops import engine_ops
from prefillviz.engine.backend import silu_mul


def input_widths(model: torch.nn.Module) -> list[int]:
    """The input widths of the linears the tuning times (asked at every step: kept per model)."""
    widths = _widths_of.get(model)
    if widths is None:
        widths = _widths_of[model] = sorted({weight.shape[1] for group in layer_linears(model) for weight in group})
    return widths


_widths_of: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def layer_linears(model: torch.nn.Module) -> list[list[torch.Tensor]]:
    """Layer 0's linear weights (out, in), grouped as the engine's forward runs them for a
    Llama-shaped model: [q, k, v], [o], [gate, up], [down] (``llama_weights``: each group one packed
    matmul, or the stock ``F.linear`` of each weight and the outputs side by side); else each
    ``nn.Linear`` of the first decoder block on its own (none for a model whose layers are no
    ``nn.Linear``, such as GPT-2's Conv1D)."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is not None and all(
        hasattr(layers[0].self_attn, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj")
    ) and all(
        hasattr(getattr(layers[0], "mlp", None), n) for n in ("gate_proj", "up_proj", "down_proj")
    ):
        attn, mlp = layers[0].self_attn, layers[0].mlp
        groups = [[attn.q_proj, attn.k_proj, attn.v_proj], [attn.o_proj], [mlp.gate_proj, mlp.up_proj], [mlp.down_proj]]
        return [[m.weight.detach() for m in group] for group in groups]
    block = next((m[0] for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m)), None)
    return [] if block is None else [[m.weight.detach()] for m in block.modules() if type(m) is torch.nn.Linear]


def gated_group(groups: list[list[torch.Tensor]]) -> int | None:
    """The index of a gated MLP's [gate, up] among ``layer_linears``' groups (two weights of one shape
    (I, H) whose activation the next group's (H, I) weight reads), else None."""
    for index, (group, after) in enumerate(zip(groups, groups[1:])):
        if (len(group) == 2 and group[0].shape == group[1].shape
                and len(after) == 1 and after[0].shape == group[0].shape[::-1]):
            return index
    return None


def silu_mul_for(weight: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """The forward's ``silu_mul`` for this weight's device and dtype: the engine's C++ op where it runs, else
    torch's."""
    ops = engine_ops() if weight.device.type == "cpu" and weight.dtype in (torch.float32, torch.bfloat16) else None
    return ops.silu_mul if ops is not None else silu_mul


def linear_layer(groups: list[list[torch.Tensor]],
                 candidate: str) -> Callable[[list[torch.Tensor]], list[torch.Tensor]]:
    """A function running each group on its input (rows, in) with ``candidate``, through the engine's own
    ``llama_weights.linear_of`` (stock: one ``F.linear`` per weight, outputs side by side; else stacked and packed
    once now).
    A gated MLP's [gate, up] gives silu(gate) * up, as the forward computes it: in the pack's call
    where it fuses the SiLU (the brgemm linear), else with ``silu_mul`` after."""
    gated = gated_group(groups)
    linears = [linear_of(group, candidate, gated=index == gated) for index, group in enumerate(groups)]
    activate = silu_mul_for(groups[gated][0]) if gated is not None and not linears[gated].activates else None

    def run(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        outputs = [linear(x) for linear, x in zip(linears, inputs)]
        if activate is not None:
            outputs[gated] = activate(outputs[gated])
        return outputs

    return run


def linear_inputs(groups: list[list[torch.Tensor]], rows: int,
                  generator: torch.Generator | None = None) -> list[torch.Tensor]:
    """A random (rows, in) input for each group, in its dtype and on its device."""
    return [torch.randn(rows, g[0].shape[1], generator=generator).to(device=g[0].device, dtype=g[0].dtype)
            for g in groups]


def linear_tolerance(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The allowed |error| of each output of ``x @ weight.T`` in x's dtype, from its precision.

    Inputs are exact in the dtype; a kernel sums in fp32 (in any order) and rounds the output
    once: at most one rounding of the dtype (eps) times |y|, plus the fp32 sum's error, bounded
    by K * eps_fp32 * sum |x_k w_k|. Twice that, for a last conversion's rounding.
    """
    magnitude = x.float().abs() @ weight.float().abs().T  # sum_k |x_k w_k|, per output
    eps = torch.finfo(x.dtype).eps
    return 2 * (eps + x.shape[-1] * torch.finfo(torch.float32).eps) * magnitude + torch.finfo(torch.float32).tiny


def activation_bound(gate_up: torch.Tensor, bound: torch.Tensor,
                     dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(silu(g) * u, its allowed |error|) from the exact [g | u] and the bound on each of their errors.

    |silu'| <= 1.1 and |silu(g)| <= |g|, so errors e_g, e_u move the product by at most
    1.1 e_g |u| + (|g| + e_g) e_u; plus two roundings of the dtype (silu(g), then the product:
    torch's path; the brgemm linear rounds once)."""
    g, u = gate_up.chunk(2, dim=-1)
    e_g, e_u = bound.chunk(2, dim=-1)
    return F.silu(g) * u, 1.1 * e_g * u.abs() + (g.abs() + e_g) * e_u + 2 * torch.finfo(dtype).eps * (g * u).abs()


def check_linears(groups: list[list[torch.Tensor]], candidate: str) -> str:
    """'' when ``candidate`` computes layer 0's linears as fp32 ``F.linear`` does within ``linear_tolerance``, else
    what differed."""
    if not groups:
        return ""  # nothing to compute differently
    generator = torch.Generator().manual_seed(0)
    dtype = groups[0][0].dtype
    weights = [stacked(group) for group in groups]
    gated = gated_group(groups)
    try:
        layer = linear_layer(groups, candidate)
        for rows in (1, 7, 33):
            inputs = linear_inputs(groups, rows, generator)
            for index, (got, x, weight) in enumerate(zip(layer(inputs), inputs, weights)):
                want, bound = F.linear(x.float(), weight.float()), linear_tolerance(x, weight)
                if index == gated:
                    want, bound = activation_bound(want, bound, dtype)
                excess = (got.float() - want).abs() - bound
                if got.shape != want.shape or not bool(torch.isfinite(got).all()) or float(excess.max()) > 0:
                    return (f"differs from fp32 F.linear beyond the {str(dtype).removeprefix('torch.')} bound "
                            f"at {rows} rows")
    except RuntimeError as error:
        return ("failed on this CPU "
                f"({str(error).strip().splitlines()[0][:160] if str(error).strip() else type(error).__name__})")
    return ""
