"""The exceptions a user of prefillviz can see: each a ``PrefillVizError`` whose message says what went wrong
and what to do about it (the pages and the CLI catch this one type to show it)."""


class PrefillVizError(Exception):
    """Base class: a problem the user can understand and act on."""


class ModelLoadError(PrefillVizError):
    """The model could not be loaded (unknown id, no network, not a causal LM, unsupported architecture)."""


class ConfigError(PrefillVizError):
    """An engine setting is impossible (block_size <= 0, token_budget <= 0, ...)."""


class RequestError(PrefillVizError):
    """A request can't be served (empty prompt, longer than the context or the KV capacity)."""


class OutOfMemory(PrefillVizError):
    """A run needed more memory than the device (GPU or CPU) had; its requests were freed."""


def is_out_of_memory(error: BaseException) -> bool:
    """CUDA/MPS out-of-memory errors, and the CPU allocator's failure (a plain RuntimeError)."""
    import torch  # not at import time: the UI reads these errors before torch is loaded

    message = str(error)
    out_of_memory = "can't allocate memory" in message or "out of memory" in message.lower()
    return isinstance(error, torch.OutOfMemoryError) or (isinstance(error, RuntimeError) and out_of_memory)


class ProbeError(PrefillVizError):
    """The server could not be probed: unreachable, not OpenAI-compatible, stalled, or junk."""
