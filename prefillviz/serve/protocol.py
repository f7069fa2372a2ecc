"""An OpenAI request body -> one checked ``Generation``, or a ``BadRequest`` that names the field.

Accepts what the OpenAI SDK and vLLM's benchmark client send (``vllm bench serve``: ``repetition_penalty``
1.0, ``logprobs`` null, ``ignore_eos``, ``stream_options.include_usage``). What the engine cannot do (several
choices, penalties, log-probabilities, stop strings) is refused with a 400 that says so, never ignored.
OpenAI's ``user`` (a caller's own tag for whoever sent the request) is kept with the request: the live record
names each request by it (the Live engine page's *Send* tags a class room's students so).
The engine's own checks (context, KV capacity) run after this, in ``EngineLoop.check``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from prefillviz.engine.request import SamplingParams

COMPLETION, CHAT = "completion", "chat"
DEFAULT_COMPLETION_TOKENS = 16  # OpenAI's default max_tokens for /v1/completions
MAX_USER_CHARS = 128  # a tag, not a document: the live record keeps one per request


class BadRequest(Exception):
    """A request the server refuses with a 400 (``param``: the field at fault, as OpenAI names it)."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message, self.param, self.code = message, param, code


@dataclass(frozen=True)
class Generation:
    """What one request asks the engine for."""

    kind: str  # COMPLETION or CHAT
    model: str
    prompt_token_ids: list[int]
    params: SamplingParams
    stream: bool
    include_usage: bool  # stream_options.include_usage: a last chunk with the usage
    return_token_ids: bool = False  # vLLM's extension: the prompt's and each choice's token ids in the answer
    user: str | None = None  # OpenAI's ``user``: who sent it, as the caller tags it ("student 7")


def _number(body: dict, name: str, default: float, low: float, high: float, low_open: bool = False) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise BadRequest(f"{name} must be a number, got {value!r}.", name)
    if value < low or value > high or (low_open and value == low):
        raise BadRequest(f"{name} must be in {'(' if low_open else '['}{low}, {high}], got {value}.", name)
    return float(value)


def _whole(body: dict, name: str, default: int | None, low: int) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{name} must be a whole number, got {value!r}.", name)
    if value < low:
        raise BadRequest(f"{name} must be at least {low}, got {value}.", name)
    return value


def _flag(body: dict, name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise BadRequest(f"{name} must be true or false, got {value!r}.", name)
    return value


def _user(body: dict) -> str | None:
    """OpenAI's ``user``: a short string, or absent (an empty one counts as absent)."""
    value = body.get("user")
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > MAX_USER_CHARS:
        raise BadRequest(f"user must be a string of at most {MAX_USER_CHARS} characters, got {str(value)[:40]!r}.",
                         "user")
    return value.strip() or None


def _refuse_unsupported(body: dict) -> None:
    """Fields the engine can't honour: a 400 unless they ask for the default."""
    if _whole(body, "n", 1, 1) != 1:
        raise BadRequest("This server samples one choice per request: n must be 1.", "n")
    if body.get("best_of") not in (None, 1):
        raise BadRequest("This server samples one choice per request: best_of must be 1.", "best_of")
    for name, neutral in (("repetition_penalty", 1.0), ("presence_penalty", 0.0), ("frequency_penalty", 0.0)):
        if _number(body, name, neutral, -2.0, 2.0 if name != "repetition_penalty" else 1e9) != neutral:
            raise BadRequest(f"This engine applies no penalties: {name} must be {neutral}.", name)
    if body.get("logprobs") not in (None, False, 0) or body.get("top_logprobs") not in (None, 0):
        raise BadRequest("This server does not return log-probabilities: leave logprobs out.", "logprobs")
    if body.get("stop") not in (None, "", []):
        raise BadRequest("This server stops on token ids only (stop_token_ids, the end-of-text token): "
                         "leave stop out.", "stop")
    if _flag(body, "echo"):
        raise BadRequest("echo is not supported: the response holds the new text only.", "echo")
    if _whole(body, "min_tokens", 0, 0) != 0:
        raise BadRequest("min_tokens is not supported: leave it out or 0.", "min_tokens")


def completion_prompt(body: dict, tokenizer) -> list[int]:
    """``prompt``: a string, a list of token ids, or a list holding one of those."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt.strip():
            raise BadRequest("The prompt is empty: send some text.", "prompt")
        return list(tokenizer(prompt)["input_ids"])
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return list(prompt)
    if isinstance(prompt, list) and len(prompt) > 1:
        raise BadRequest("Send one prompt per request (a batch of prompts is not supported).", "prompt")
    raise BadRequest("prompt must be a non-empty string or a list of token ids.", "prompt")


def _message_text(message: object, index: int) -> tuple[str, str]:
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise BadRequest(f"messages[{index}] must be an object with a role and content.", "messages")
    content = message.get("content")
    if isinstance(content, list):  # content parts: only text ones
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
            raise BadRequest(f"messages[{index}].content: only text parts are supported.", "messages")
        content = "".join(part["text"] for part in content)
    if not isinstance(content, str):
        raise BadRequest(f"messages[{index}].content must be a string.", "messages")
    return message["role"], content


def chat_prompt(body: dict, tokenizer) -> list[int]:
    """``messages`` through the model's chat template, ready for the assistant's answer."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list.", "messages")
    turns = [_message_text(message, i) for i, message in enumerate(messages)]
    if not any(content.strip() for _, content in turns):
        raise BadRequest("The messages are empty: send some text.", "messages")
    if not getattr(tokenizer, "chat_template", None):
        raise BadRequest("This model has no chat template: use /v1/completions.", "messages")
    encoded = tokenizer.apply_chat_template([{"role": r, "content": c} for r, c in turns], add_generation_prompt=True,
                                            tokenize=True)
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


