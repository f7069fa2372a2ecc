"""The seam between the engine and the ops a step runs: a ``Backend``, and the textbook one.

The forward (``forward.py``) runs the same loop whatever computes it. Once a step, the runner
asks the engine's backend for the step's ops (``for_step``), so a backend may run other kernels
for a decode than for a long prefill:

    q|k|v, o, gate|up, down, lm_head   the linears: x W^T (gate|up returns silu(gate) * up)
    add_rms_norm                       h += residual; x = RMSNorm(h)
    rope_write_kv                      rotate q and k (RoPE); write k and v into the paged cache
    attention                          each request's queries over its cached and new keys

``TorchBackend`` is the textbook: each op in a few lines of plain torch, on any device and dtype.
``prefillviz/backends/`` holds the measured backend: the same protocol, its kernels chosen by timing
them on the machine at hand (docs/BACKENDS.md). An engine runs the backend passed to it, else the one
``using_backend`` set in this thread, else the model's (``set_model_backend``), else ``TorchBackend``.
"""

from __future__ import annotations

import contextlib
import contextvars
import weakref
from collections.abc import Callable, Iterator
from typing import Protocol

import torch
import torch.nn.functional as F

from prefillviz.engine.kv_cache import empty_kv_cache
from prefillviz.engine.paged_attention import paged_sdpa

Tensor = torch.Tensor
SDPA_ABOUT = "torch SDPA, one call per request"


class StepOps(Protocol):
    """The ops of one step. ``layer`` is a decoder layer's index; x and h are (T, hidden); q (T, H, D),
    k and v (T, KVH, D); ``meta`` is the step's ``attention.AttentionMetadata``."""

    ran: dict[str, str]  # what this step runs, for its ``StepRecord`` (backend, attention, linears)

    def qkv_proj(self, layer: int, x: Tensor) -> Tensor: ...  # [q | k | v]: (T, (H + 2 KVH) D)
    def o_proj(self, layer: int, x: Tensor) -> Tensor: ...
    def gate_up_silu(self, layer: int, x: Tensor) -> Tensor: ...  # silu(x G^T) * (x U^T)
    def down_proj(self, layer: int, x: Tensor) -> Tensor: ...
    def lm_head(self, x: Tensor) -> Tensor: ...
    def add_rms_norm(self, residual: Tensor | None, h: Tensor, norm: torch.nn.Module) -> Tensor: ...  # h += residual
    def rope_write_kv(self, layer: int, qkv: Tensor, cos: Tensor, sin: Tensor, meta) -> tuple: ...  # (q, k, v)
    def attention(self, layer: int, q, k, v, scale: float, meta, keep: Tensor | None = None) -> Tensor: ...  # (T, H D)


class Backend(Protocol):
    name: str

    def prepare(self, model: torch.nn.Module) -> None:
        """Make ready before the first step (the measured backend times its candidates here, never in a step)."""

    def for_step(self, model: torch.nn.Module, meta) -> StepOps:
        """The ops of the step ``meta`` (``attention.AttentionMetadata``) describes."""

    def new_kv_cache(self, num_layers: int, shape: tuple, dtype: torch.dtype, device: torch.device) -> tuple:
        """(K, V): per layer, an uninitialised K and V tensor of ``shape`` (num_blocks, block_size, KVH, D)."""


# ------------------------------------------------------------------------------ the textbook ops
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm: weight * (x * rsqrt(mean(x^2) + eps)).to(dtype), in fp32."""
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def norm_eps(norm: torch.nn.Module) -> float:
    return getattr(norm, "variance_epsilon", None) or getattr(norm, "eps", 1e-6)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' apply_rotary_pos_emb on (T, heads, D) with cos/sin (T, 1, D)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


class TorchStepOps:
    """One step in plain torch: the model's own ``nn.Linear`` modules, RMSNorm in fp32, RoPE, one
    ``index_copy_`` per layer for the K/V write, and ``kernel`` (``paged_sdpa``) for attention."""

    def __init__(self, model: torch.nn.Module, kernel: Callable = paged_sdpa, about: str = SDPA_ABOUT) -> None:
        self.kernel = kernel
        self.ran = {"backend": "torch", "attention": about, "linears": "the model's nn.Linear"}
        self.layers = getattr(getattr(model, "model", None), "layers", None)  # a stock forward calls attention only
        self.head = getattr(model, "lm_head", None)
        config = model.config
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = getattr(config, "num_key_value_heads", None) or self.num_heads

    def qkv_proj(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        attn = self.layers[layer].self_attn
        return torch.cat([attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)], dim=-1)

    def o_proj(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        return self.layers[layer].self_attn.o_proj(x)

    def gate_up_silu(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        mlp = self.layers[layer].mlp
        return F.silu(mlp.gate_proj(x)) * mlp.up_proj(x)

    def down_proj(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        return self.layers[layer].mlp.down_proj(x)

    def lm_head(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x)

    def add_rms_norm(self, residual: Tensor | None, h: Tensor, norm: torch.nn.Module) -> Tensor:
        if residual is not None:
            h.add_(residual)
        return rms_norm(h, norm.weight, norm_eps(norm))

    def rope_write_kv(self, layer: int, qkv: Tensor, cos: Tensor, sin: Tensor, meta) -> tuple:
        H, KVH = self.num_heads, self.num_kv_heads
        rows = qkv.view(qkv.shape[0], H + 2 * KVH, -1)  # (T, H + 2 KVH, D): views, no copy
        qk = rope(rows[:, : H + KVH], cos[:, None], sin[:, None])  # q and k in one call; cos, sin (T, 1, D)
        q, k, v = qk[:, :H], qk[:, H:], rows[:, H + KVH :]
        meta.kv_cache.write(layer, meta.slot_mapping, k, v)  # the KV write: each token into its slot
        return q, k, v

    def attention(self, layer: int, q, k, v, scale: float, meta, keep: Tensor | None = None) -> Tensor:
        return meta.attend(layer, q, k, v, scale, self.kernel, keep)


class TorchBackend:
    """The textbook backend: ``TorchStepOps`` for every step, the KV cache from ``torch.empty``. ``attention``
    (``paged_attention.py``'s signature) and its description: what the steps' attention runs."""

    name = "torch"

    def __init__(self, attention: Callable = paged_sdpa, about: str = SDPA_ABOUT) -> None:
        self.attention, self.about = attention, about

    def prepare(self, model: torch.nn.Module) -> None:
        pass

    def for_step(self, model: torch.nn.Module, meta) -> TorchStepOps:
        return TorchStepOps(model, self.attention, self.about)

    new_kv_cache = staticmethod(empty_kv_cache)


# ------------------------------------------------------------------------------ which backend
_model_backends: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_thread_backend: contextvars.ContextVar[Backend | None] = contextvars.ContextVar("backend", default=None)


def set_model_backend(model: torch.nn.Module, backend: Backend) -> None:
    """The backend engines on ``model`` run unless told otherwise (the product's loader sets the measured one)."""
    _model_backends[model] = backend


@contextlib.contextmanager
def using_backend(backend: Backend | None) -> Iterator[None]:
    """Engines made in this thread inside the block run ``backend`` (None: as outside the block)."""
    token = _thread_backend.set(backend) if backend is not None else None
    try:
        yield
    finally:
        if token is not None:
            _thread_backend.reset(token)


def backend_for(model: torch.nn.Module) -> Backend:
    """The backend an engine on ``model`` runs when none is passed to it."""
    return _thread_backend.get() or _model_backends.get(model) or TorchBackend()
