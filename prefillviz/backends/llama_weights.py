"""The linears of a Llama-shaped model as the measured backend runs them (``measured.py``).

Made once per model and linear implementation (the measured dispatch's choice, ``dispatch.py``),
remade when any weight changes (a new dtype or device, or an in-place write): q|k|v and gate|up
stacked and packed once for oneDNN's matmul or torch's packed linear, or the modules' own
weights (no copy) for the stock ``F.linear``. A model whose buckets chose two packs holds both.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from prefillviz.backends.host_memory import huge_page_arena
from prefillviz.backends.packed_weights import gated_packs, pack_weight, packed_linear

_models: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {linear implementation: LlamaWeights}
STOCK = "stock"  # dispatch.STOCK: the modules' own weights, F.linear
_lock = threading.Lock()


@dataclass
class _Linear:
    """One projection, or several stacked (q|k|v, gate|up): one oneDNN pack of the stacked
    weights where the CPU packs, else the modules' own weights, one matmul each, outputs side by
    side (no copy of a weight, so a single forward on a fresh process pays for none)."""

    weights: list[torch.Tensor]
    biases: list[torch.Tensor | None]
    packed: torch.Tensor | None = None
    packed_bias: torch.Tensor | None = None
    # a gated MLP's [gate; up] whose call returns silu(gate) * up (``packed_weights.gated_packs``)
    activates: bool = False

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            return packed_linear(x, self.packed, self.packed_bias)
        if len(self.weights) == 1:
            return F.linear(x, self.weights[0], self.biases[0])
        return torch.cat([F.linear(x, w, b) for w, b in zip(self.weights, self.biases)], dim=-1)


def stacked(weights: list[torch.Tensor]) -> torch.Tensor:
    """Weights (out, in) as one (sum of outs, in) weight: what a stacked projection's matmul computes."""
    return torch.cat(weights) if len(weights) > 1 else weights[0]


def linear_of(weights: list[torch.Tensor], implementation: str, biases: list[torch.Tensor | None] | None = None,
              gated: bool = False) -> _Linear:
    """One projection (or several stacked) as the engine's forward runs it with ``implementation``
    (the measured dispatch times it through here too, ``linear_checks.linear_layer``).

    ``gated``: the weights are a gated MLP's [gate, up]; where the implementation packs that into
    one call returning silu(gate) * up (and there is no bias), the result ``activates``."""
    biases = biases or [None] * len(weights)
    if implementation == STOCK:
        return _Linear(weights, biases)
    if gated and gated_packs(implementation) and all(b is None for b in biases):
        return _Linear([], [], pack_weight(stacked(weights), implementation, gated=True), activates=True)
    bias = None
    if any(b is not None for b in biases):
        bias = torch.cat([b if b is not None else w.new_zeros(w.shape[0]) for w, b in zip(weights, biases)])
    # the stacked copy is dropped: only its pack is kept
    return _Linear([], [], pack_weight(stacked(weights), implementation), bias)


def _linear(linears: list[torch.nn.Linear], implementation: str, gated: bool = False) -> _Linear:
    biases = [None if linear.bias is None else linear.bias.detach() for linear in linears]
    return linear_of([linear.weight.detach() for linear in linears], implementation, biases, gated)


@dataclass
class LayerLinears:
    """One decoder layer's linears: q|k|v, o, gate|up (``activates``: it returns silu(gate) * up) and down."""

    qkv: _Linear
    o: _Linear
    gate_up: _Linear
    down: _Linear


class LlamaWeights:
    """The model's linears as the measured backend runs them (stacked, packed where the CPU can)."""

    def __init__(self, model: torch.nn.Module, implementation: str) -> None:
        self.implementation = implementation
        self.key = _weights_key(model)
        with huge_page_arena():  # the brgemm and slab linears' packs side by side on 2 MiB pages (host_memory)
            self.lm_head = _linear([model.lm_head], implementation)
            self.layers = [
                LayerLinears(
                    _linear([layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj], implementation),
                    _linear([layer.self_attn.o_proj], implementation),
                    _linear([layer.mlp.gate_proj, layer.mlp.up_proj], implementation, gated=True),
                    _linear([layer.mlp.down_proj], implementation),
                )
                for layer in model.model.layers
            ]


def _weights_key(model: torch.nn.Module) -> tuple:
    """Changes when any weight does (new storage: a new dtype or device; an in-place write; a module or
    parameter put in another's place). Asked at every step: this walk of the modules' own dicts takes
    ~0.16 ms on the bundled model (272 weights, 397 modules), ``model.parameters()`` ~0.4."""
    params, modules, seen = [], [model], set()
    for module in modules:  # grows as it goes: every submodule once
        if module is not None and id(module) not in seen:
            seen.add(id(module))
            params += module._parameters.values()
            modules += module._modules.values()
    return tuple([(p.data_ptr(), p._version) for p in params if p is not None])


def llama_weights(model: torch.nn.Module, implementation: str) -> LlamaWeights:
    """The model's stacked weights for a linear implementation, made on first use and remade when a weight changed."""
    with _lock:
        by_implementation = _models.setdefault(model, {})
        weights = by_implementation.get(implementation)
        if weights is None or weights.key != _weights_key(model):
            weights = by_implementation[implementation] = LlamaWeights(model, implementation)
        return weights
