"""Command line: ``python -m prefillviz run|bench``.

``run`` prefills one prompt on the engine and prints what came out (``--json`` for one JSON
object). ``bench`` prints the benchmark figures as one JSON object (see ``bench.py``).
"""

from __future__ import annotations

import argparse
import json
import sys

from prefillviz.errors import PrefillVizError


def _add_model_arguments(parser: argparse.ArgumentParser) -> None:
    from prefillviz.models import BUNDLED_MODEL_ID

    parser.add_argument("--model", default=BUNDLED_MODEL_ID, help="hub id, local folder, or the bundled default")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps")
    parser.add_argument("--dtype", default="auto", help="auto, float32, bfloat16 or float16")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m prefillviz", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="prefill one prompt and print the first token")
    run.add_argument("--prompt", required=True)
    _add_model_arguments(run)
    run.add_argument("--token-budget", type=int, default=2048, help="tokens per step (1 = token by token)")
    run.add_argument("--block-size", type=int, default=16)
    run.add_argument("--no-prefix-cache", action="store_true")
    run.add_argument("--no-chunking", action="store_true", help="whole-prompt prefill steps")
    run.add_argument("--max-new-tokens", type=int, default=1)
    run.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    run.add_argument("--top-k", type=int, default=0)
    run.add_argument("--top-p", type=float, default=1.0)
    run.add_argument("--seed", type=int, default=None)
    run.add_argument("--json", action="store_true", help="print one JSON object")

    bench = commands.add_parser("bench", help="benchmark the engine against the plain HF forward")
    _add_model_arguments(bench)
    bench.add_argument("--num-tokens", type=int, default=512)
    bench.add_argument("--runs", type=int, default=7, help="timed runs per figure, after warm-up")
    bench.add_argument("--json", action="store_true", help="print one JSON object (the default output)")
    return parser


def run_command(args: argparse.Namespace) -> dict:
    from prefillviz.config import EngineConfig
    from prefillviz.engine.engine import LLMEngine
    from prefillviz.engine.request import SamplingParams
    from prefillviz.models import load_model

    config = EngineConfig(
        block_size=args.block_size,
        token_budget=args.token_budget,
        enable_prefix_caching=not args.no_prefix_cache,
        enable_chunked_prefill=not args.no_chunking,
    )
    loaded = load_model(args.model, device=args.device, dtype=args.dtype, progress=lambda m: print(m, file=sys.stderr))
    engine = LLMEngine(loaded.model, loaded.tokenizer, config, model_id=loaded.model_id)
    params = SamplingParams(
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed
    )
    request = engine.add_request(args.prompt, params)
    trace = engine.run()
    record = trace.requests[request.request_id]
    first_token_id = record.output_token_ids[0]
    return {
        "model": loaded.model_id,
        "device": str(loaded.device),
        "dtype": trace.dtype,
        "num_prompt_tokens": record.num_prompt_tokens,
        "prompt_token_ids": record.prompt_token_ids,
        "first_token": loaded.tokenizer.decode([first_token_id]),
        "first_token_id": first_token_id,
        "time_to_first_token_s": record.time_to_first_token_s,
        "num_steps": trace.num_steps,
    }


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "run":
            result = run_command(args)
            if args.json:
                print(json.dumps(result))
            else:
                for key, value in result.items():
                    print(f"{key}: {value!r}" if key == "first_token" else f"{key}: {value}")
        else:
            from prefillviz.bench import run_bench

            print(json.dumps(run_bench(args.model, args.device, args.dtype, args.num_tokens, args.runs), indent=2))
    except PrefillVizError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0
