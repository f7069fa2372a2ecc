"""The plain Hugging Face forward pass every engine mechanism is checked against (the tests' oracle).

No paged cache, no scheduler: the whole prompt in one call with transformers' own
attention (SDPA), exactly what ``model(input_ids)`` gives any user of the library.
"""

from __future__ import annotations

import torch


@torch.inference_mode()
def hf_last_logits(model: torch.nn.Module, token_ids: list[int]) -> torch.Tensor:
    """Next-token logits after ``token_ids``: (V,) fp32 on CPU."""
    device = next(model.parameters()).device
    input_ids = torch.tensor([token_ids], dtype=torch.long, device=device)
    return model(input_ids=input_ids, logits_to_keep=1).logits[0, -1].float().cpu()


@torch.inference_mode()
def hf_greedy_generate(model: torch.nn.Module, token_ids: list[int], max_new_tokens: int) -> list[int]:
    """The new tokens of ``model.generate`` with greedy decoding (stop tokens ignored)."""
    device = next(model.parameters()).device
    input_ids = torch.tensor([token_ids], dtype=torch.long, device=device)
    output = model.generate(
        input_ids,
        attention_mask=torch.ones_like(input_ids),
        max_new_tokens=max_new_tokens,
        min_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=0,
    )
    return output[0, len(token_ids) :].tolist()
