"""What names one prompt's run: the model, the prompt, its tokens, the request in the trace.

The Prefill page's ``PrefillResult`` and the inspection views' ``InspectionRun`` both start
with these fields, filled the same way from the engine's request, so one can be made from
the other and a saved bundle reads them back by the same names.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass
class PromptRun:
    """One prompt run on one model.

    Attributes:
        model_id: the model that ran.
        prompt: the prompt text.
        token_ids: the prompt's token ids.
        token_texts: each token decoded on its own.
        request_id: the request inside the run's trace(s).
    """

    model_id: str
    prompt: str
    token_ids: list[int]
    token_texts: list[str]
    request_id: str

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    def prompt_fields(self) -> dict[str, Any]:
        """These fields alone, to build another kind of run of the same prompt (or save them)."""
        return {name: getattr(self, name) for name in PROMPT_FIELDS}


PROMPT_FIELDS = tuple(field.name for field in dataclasses.fields(PromptRun))


def prompt_fields(model_id: str, tokenizer: Any, prompt: str, request: Any) -> dict[str, Any]:
    """``PromptRun``'s fields for an engine request of ``prompt`` (its token ids, each one decoded)."""
    token_ids = list(request.prompt_token_ids)
    return {
        "model_id": model_id,
        "prompt": prompt,
        "token_ids": token_ids,
        "token_texts": [tokenizer.decode([t]) for t in token_ids],
        "request_id": request.request_id,
    }
