"""What one decoder step costs, op by op (``flops.py`` counts it from the model's config).

``OpCost`` is one op's FLOPs and the bytes it must move; ``ModelCost`` is a whole-model step's
ops, with the totals and the arithmetic intensity a roofline plots.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class OpCost:
    """The work of one op of one step: FLOPs and the bytes it must move.

    Attributes:
        name: the op, e.g. ``"q_proj"``, ``"attn_scores"``, ``"mlp_down"``, ``"norms"``.
        flops: floating point operations (attention: causal pairs only, see ``flops.py``).
        weight_bytes: parameter bytes read.
        activation_bytes: activation bytes read and written.
        kv_bytes: K/V cache bytes read (the context) and written (the new tokens).
        kind: ``"linear"``, ``"attention"``, ``"norm"`` or ``"embedding"``.
        flops_non_causal: attention ops only: FLOPs over all N x C pairs, as a dense
            masked kernel computes them; equal to ``flops`` for every other op.
    """

    name: str
    flops: int
    weight_bytes: int
    activation_bytes: int
    kv_bytes: int = 0
    kind: str = "linear"
    flops_non_causal: int | None = None

    def __post_init__(self) -> None:
        if self.flops_non_causal is None:
            self.flops_non_causal = self.flops

    @property
    def bytes(self) -> int:
        """All bytes moved: weights + activations + K/V."""
        return self.weight_bytes + self.activation_bytes + self.kv_bytes

    @property
    def arithmetic_intensity(self) -> float:
        """FLOPs per byte moved (the roofline x axis)."""
        return self.flops / self.bytes if self.bytes else float("inf")


@dataclass
class ModelCost:
    """The cost of one whole-model step of ``num_new_tokens`` tokens at ``context_len``.

    Every decoder layer has the same shape, so ``layer_ops`` holds one layer's ops and the
    totals multiply them by ``num_layers``; ``last_layer_ops``, when set, is the last layer's,
    where the engine runs attention and what follows it for the kept rows only. ``lm_head`` covers
    ``num_logit_rows`` rows only (the engine passes ``logits_to_keep``, so a prefill computes
    logits for its last token).
    """

    num_new_tokens: int
    context_len: int
    dtype_bytes: int
    num_layers: int
    layer_ops: list[OpCost]
    embedding: OpCost
    final_norm: OpCost
    lm_head: OpCost
    num_logit_rows: int = 1
    last_layer_ops: list[OpCost] | None = None

    def _each_layer(self) -> list[list[OpCost]]:
        last = self.last_layer_ops or self.layer_ops
        return [self.layer_ops] * (self.num_layers - 1) + [last] if self.num_layers else []

    def _layers_sum(self, kind: str, attribute: str = "flops") -> int:
        return sum(getattr(op, attribute) for ops in self._each_layer() for op in ops if op.kind == kind)

    @property
    def linear_flops(self) -> int:
        """Projections + MLP over all layers (``2 x matrix params x N`` + bias adds)."""
        return self._layers_sum("linear")

    @property
    def attention_flops(self) -> int:
        """QK^T + PV over all layers, causal pairs only."""
        return self._layers_sum("attention")

    @property
    def attention_flops_non_causal(self) -> int:
        """QK^T + PV over all layers, all N x C pairs (dense masked kernel)."""
        return self._layers_sum("attention", "flops_non_causal")

    @property
    def norm_flops(self) -> int:
        """All norms: two per layer plus the final one."""
        return self._layers_sum("norm") + self.final_norm.flops

    @property
    def all_ops(self) -> list[tuple[str, OpCost]]:
        """Every op of the step in execution order, named like ``layers.3.q_proj``."""
        ops = [("embedding", self.embedding)]
        for layer_index, layer_ops in enumerate(self._each_layer()):
            ops += [(f"layers.{layer_index}.{op.name}", op) for op in layer_ops]
        return ops + [("final_norm", self.final_norm), ("lm_head", self.lm_head)]

    def _all_ops_sum(self, attribute: str) -> int:
        return sum(getattr(op, attribute) for _, op in self.all_ops)

    @property
    def total_flops(self) -> int:
        """Everything counted: linear + attention (causal) + norms + lm_head."""
        return self._all_ops_sum("flops")

    @property
    def total_bytes(self) -> int:
        return self._all_ops_sum("bytes")

    @property
    def arithmetic_intensity(self) -> float:
        """FLOPs per byte of the whole step."""
        return self.total_flops / self.total_bytes
