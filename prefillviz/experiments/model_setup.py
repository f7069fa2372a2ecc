"""What an experiment is given and what it records about it.

It is given a ``LoadedModel`` or a bare ``(model, tokenizer)`` pair (tests, tiny random
models without a tokenizer); its result names the model id, device and dtype it ran on.
"""

from __future__ import annotations

from typing import Any

from prefillviz.loading.prompts import bench_token_ids
from prefillviz.machine.devices import dtype_name


def model_tokenizer_and_id(loaded_or_pair: Any) -> tuple[Any, Any, str]:
    """(model, tokenizer, model id) from a ``LoadedModel`` or a ``(model, tokenizer)`` pair."""
    if isinstance(loaded_or_pair, tuple):
        model, tokenizer = loaded_or_pair
        return model, tokenizer, getattr(model.config, "name_or_path", "") or type(model).__name__
    return loaded_or_pair.model, loaded_or_pair.tokenizer, loaded_or_pair.model_id


def device_and_dtype(model: Any) -> tuple[str, str]:
    """Where the model's weights are and their dtype, as results record them (``"cpu"``, ``"bfloat16"``)."""
    parameter = next(model.parameters())
    return str(parameter.device), dtype_name(parameter.dtype)


def token_ids_of_length(tokenizer: Any, vocab_size: int, num_tokens: int) -> list[int]:
    """``num_tokens`` ids of real prose (``prompts.BENCH_TEXT``); a fixed id pattern without a tokenizer."""
    if tokenizer is not None:
        return bench_token_ids(tokenizer, num_tokens)
    return [(7 * i + 3) % vocab_size for i in range(num_tokens)]
