"""The command line's options: one subcommand per piece of work (``cli.py`` runs them).

Every size option is checked by ``cli_checks.py`` before the work starts; here each is only named,
typed and given its default.
"""

from __future__ import annotations

import argparse

from prefillviz.measure.kernel_bench import BENCH_SIZES, SHAPES

DESCRIPTION = "Command line: ``python -m prefillviz run|trace|bench|kernels|tune|probe-server``."


def _add_model_arguments(parser: argparse.ArgumentParser) -> None:
    from prefillviz.loading.model_registry import BUNDLED_MODEL_ID

    parser.add_argument("--model", default=BUNDLED_MODEL_ID, help="hub id, local folder, or the bundled default")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps")
    parser.add_argument("--dtype", default="auto", help="auto, float32, bfloat16 or float16")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m prefillviz", description=DESCRIPTION)
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="prefill one prompt and print the first token")
    trace = commands.add_parser("trace", help="run one prompt at a capture level and save the trace")
    for command in (run, trace):
        command.add_argument("--prompt", required=True)
        _add_model_arguments(command)
        command.add_argument("--token-budget", type=int, default=2048, help="tokens per step (1 = token by token)")
        command.add_argument("--block-size", type=int, default=16)
        command.add_argument("--no-prefix-cache", action="store_true")
        command.add_argument("--no-chunking", action="store_true", help="whole-prompt prefill steps")
        command.add_argument("--max-new-tokens", type=int, default=1)
        command.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
        command.add_argument("--top-k", type=int, default=0)
        command.add_argument("--top-p", type=float, default=1.0)
        command.add_argument("--seed", type=int, default=None)
        command.add_argument(
            "--backend", default="measured", choices=["measured", "torch"],
            help="measured: the fastest kernels this machine ran (prefillviz/backends); "
            "torch: the textbook's plain torch ops",
        )
        command.add_argument(
            "--pack-weights", default="auto", choices=["auto", "on", "off"],
            help="the measured backend's linears packed once on a CPU; auto: only when decoding "
            "(--max-new-tokens > 1), since for one forward packing costs more than it saves",
        )
    run.add_argument("--json", action="store_true", help="print one JSON object")
    trace.add_argument("--level", default="inspect", choices=["none", "timing", "inspect", "profile"])
    trace.add_argument("--out", required=True, help="folder for trace.json, arrays.npz (and chrome_trace.json)")

    bench = commands.add_parser("bench", help="benchmark the engine against the plain HF forward")
    _add_model_arguments(bench)
    bench.add_argument("--num-tokens", type=int, default=512)
    bench.add_argument("--runs", type=int, default=7, help="timed runs per figure, after warm-up")
    bench.add_argument("--json", action="store_true", help="print one JSON object (the default output)")
    bench.add_argument("--quick", action="store_true",
                       help="the least work that fills every key, to check the JSON (its figures mean nothing)")
    bench.add_argument("--no-vllm", action="store_true",
                       help="leave out the side-by-side with vLLM (its keys are null)")

    kernels = commands.add_parser("kernels", help="time and peak memory vs N of every attention kernel")
    kernels.add_argument("--shape", default="smollm2-135m", choices=sorted(SHAPES), help="whose attention heads")
    kernels.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps")
    kernels.add_argument("--dtype", default="auto", help="auto, float32, bfloat16 or float16")
    kernels.add_argument("--sizes", default=",".join(map(str, BENCH_SIZES)), help="comma-separated N values")
    kernels.add_argument("--families", default="dense,paged", help="dense, paged or both")
    kernels.add_argument("--runs", type=int, default=3, help="timed runs per kernel and N, after warm-up")
    kernels.add_argument("--no-flex", action="store_true", help="leave out FlexAttention (it compiles per shape)")
    kernels.add_argument("--json", action="store_true", help="print one JSON object (the default output)")

    tune = commands.add_parser("tune", help="time the engine's attention and linears candidates here "
                               "and print the measured choice")
    _add_model_arguments(tune)
    tune.add_argument("--again", action="store_true", help="measure again even when a fresh table is cached")
    tune.add_argument("--json", action="store_true", help="print one JSON object (the default output)")

    from prefillviz.probe.command import add_parser as add_probe_parser

    add_probe_parser(commands)
    from prefillviz.serve.server import add_parser as add_serve_parser

    add_serve_parser(commands)
    disagg = commands.add_parser("disagg", help="the chunked-prefill workload on one engine (chunking off, on) "
                                 "and on a prefill + a decode worker")
    _add_model_arguments(disagg)
    disagg.add_argument("--num-short", type=int, default=3, help="short requests decoding when the long prompt arrives")
    disagg.add_argument("--short-prompt-tokens", type=int, default=16)
    disagg.add_argument("--short-new-tokens", type=int, default=16)
    disagg.add_argument("--long-prompt-tokens", type=int, default=512)
    disagg.add_argument("--long-new-tokens", type=int, default=4)
    disagg.add_argument("--arrival-step", type=int, default=2)
    disagg.add_argument("--token-budget", type=int, default=64)
    disagg.add_argument("--json", action="store_true", help="print one JSON object (the default output)")

    replay = commands.add_parser("replay", help="record prefill, chunked prefill and a prefix hit, and write one "
                                 "offline HTML file that plays them back")
    _add_model_arguments(replay)
    replay.add_argument("--tokens", type=int, default=512, help="prompt tokens of the prefill runs and the long prompt")
    replay.add_argument("--out", required=True, help="the HTML file to write")

    sparse = commands.add_parser("sparse", help="block-sparse prefill (XAttention's antidiagonal scoring) against "
                                 "dense on a long prompt: FLOPs skipped, first-token KL, greedy agreement, times")
    _add_model_arguments(sparse)
    sparse.add_argument("--tokens", type=int, default=4096, help="prompt tokens, from the bundled book")
    sparse.add_argument("--keep", default="0.2", help="fraction of key blocks kept (1.0: every block); "
                        "comma-separated for several settings")
    sparse.add_argument("--runs", type=int, default=3, help="timed runs of each, dense and sparse alternating")
    sparse.add_argument("--backend", default="measured", choices=["measured", "torch"],
                        help="dense and sparse both on the measured backend (the faster of v8 block-sparse and the "
                        "textbook's, measured) or both on the textbook's torch ops")
    sparse.add_argument("--json", action="store_true", help="print one JSON object (the default output)")
    wall = commands.add_parser("wall", help="the O(N^2) wall: attention, linears and the rest of TTFT per N, "
                               "the crossovers, the fit's N and N^2 terms")
    _add_model_arguments(wall)
    wall.add_argument("--sizes", default="512,1024,2048,4096,8191", help="comma-separated prompt lengths N")
    wall.add_argument("--runs", type=int, default=1, help="timed runs per size, after one warm-up")
    wall.add_argument("--budget-s", type=float, default=180.0, help="leave out the sizes that would pass this")
    wall.add_argument("--backend", default="measured", choices=["measured", "torch"],
                      help="the measured backend (the engine's real path) or the textbook's torch ops")
    wall.add_argument("--json", action="store_true", help="print one JSON object (the default output)")
    return parser
