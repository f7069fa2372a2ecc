"""Prompt processing of the bundled model: our engine against llama.cpp, in one run.

llama.cpp runs the bundled GGUF file itself (SmolLM2-135M-Instruct, Q4_1 weights) and an F32
copy of it that llama.cpp's own quantize tool writes once into ``$PREFILLVIZ_CACHE/peers/``
(dequantized, the same numbers our loader gets). Our engine runs the same model in bf16 and
in fp32. All of them prefill the same N token ids (the bench prompt,
``prefillviz.loading.prompts.bench_token_ids``) in one pass, with the same number of threads; the
runs alternate after a warm-up and the medians and spreads are printed as JSON.

Needs llama-cpp-python, which is not a dependency (it compiles llama.cpp, several minutes):

    .venv/bin/pip install llama-cpp-python
    .venv/bin/python scripts/peer_llamacpp.py [--num-tokens 512] [--runs 7]

Without it the script says so and exits with status 2.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from prefillviz.engine.config import EngineConfig  # noqa: E402
from prefillviz.engine.engine import LLMEngine  # noqa: E402
from prefillviz.engine.request import SamplingParams  # noqa: E402
from prefillviz.loading.bundled import bundled_cache_dir, bundled_gguf  # noqa: E402
from prefillviz.loading.model_registry import BUNDLED_MODEL_ID  # noqa: E402
from prefillviz.loading.models import load_model  # noqa: E402
from prefillviz.loading.prompts import bench_token_ids  # noqa: E402
from prefillviz.machine.devices import machine_name  # noqa: E402


def f32_copy(llama_cpp, gguf: Path) -> Path:
    """The bundled GGUF dequantized to F32 by llama.cpp's quantize tool (made once, cached)."""
    target = bundled_cache_dir().parent / "peers" / gguf.name.replace("Q4_1", "F32")
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype, params.allow_requantize = llama_cpp.LLAMA_FTYPE_ALL_F32, True
        if llama_cpp.llama_model_quantize(str(gguf).encode(), str(target).encode(), ctypes.byref(params)) != 0:
            raise RuntimeError(f"llama.cpp could not write {target}")
    return target


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-tokens", type=int, default=512)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    try:
        import llama_cpp
    except ImportError:
        print("error: llama-cpp-python is not installed (.venv/bin/pip install llama-cpp-python)", file=sys.stderr)
        return 2
    threads = torch.get_num_threads()
    gguf = bundled_gguf()
    models = {dtype: load_model(BUNDLED_MODEL_ID, device="cpu", dtype=dtype) for dtype in ("bfloat16", "float32")}
    token_ids = bench_token_ids(models["float32"].tokenizer, args.num_tokens)

    def ours(loaded):
        def run() -> float:
            engine = LLMEngine(loaded.model, loaded.tokenizer, EngineConfig(token_budget=args.num_tokens),
                               model_id=loaded.model_id)
            engine.add_request(token_ids, SamplingParams(max_new_tokens=1))
            start = time.perf_counter()
            engine.run()
            return time.perf_counter() - start

        return run

    def peer(path: Path):
        llm = llama_cpp.Llama(
            model_path=str(path), n_ctx=args.num_tokens + 16, n_batch=args.num_tokens, n_ubatch=args.num_tokens,
            n_threads=threads, n_threads_batch=threads, verbose=False,
        )

        def run() -> float:
            llm.reset()  # forget the previous prompt: no cached prefix is reused
            start = time.perf_counter()
            llm.eval(token_ids)  # one prompt-processing pass over all N tokens (n_batch = N)
            return time.perf_counter() - start

        return run

    contestants = {
        "ours bf16": ours(models["bfloat16"]),
        "ours fp32": ours(models["float32"]),
        f"llama.cpp {gguf.name}": peer(gguf),
        "llama.cpp F32 copy": peer(f32_copy(llama_cpp, gguf)),
    }
    times: dict[str, list[float]] = {name: [] for name in contestants}
    for run in range(2 + args.runs):  # two warm-ups, then interleaved timed runs
        for name, fn in contestants.items():
            seconds = fn()
            if run >= 2:
                times[name].append(seconds)
    figures = {
        name: {"tok_s": args.num_tokens / statistics.median(t), "median_s": statistics.median(t), "min_s": min(t),
               "max_s": max(t)}
        for name, t in times.items()
    }
    best_peer = max(v["tok_s"] for k, v in figures.items() if k.startswith("llama.cpp"))
    print(json.dumps({
        "machine": machine_name("cpu"), "threads": threads, "num_tokens": args.num_tokens, "runs": args.runs,
        "llama_cpp_version": getattr(llama_cpp, "__version__", "?"), "figures": figures,
        "ours_bf16_over_best_llama_cpp": figures["ours bf16"]["tok_s"] / best_peer,
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
