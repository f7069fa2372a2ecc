"""Engine settings, validated once where they are made.

``EngineConfig`` is the one place the scheduler, the block pool and the KV cache read their
sizes from. An impossible setting fails here with a ``ConfigError`` that says which value is
wrong, before any memory is allocated.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from prefillviz.engine.errors import ConfigError

DEFAULT_KV_CACHE_MEMORY_BYTES = 512 * 1024 * 1024  # 512 MiB: ~11.6k tokens of the bundled model in fp32


@dataclass(frozen=True)
class EngineConfig:
    """How the engine schedules tokens and sizes its paged KV cache.

    Attributes:
        block_size: tokens per KV block (vLLM's default is 16).
        token_budget: most tokens one step may run through the model (vLLM's
            ``max_num_batched_tokens``).
        max_num_running: most requests in the running set at once (``max_num_seqs``).
        enable_chunked_prefill: split a prompt over several steps when it does not fit the
            budget left after decodes. Off means the old behaviour: prefill-first steps that
            run whole prompts and pause every decode.
        enable_prefix_caching: reuse KV blocks of earlier requests with the same prefix.
        kv_cache_memory_bytes: memory budget for the KV cache; the number of blocks follows, capped
            at what max_num_running requests of the model's full context could fill.
        num_blocks: if set, the exact number of KV blocks (overrides the memory budget; tests
            use it for tiny caches that evict).
        max_prompt_tokens: if set, the longest prompt a request may bring (the hosted demo's
            engines set it, ``hosted.HostedPolicy.engine_limits``); None: only the model's
            context and the KV cache limit it.
        max_new_tokens: if set, the most new tokens a request may ask for.
        sparse_prefill_keep_fraction: if set, block-sparse prefill (``sparse_attention.py``, XAttention's
            antidiagonal scoring): a fresh prompt's attention computes only this fraction (0 < f <= 1) of
            each query block's causal key blocks, the sink and the diagonal always among them; 1.0 runs the
            block-sparse path over every block. None: dense attention. Decodes and chunks stay dense.
    """

    block_size: int = 16
    token_budget: int = 2048
    max_num_running: int = 16
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    kv_cache_memory_bytes: int = DEFAULT_KV_CACHE_MEMORY_BYTES
    num_blocks: int | None = None
    max_prompt_tokens: int | None = None
    max_new_tokens: int | None = None
    sparse_prefill_keep_fraction: float | None = None

    def __post_init__(self) -> None:
        positive = {
            "block_size": self.block_size,
            "token_budget": self.token_budget,
            "max_num_running": self.max_num_running,
            "kv_cache_memory_bytes": self.kv_cache_memory_bytes,
        }
        for name in ("num_blocks", "max_prompt_tokens", "max_new_tokens"):
            if getattr(self, name) is not None:
                positive[name] = getattr(self, name)
        for name, value in positive.items():
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"{name} must be a positive whole number, got {value!r}.")
        keep = self.sparse_prefill_keep_fraction
        if keep is not None and (isinstance(keep, bool) or not isinstance(keep, float | int) or not 0 < keep <= 1):
            raise ConfigError(f"sparse_prefill_keep_fraction must be in (0, 1] (or None: dense), got {keep!r}.")

    def kv_blocks(self, kv_bytes_per_token: int, max_context: int | None) -> int:
        """How many KV blocks: ``num_blocks``, or as many as the memory budget holds, never more
        than ``max_num_running`` requests of the model's full context could fill."""
        if self.num_blocks is not None:
            return self.num_blocks
        num_blocks = self.kv_cache_memory_bytes // (kv_bytes_per_token * self.block_size)
        if max_context:
            num_blocks = min(num_blocks, -(-max_context // self.block_size) * self.max_num_running)
        return num_blocks

    def as_dict(self) -> dict:
        return asdict(self)
