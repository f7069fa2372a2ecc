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
    """How the engine schedules tokens and sizes its paged KV cache (vLLM's names in brackets)."""

    block_size: int = 16  # tokens per KV block (vLLM's default)
    token_budget: int = 2048  # most tokens one step runs through the model (max_num_batched_tokens)
    max_num_running: int = 16  # most requests in the running set at once (max_num_seqs)
    # split a prompt over steps where it does not fit the budget left after decodes; off: the old
    # prefill-first steps, which run whole prompts and pause every decode
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True  # reuse the KV blocks of earlier requests with the same prefix
    # the KV cache's memory; the number of blocks follows, capped at max_num_running full contexts
    kv_cache_memory_bytes: int = DEFAULT_KV_CACHE_MEMORY_BYTES
    num_blocks: int | None = None  # exactly this many blocks, whatever the memory (tests' tiny caches)
    max_prompt_tokens: int | None = None  # the longest prompt (the hosted demo's limit); None: context, cache
    max_new_tokens: int | None = None  # the most new tokens a request may ask for

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
