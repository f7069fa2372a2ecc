"""Command line: ``python -m prefillviz run|trace|bench|kernels|tune|probe-server|replay|sparse|wall|serve``.

``run`` prefills one prompt on the engine and prints what came out (``--json`` for one JSON
object). ``trace`` runs it at a capture level and writes the trace (JSON + NPZ) to a folder.
``bench`` prints the benchmark figures as one JSON object (see ``bench.py``). ``kernels``
prints the attention-kernel benchmark, time and peak memory vs N for every kernel in
``prefillviz/kernels/`` (see ``experiments/kernel_bench.py``). ``probe-server`` measures an
OpenAI-compatible server from outside (see ``probe/``); ``serve`` is one, around the engine
(``serve/``). ``tune`` times the engine's
candidate implementations on this machine and prints the measured dispatch
(``backends/dispatch.py``); ``--again`` measures even when a fresh table is cached. ``replay``
records prefill, chunked prefill and a prefix hit and writes one offline HTML file that plays them
(``figures/replay/``). ``sparse`` compares block-sparse prefill with dense on a long prompt, ``wall``
times attention, the linears and the rest of a prefill as N grows (``measure/long_prompts.py``).

Every size option is checked before the work starts (against the model's context right after it
loads): a bad one is one ``error:`` line naming the option, the value and the limit, exit status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from prefillviz.cli_checks import at_least, check_bench_sizes, check_context_of, check_long_prompt_options, option_named
from prefillviz.cli_parser import build_parser
from prefillviz.engine.errors import ConfigError, PrefillVizError
from prefillviz.instrument.capture import run_captured
from prefillviz.measure.kernel_bench import SHAPES


def disagg_command(args: argparse.Namespace) -> dict:
    from prefillviz.disagg.experiment import compare_setups
    from prefillviz.engine.config import EngineConfig
    from prefillviz.experiments.chunked import build_workload
    from prefillviz.loading.models import load_model

    with option_named(f"--token-budget {args.token_budget}"):
        EngineConfig(token_budget=args.token_budget)  # the workload's engines' own check, before the model loads
    handover = "the prefill worker makes the first token, the decode worker the rest"
    for option, value, minimum, meaning in (
        ("--num-short", args.num_short, 0, "short requests decoding when the long prompt arrives"),
        ("--short-prompt-tokens", args.short_prompt_tokens, 1, "a prompt needs a token"),
        ("--short-new-tokens", args.short_new_tokens, 2, handover),
        ("--long-prompt-tokens", args.long_prompt_tokens, 1, "a prompt needs a token"),
        ("--long-new-tokens", args.long_new_tokens, 2, handover),
        ("--arrival-step", args.arrival_step, 0, "engine steps before the long prompt arrives"),
    ):
        at_least(option, value, minimum, meaning)
    loaded = load_model(args.model, device=args.device, dtype=args.dtype, progress=lambda m: print(m, file=sys.stderr))
    context = loaded.info.max_context or 0
    requests = [("long", args.long_prompt_tokens, args.long_new_tokens)]
    requests += [("short", args.short_prompt_tokens, args.short_new_tokens)] * (args.num_short > 0)
    for kind, prompt_tokens, new_tokens in requests:  # each within the context, before any engine runs
        what, total = (f"the {kind} request is {prompt_tokens:,} prompt + {new_tokens:,} new tokens",
                       prompt_tokens + new_tokens)
        if prompt_tokens >= new_tokens:  # the larger part is the one to cut
            check_context_of(f"--{kind}-prompt-tokens", prompt_tokens, what, total, context - new_tokens, loaded)
        else:
            check_context_of(f"--{kind}-new-tokens", new_tokens, what, total, context - prompt_tokens, loaded)
    workload = build_workload(
        loaded.tokenizer, args.num_short, args.short_prompt_tokens, args.short_new_tokens, args.long_prompt_tokens,
        args.long_new_tokens, args.arrival_step, args.token_budget,
    )
    return compare_setups(loaded, workload).as_json()


def _run_prompt(args: argparse.Namespace, capture_level: str = "none", profile_dir: str | None = None):
    """Load the model, prefill ``args.prompt`` on a fresh engine; returns (loaded model, trace, request id)."""
    from prefillviz.engine.config import EngineConfig
    from prefillviz.engine.engine import LLMEngine
    from prefillviz.engine.request import SamplingParams
    from prefillviz.engine.request_checks import check_context, check_prompt_text
    from prefillviz.loading.models import load_model

    check_prompt_text(args.prompt)  # at once, not after loading the model
    at_least("--max-new-tokens", args.max_new_tokens, 1, "the prefill samples the first token")
    with option_named(f"--token-budget {args.token_budget}, --block-size {args.block_size}"):
        config = EngineConfig(
            block_size=args.block_size,
            token_budget=args.token_budget,
            enable_prefix_caching=not args.no_prefix_cache,
            enable_chunked_prefill=not args.no_chunking,
        )
    loaded = load_model(args.model, device=args.device, dtype=args.dtype, progress=lambda m: print(m, file=sys.stderr))
    num_prompt_tokens, context = len(loaded.tokenizer(args.prompt)["input_ids"]), loaded.info.max_context
    with option_named(f"--max-new-tokens {args.max_new_tokens}" if not context or num_prompt_tokens < context
                      else "--prompt"):
        # before the engine, which may first measure its dispatch
        check_context(num_prompt_tokens, args.max_new_tokens, context, loaded.model_id)
    engine = LLMEngine(loaded.model, loaded.tokenizer, config, model_id=loaded.model_id, backend=backend_of(args))
    params = SamplingParams(
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
        seed=args.seed
    )
    request = engine.add_request(args.prompt, params)
    return loaded, run_captured(engine, capture_level=capture_level, profile_dir=profile_dir), request.request_id


def packs_weights(args: argparse.Namespace) -> bool:
    """Whether ``run``/``trace`` pre-pack the linears: packing (a copy of every weight) pays off over many steps,
    not one."""
    return args.backend == "measured" and (args.pack_weights == "on"
                                           or (args.pack_weights == "auto" and args.max_new_tokens > 1))


def backend_of(args: argparse.Namespace):
    """The backend ``--backend`` and ``--pack-weights`` ask for."""
    from prefillviz.backends.measured import MEASURED, STOCK_LINEARS
    from prefillviz.engine.backend import TorchBackend

    if args.backend == "torch":
        return TorchBackend()
    return MEASURED if packs_weights(args) else STOCK_LINEARS


def run_command(args: argparse.Namespace) -> dict:
    from prefillviz.backends.dispatch_tables import summary as dispatch_summary
    from prefillviz.backends.labels import forward_label
    from prefillviz.backends.packed_weights import linear_weights_label
    from prefillviz.measure.dtype_speed import dtype_speed

    loaded, trace, request_id = _run_prompt(args)
    record = trace.requests[request_id]
    first_token_id = record.output_token_ids[0]
    result = {
        "model": loaded.model_id,
        "device": str(loaded.device),
        "dtype": trace.dtype,
        "num_prompt_tokens": record.num_prompt_tokens,
        "prompt_token_ids": record.prompt_token_ids,
        "first_token": loaded.tokenizer.decode([first_token_id]),
        "first_token_id": first_token_id,
        "time_to_first_token_s": record.time_to_first_token_s,
        "num_steps": trace.num_steps,
        "backend": args.backend,
        "linear_layers": linear_weights_label(loaded.model, with_reason=True) if packs_weights(args) else
        "stock linear layers (--backend torch, --pack-weights off, or auto with one forward)",
        "forward": forward_label(loaded.model, backend_of(args), with_reason=True),
        "dispatch": dispatch_summary(loaded.model, trace) if args.backend == "measured" else None,
        "dtype_note": "",
    }
    # asked for a 16-bit dtype: is it slow here?
    if args.dtype not in ("auto", "float32") and loaded.device.type == "cpu":
        # measured after the first token, not in its time
        result["dtype_note"] = dtype_speed(loaded.device, loaded.dtype).note()
    return result


def tune_command(args: argparse.Namespace) -> dict:
    from prefillviz.backends.dispatch_tables import summary as dispatch_summary
    from prefillviz.backends.dispatch_tables import table_for
    from prefillviz.loading.models import load_model

    loaded = load_model(args.model, device=args.device, dtype=args.dtype, progress=lambda m: print(m, file=sys.stderr))
    table = table_for(loaded.model, refresh=args.again,
                      progress=lambda done, what: print(f"{done:4.0%} {what}", file=sys.stderr))
    return {"model": loaded.model_id, "device": str(loaded.device), "dtype": table.dtype, "source": table.source,
            "measure_s": table.measure_s, **dispatch_summary(loaded.model)}


def trace_command(args: argparse.Namespace) -> dict:
    from prefillviz.instrument.trace_io import save_trace, writable_folder

    with option_named(f"--out {args.out}"):
        writable_folder(args.out)  # before the model loads: a folder that can't be written is the user's to change
    _, trace, request_id = _run_prompt(args, capture_level=args.level, profile_dir=args.out)
    directory = save_trace(trace, args.out)
    return {
        "out": str(directory),
        "files": sorted(p.name for p in directory.iterdir()),
        "capture_level": trace.capture_level,
        "num_steps": trace.num_steps,
        "num_prompt_tokens": trace.requests[request_id].num_prompt_tokens,
    }


def replay_command(args: argparse.Namespace) -> dict:
    import time

    from prefillviz.experiments.replay_runs import check_num_tokens, record_replay
    from prefillviz.figures.replay.build import replay_payload
    from prefillviz.figures.replay.page import check_writable, replay_html, write_replay
    from prefillviz.loading.models import load_model

    started = time.perf_counter()
    with option_named(f"--tokens {args.tokens}"):
        check_num_tokens(args.tokens)  # before the model loads; its context is checked right after
    with option_named(f"--out {args.out}"):
        check_writable(args.out)
    loaded = load_model(args.model, device=args.device, dtype=args.dtype, progress=lambda m: print(m, file=sys.stderr))
    with option_named(f"--tokens {args.tokens}"):
        runs = record_replay(loaded, args.tokens, lambda done, what: print(f"{done:4.0%} {what}", file=sys.stderr))
    payload = replay_payload(runs)
    document = replay_html(payload)
    with option_named(f"--out {args.out}"):
        path = write_replay(document, args.out)
    size = path.stat().st_size
    return {"out": str(path), "num_tokens": args.tokens, "frames": payload["num_frames"],
            "scene_frames": {scene["id"]: scene["num_frames"] for scene in payload["scenes"]},
            "size_bytes": size, "size_mb": round(size / 1e6, 2), "record_s": round(runs.record_s, 1),
            "total_s": round(time.perf_counter() - started, 1), "model": loaded.model_id, "device": runs.device,
            "dtype": runs.dtype}


def long_prompt_command(args: argparse.Namespace) -> dict:
    """``sparse`` or ``wall`` (``measure/long_prompts.py``), its sizes checked before and after the model loads."""
    from prefillviz.loading.models import load_model
    from prefillviz.measure.long_prompts import sparse_figures, wall_figures

    sizes, keeps = check_long_prompt_options(args)
    loaded = load_model(args.model, device=args.device, dtype=args.dtype, progress=lambda m: print(m, file=sys.stderr))
    longest, new_tokens = max(sizes), 32 if args.command == "sparse" else 1
    option = "--tokens" if args.command == "sparse" else "--sizes"
    check_context_of(option, longest, f"N + {new_tokens} new", longest + new_tokens,
                     (loaded.info.max_context or 0) - new_tokens, loaded)
    progress = lambda done, what: print(f"{done:4.0%} {what}", file=sys.stderr)  # noqa: E731
    if args.command == "sparse":
        return sparse_figures(loaded, args.tokens, keeps, args.runs, progress, args.backend)
    return wall_figures(loaded, sizes, args.runs, args.budget_s, progress, args.backend)


def bench_command(args: argparse.Namespace) -> dict:
    at_least("--num-tokens", args.num_tokens, 1, "the prompt length the bench prefills")
    at_least("--runs", args.runs, 1, "timed runs per figure")
    from prefillviz.loading.models import load_model
    from prefillviz.measure.bench import run_bench

    loaded = load_model(args.model, device=args.device, dtype=args.dtype)
    check_bench_sizes(loaded, args.num_tokens, not args.no_vllm)  # before any part of the bench runs
    return run_bench(args.model, args.device, args.dtype, args.num_tokens, args.runs, args.quick, not args.no_vllm,
                     loaded=loaded)


def kernels_command(args: argparse.Namespace) -> dict:
    from prefillviz.machine.devices import require_dtype, resolve_device, resolve_dtype
    from prefillviz.measure.kernel_bench import benchmark_json, check_sizes, run_kernel_benchmark

    try:
        sizes = [int(n) for n in args.sizes.split(",") if n.strip()]
    except ValueError:
        raise ConfigError(f"--sizes must be comma-separated whole numbers, got {args.sizes!r}.") from None
    families = tuple(f.strip() for f in args.families.split(",") if f.strip())
    if not sizes or min(sizes) < 1 or not families or set(families) - {"dense", "paged"}:
        raise ConfigError("Need --sizes of positive N and --families among dense, paged.")
    at_least("--runs", args.runs, 1, "timed runs per kernel and N")
    device = resolve_device(args.device)
    with option_named(f"--sizes {args.sizes}"):
        check_sizes(args.shape, sizes, device)
    dtype = resolve_dtype(args.dtype, device)
    require_dtype(device, dtype)
    bench = run_kernel_benchmark(*SHAPES[args.shape], sizes, device, dtype, families, not args.no_flex, args.runs)
    return {"shape_name": args.shape, **benchmark_json(bench)}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "run":
            result = run_command(args)
            if args.json:
                print(json.dumps(result), flush=True)  # at once: the interpreter's teardown takes ~1 s more
            else:
                for key, value in result.items():
                    print(f"{key}: {value!r}" if key == "first_token" else f"{key}: {value}")
        elif args.command == "trace":
            print(json.dumps(trace_command(args)))
        elif args.command == "disagg":
            print(json.dumps(disagg_command(args), indent=2), flush=True)
        elif args.command == "replay":
            print(json.dumps(replay_command(args), indent=2), flush=True)
        elif args.command in ("sparse", "wall"):
            print(json.dumps(long_prompt_command(args), indent=2), flush=True)
        elif args.command == "kernels":
            print(json.dumps(kernels_command(args), indent=2))
        elif args.command == "tune":
            print(json.dumps(tune_command(args), indent=2))
        elif args.command == "serve":
            from prefillviz.serve.server import serve_command

            serve_command(args)
        elif args.command == "probe-server":
            from prefillviz.probe.command import print_summary, probe_command

            result = probe_command(args)
            print(json.dumps(result, indent=2)) if args.json else print_summary(result)
        else:
            print(json.dumps(bench_command(args), indent=2))
    except PrefillVizError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except Exception as error:  # a bug or a fault no check foresaw: one line for people, the traceback on request
        if os.environ.get("PREFILLVIZ_DEBUG"):
            raise
        print(f"error: unexpected {type(error).__name__}: {error} "
              "(set PREFILLVIZ_DEBUG=1 for the traceback; please report it)", file=sys.stderr)
        return 1
    return 0