def parse_generation(body: object, kind: str, served_models: list[str], tokenizer, max_context: int | None,
                     eos_token_id: int | None) -> Generation:
    """Check an OpenAI request body and turn it into a ``Generation``.

    Args:
        body: the decoded JSON body.
        kind: ``COMPLETION`` (/v1/completions) or ``CHAT`` (/v1/chat/completions).
        served_models: the names this server answers to (the first is the default).
        tokenizer: the model's tokenizer (prompts are tokenized here, so their length can be checked).
        max_context: the model's context; a chat with no max_tokens may fill it.
        eos_token_id: where generation stops unless ``ignore_eos``.

    Raises:
        BadRequest: the first thing wrong with the body.
    """
    if not isinstance(body, dict):
        raise BadRequest("The body must be a JSON object.")
    model = body.get("model") or served_models[0]
    if model not in served_models:
        raise BadRequest(f"The model `{model}` does not exist: this server serves {served_models[0]!r}.", "model",
                         "model_not_found")
    _refuse_unsupported(body)
    stream = _flag(body, "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict) or (options and not stream):
        raise BadRequest("stream_options is only allowed with stream: true, as an object.", "stream_options")
    include_usage = _flag(options, "include_usage")
    prompt = completion_prompt(body, tokenizer) if kind == COMPLETION else chat_prompt(body, tokenizer)
    name = "max_completion_tokens" if kind == CHAT and body.get("max_completion_tokens") is not None else "max_tokens"
    default = DEFAULT_COMPLETION_TOKENS if kind == COMPLETION else max(1, (max_context or 0) - len(prompt))
    max_tokens = _whole(body, name, default, 1)
    stop_ids = body.get("stop_token_ids") or []
    if not isinstance(stop_ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in stop_ids):
        raise BadRequest("stop_token_ids must be a list of token ids.", "stop_token_ids")
    if eos_token_id is not None and not _flag(body, "ignore_eos"):
        stop_ids = [*stop_ids, eos_token_id]
    top_k = _whole(body, "top_k", 0, -1)
    params = SamplingParams(
        max_new_tokens=max_tokens,
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_k=max(top_k, 0),  # vLLM's -1 and our 0 both mean no cut
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0, low_open=True),
        seed=_whole(body, "seed", None, 0),
        stop_token_ids=tuple(stop_ids),
    )
    return Generation(kind, model, prompt, params, stream, include_usage, _flag(body, "return_token_ids"), _user(body))
