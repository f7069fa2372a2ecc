"""A Llama-family GGUF file read straight into plain Hugging Face parts: a config, float32 weights, a tokenizer.

transformers' own GGUF load (``from_pretrained(..., gguf_file=...)``) parses the file's metadata three
times (tokenizer, config, weights) and returns a model still marked as quantized. The bundled model
needs neither: this reads the file once, with transformers' own parts,

    file --(integrations.gguf.reader: header, metadata, lazy tensors)--> metadata + raw blocks
    metadata --(integrations.ggml.GGUF_CONFIG_MAPPING, as load_gguf_checkpoint renames it)--> config
    blocks --(integrations.gguf.dequant)--> float32 --(LlamaTensorProcessor: q and k un-permuted,
             get_gguf_hf_weights_map: blk.N.attn_q -> model.layers.N.self_attn.q_proj)--> state dict
    metadata --(integrations.gguf tokenizer converter)--> tokenizer

and ``bundled.py`` saves the parts as a model folder. ``tests/model/test_models.py`` holds all of it equal
to transformers' own GGUF load: the config, every weight, the tokens.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from prefillviz.engine.errors import ModelLoadError

LLAMA_FAMILY = ("llama",)  # the architectures whose tensors LlamaTensorProcessor un-permutes


def read_gguf(path: Path) -> tuple[Any, dict[str, torch.Tensor], Any]:
    """The file's config, float32 weights (under transformers' names) and tokenizer.

    Args:
        path: A GGUF file of a Llama-family model.

    Returns:
        ``(config, state_dict, tokenizer)``: a ``PretrainedConfig`` without a quantization config, the
        dequantized weights (a tied ``lm_head`` is left out, as ``save_pretrained`` leaves it), and a fast
        tokenizer with the file's special tokens and chat template.

    Raises:
        ModelLoadError: The file is not of a Llama-family architecture.
    """
    from transformers.integrations.gguf.reader import GgufHeader, read_gguf_metadata

    metadata, tensor_names = read_gguf_metadata(str(path))
    architecture = metadata["general.architecture"]
    if architecture not in LLAMA_FAMILY:
        raise ModelLoadError(f"{path.name} is a GGUF of architecture {architecture!r}; only Llama's is read here.")
    config = gguf_config(metadata, tensor_names)
    state = gguf_weights(GgufHeader.from_file(str(path)), config)
    return config, state, gguf_tokenizer(path)


def gguf_config(metadata: dict, tensor_names: tuple[str, ...]) -> Any:
    """The config ``load_gguf_checkpoint`` builds for a Llama-family file: its metadata under transformers'
    names, the embeddings tied where the file has no ``output.weight``; and the causal LM class it is for, as
    ``save_pretrained`` writes it."""
    from transformers import AutoConfig
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING as renames
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    values = {"tie_word_embeddings": "output.weight" not in tensor_names}
    for key, value in metadata.items():
        prefix, _, name = key.partition(".")
        renamed = renames.get(prefix, {}).get(name)
        if renamed not in (None, -1):
            values[renamed] = value
    config = AutoConfig.for_model(**values)
    config.architectures = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config.model_type]]
    return config


def gguf_weights(header: Any, config: Any) -> dict[str, torch.Tensor]:
    """Every tensor of the file, dequantized to float32 and renamed; q and k un-permuted (llama.cpp stores their
    rotary halves interleaved)."""
    from transformers import AutoModelForCausalLM
    from transformers.integrations.gguf.dequant import dequantize
    from transformers.integrations.gguf.reader import load_gguf_state_dict
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, get_gguf_hf_weights_map

    processor = TENSOR_PROCESSORS[header.architecture](config=config.to_dict())
    with torch.device("meta"):  # the module tree, for the name map; no memory, no init
        skeleton = AutoModelForCausalLM.from_config(config)
    names = get_gguf_hf_weights_map(skeleton, processor)
    lazy = load_gguf_state_dict(header)
    state = {}
    for info in header.tensors:
        raw = lazy[info.name][...]
        weights = raw if raw.is_floating_point() else dequantize(raw.reshape(-1), info.ggml_type).reshape(info.shape)
        processed = processor.process(weights=weights.float(), name=info.name)
        if processed.name in names:
            state[names[processed.name]] = processed.weights.contiguous()
    return state


def gguf_tokenizer(path: Path) -> Any:
    """The fast tokenizer transformers builds from the file's vocabulary, merges and special tokens (the class
    ``AutoTokenizer`` picks for it, without the config it would first read from the file again)."""
    from transformers import TokenizersBackend

    return TokenizersBackend.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)
