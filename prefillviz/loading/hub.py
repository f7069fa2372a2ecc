"""Loading a local folder or a Hugging Face Hub id: from the folder, the local HF cache, or a download.

Remote code is never run (``trust_remote_code=False``, explicitly, which also stops transformers
prompting on stdin). Only causal LMs whose attention goes through transformers'
``AttentionInterface`` are accepted. Without network an uncached hub id is refused at once,
with a message, instead of a long timeout.
"""

from __future__ import annotations

import os
import re
import socket
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch

from prefillviz.engine.errors import ModelLoadError
from prefillviz.machine.progress import MessageProgress

_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?$")


def load_pretrained(
    model_id: str, device: torch.device, dtype: torch.dtype, report: MessageProgress
) -> tuple[Any, Any, str]:
    folder = Path(model_id).expanduser()
    if folder.is_dir():
        source, location, local_only = "local folder", str(folder), True
        report(f"loading {model_id} from the local folder")
    elif folder.exists() or not _HUB_ID.match(model_id):
        raise ModelLoadError(
            f"{model_id!r} is neither a model folder on this machine nor a Hugging Face Hub id (like 'org/name')."
        )
    elif _in_hub_cache(model_id):
        source, location, local_only = "hub cache", model_id, True
        report(f"loading {model_id} from the Hugging Face cache")
    else:
        source, location, local_only = "hub download", model_id, False
        _require_network(model_id)
        report(f"looking up {model_id} on the Hugging Face Hub")
    config = _read_config(model_id, location, local_only)

    model_class = _causal_lm_class(model_id, config)
    kwargs: dict[str, Any] = {"dtype": dtype, "config": config}
    if model_class._supports_sdpa:
        kwargs["attn_implementation"] = "sdpa"
    if device.type != "cpu":
        kwargs["device_map"] = device  # load straight onto the accelerator
    if not local_only:
        report(f"downloading {model_id} from the Hugging Face Hub (first use)")
    try:
        model = model_class.from_pretrained(location, local_files_only=local_only, **kwargs)
    except OSError as exc:
        if source != "hub cache":
            raise _hub_error(model_id, exc) from exc
        # the config was cached but not the weights
        _require_network(model_id)
        source, local_only = "hub download", False
        report(f"downloading {model_id} from the Hugging Face Hub (first use)")
        model = model_class.from_pretrained(location, **kwargs)
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(location, local_files_only=local_only, trust_remote_code=False)
    except Exception as exc:
        raise ModelLoadError(f"{model_id!r} has no usable tokenizer: {type(exc).__name__}: {exc}") from exc
    return model, tokenizer, source


def _in_hub_cache(model_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(model_id, "config.json"), str)
    except Exception:  # an id the hub library rejects is not cached either
        return False


def _read_config(model_id: str, location: str, local_only: bool) -> Any:
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(location, local_files_only=local_only, trust_remote_code=False)
    except OSError as exc:
        raise _hub_error(model_id, exc) from exc
    except ValueError as exc:
        if "trust_remote_code" in str(exc):
            raise ModelLoadError(
                f"{model_id!r} needs custom code from its repository, which prefillviz never runs; "
                "choose a model that transformers supports natively."
            ) from exc
        raise


def _hub_error(model_id: str, exc: OSError) -> ModelLoadError:
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    cause = exc
    while cause is not None and not isinstance(cause, RepositoryNotFoundError):
        cause = cause.__cause__ or cause.__context__
    if isinstance(cause, GatedRepoError):
        return ModelLoadError(
            f"{model_id!r} is a gated model: accept its license on huggingface.co and log in with `hf auth login`."
        )
    if cause is not None or "is not a valid model identifier" in str(exc):
        return ModelLoadError(
            f"Model {model_id!r} was not found on the Hugging Face Hub: check the spelling "
            "(if it is a private repository, log in with `hf auth login`)."
        )
    return ModelLoadError(f"Could not load {model_id!r}: {exc}")


def _causal_lm_class(model_id: str, config: Any) -> Any:
    """Returns the transformers class for the config, if prefillviz can instrument it."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING,
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    causal_names = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
    architectures = getattr(config, "architectures", None) or []
    is_encoder = config.model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES and not getattr(config, "is_decoder", False)
    if (
        type(config) not in MODEL_FOR_CAUSAL_LM_MAPPING
        or getattr(config, "is_encoder_decoder", False)
        or is_encoder
        or (architectures and not causal_names.intersection(architectures))
    ):
        described = ", ".join(architectures) or config.model_type
        raise ModelLoadError(
            f"{model_id!r} ({described}) is not a causal language model; prefillviz needs a decoder-only "
            "text generator such as Llama, Qwen2, Mistral, GPT-2 or Phi."
        )
    model_class = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    # Models that route attention through transformers' AttentionInterface (and pass its
    # kwargs all the way down) declare it with this flag; prefillviz hooks in there.
    if not getattr(model_class, "_supports_attention_backend", False):
        raise ModelLoadError(
            f"{model_id!r} is a causal LM ({model_class.__name__}), but its attention can't be instrumented: "
            "it doesn't go through transformers' AttentionInterface. Try a Llama, Qwen2, Mistral, GPT-2 or Phi model."
        )
    return model_class


def _require_network(model_id: str) -> None:
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "").lower() in {"1", "true", "yes", "on"}:
        raise ModelLoadError(
            f"Model {model_id!r} isn't in the local Hugging Face cache and HF_HUB_OFFLINE is set, "
            "so it can't be downloaded. Unset HF_HUB_OFFLINE, or use the bundled model or a local folder."
        )
    if not _hub_reachable(constants.ENDPOINT):
        raise ModelLoadError(
            f"Model {model_id!r} isn't in the local Hugging Face cache and there is no network to download it "
            f"({urlparse(constants.ENDPOINT).hostname} is unreachable). Connect once, or use the bundled model "
            "or a local folder."
        )


def _hub_reachable(endpoint: str, timeout: float = 3.0) -> bool:
    """Opens (and closes) one TCP connection to the hub; bounded even if DNS hangs."""
    url = urlparse(endpoint)
    address = (url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443))
    done, reached = threading.Event(), []

    def probe() -> None:
        try:
            socket.create_connection(address, timeout=timeout).close()
            reached.append(True)
        except OSError:
            pass
        done.set()

    threading.Thread(target=probe, daemon=True).start()
    done.wait(timeout + 0.5)
    return bool(reached)
