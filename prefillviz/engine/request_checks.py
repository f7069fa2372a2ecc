"""What a request must satisfy before an engine queues it: one place for every engine entry
(``LLMEngine.add_request``, ``add_prefilled_request``), each failure a ``RequestError`` in words."""

from __future__ import annotations

from collections.abc import Container

from prefillviz.engine.config import EngineConfig
from prefillviz.engine.errors import RequestError
from prefillviz.engine.request import SamplingParams


def check_prompt_text(prompt: str) -> None:
    """Raise ``RequestError`` for a text prompt of nothing but whitespace (before any model is loaded)."""
    if not prompt.strip():
        raise RequestError("The prompt is empty: type some text to run the model on.")


def check_context(num_prompt_tokens: int, max_new_tokens: int, max_context: int | None, model_name: str = "this model"):
    """Raise ``RequestError`` when the prompt and its new tokens pass the model's context (None: no
    limit known). ``check_request`` runs it in the engine; the CLI runs it before building one."""
    total = num_prompt_tokens + max_new_tokens
    if not max_context or total <= max_context:
        return
    if num_prompt_tokens < max_context:
        fix = f"Ask for at most {max_context - num_prompt_tokens:,} new tokens, or shorten the prompt."
    else:
        fix = "Shorten the prompt."
    raise RequestError(
        f"The prompt has {num_prompt_tokens:,} tokens; with {max_new_tokens:,} new token(s) that is {total:,}, "
        f"more than {model_name}'s context of {max_context:,} tokens. {fix}"
    )


def check_request(
    request_id: str, token_ids: list[int], params: SamplingParams, config: EngineConfig, vocab_size: int,
    max_context: int | None, num_blocks: int, known_request_ids: Container[str],
) -> None:
    """Raise ``RequestError`` for an empty prompt, a duplicate id, impossible sampling, unknown token ids,
    the hosted limits, a prompt past the model's context, or one the KV cache can't hold."""
    if not token_ids:
        raise RequestError("The prompt is empty: it has no tokens.")
    if request_id in known_request_ids:
        raise RequestError(f"A request named {request_id!r} already exists.")
    if params.max_new_tokens < 1:
        raise RequestError(f"max_new_tokens must be at least 1, got {params.max_new_tokens}.")
    if params.temperature < 0 or not 0 < params.top_p <= 1 or params.top_k < 0:
        raise RequestError("Sampling needs temperature >= 0, 0 < top_p <= 1 and top_k >= 0.")
    if min(token_ids) < 0 or max(token_ids) >= vocab_size:
        raise RequestError(f"Token ids must lie in 0..{vocab_size - 1}.")
    max_prompt, max_new = config.max_prompt_tokens, config.max_new_tokens
    too_long = max_prompt is not None and len(token_ids) > max_prompt
    if too_long or (max_new is not None and params.max_new_tokens > max_new):
        limits = [f"prompts of up to {max_prompt:,} tokens"] * (max_prompt is not None)
        limits += [f"{max_new} new tokens"] * (max_new is not None)
        raise RequestError(f"This engine serves {' and '.join(limits)}; this one has {len(token_ids):,} "
                           f"and asks for {params.max_new_tokens}.")
    check_context(len(token_ids), params.max_new_tokens, max_context)
    total = len(token_ids) + params.max_new_tokens
    capacity = num_blocks * config.block_size
    if total > capacity:
        raise RequestError(
            f"The prompt needs {total:,} token slots but the KV cache holds {capacity:,} "
            f"({num_blocks} blocks of {config.block_size}). Shorten the prompt or raise the KV memory budget."
        )
