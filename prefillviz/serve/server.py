"""``python -m prefillviz serve``: load the model, warm the engine, start the loop, run uvicorn.

    python -m prefillviz serve [--host 127.0.0.1] [--port 8000] [--model ID]      (make serve)

uvicorn handles Ctrl-C and SIGTERM: it stops taking connections, lets open requests go on for up to
``GRACEFUL_S``, then cancels them (a cancelled response aborts its request); then the lifespan stops the
engine loop (anything left gets a 503) and prints the KV blocks still held.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import socket
import sys

import uvicorn

from prefillviz.engine.engine import LLMEngine
from prefillviz.engine.errors import ConfigError
from prefillviz.experiments.served_engine import SERVED_DEFAULTS, served_engine_config, warm_full_batch
from prefillviz.serve.app import ServedModel, build_app
from prefillviz.serve.engine_loop import EngineLoop
from prefillviz.serve.live import LiveRecorder
from prefillviz.serve.metrics import ServeMetrics

GRACEFUL_S = 5


def add_parser(commands) -> None:
    """The ``serve`` subcommand's options."""
    from prefillviz.loading.model_registry import BUNDLED_MODEL_ID

    serve = commands.add_parser("serve", help="an OpenAI-compatible server around the engine (127.0.0.1)")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default: this machine only)")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--model", default=BUNDLED_MODEL_ID, help="hub id, local folder, or the bundled default")
    serve.add_argument("--served-model-name", default=None, help="another name clients may use for the model")
    serve.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps")
    serve.add_argument("--dtype", default="auto", help="auto, float32, bfloat16 or float16")
    serve.add_argument("--token-budget", type=int, default=SERVED_DEFAULTS.token_budget,
                       help="tokens per step (max_num_batched_tokens)")
    serve.add_argument("--max-num-seqs", type=int, default=SERVED_DEFAULTS.max_num_running,
                       help="most requests running at once")
    serve.add_argument("--max-waiting", type=int, default=256, help="most requests waiting; one more gets a 429")
    serve.add_argument("--block-size", type=int, default=SERVED_DEFAULTS.block_size)
    serve.add_argument("--no-prefix-cache", action="store_true")
    serve.add_argument("--request-timeout", type=float, default=600.0, help="seconds a request may take")
    serve.add_argument("--no-live", action="store_true", help="keep no live record (/prefillviz/steps)")
    serve.add_argument("--access-log", action="store_true", help="log every HTTP request")


def check_port_free(host: str, port: int) -> None:
    """Raise ``ConfigError`` when nothing could listen on ``host:port`` (taken, or not this machine's address)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind((host, port))
        except OSError as error:
            raise ConfigError(f"Can't listen on {host}:{port}: {error.strerror or error}. Pick another --port "
                              "(or stop what holds it).") from error


def build_engine(args: argparse.Namespace):
    """The loaded model and its warmed engine: a full batch of short requests runs first (prefill, mixed and
    decode steps at the batch's size), so the first clients don't pay for each shape's first run."""
    from prefillviz.loading.models import load_model

    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port must be in 0..65535 (0: a free one), got {args.port}.")
    if args.max_waiting < 1 or args.request_timeout <= 0:
        raise ConfigError("--max-waiting must be at least 1 and --request-timeout above 0.")
    check_port_free(args.host, args.port)  # before the model loads, not after
    config = served_engine_config(token_budget=args.token_budget, max_num_running=args.max_num_seqs,
                                  block_size=args.block_size, enable_prefix_caching=not args.no_prefix_cache)
    loaded = load_model(args.model, device=args.device, dtype=args.dtype, progress=lambda m: print(m, file=sys.stderr))
    engine = LLMEngine(loaded.model, loaded.tokenizer, config, model_id=loaded.model_id)
    seconds = warm_full_batch(engine)
    print(f"warmed up in {seconds:.1f} s ({config.max_num_running} requests)", file=sys.stderr)
    return loaded, engine


def make_server(args: argparse.Namespace, loaded, engine: LLMEngine) -> tuple[uvicorn.Server, EngineLoop]:
    """The uvicorn server and the engine loop behind it (started and stopped with the server)."""
    names = [loaded.model_id] + ([args.served_model_name] if args.served_model_name else [])
    metrics = ServeMetrics(names[0], engine.scheduler.prefix_cache_queries, engine.scheduler.prefix_cache_hits)
    recorder = None if args.no_live else LiveRecorder(engine.config.token_budget, engine.num_blocks)
    loop = EngineLoop(engine, metrics, args.max_waiting, recorder)
    tokenizer = loaded.tokenizer
    served = ServedModel(names, tokenizer, engine.max_context, tokenizer.eos_token_id)

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        loop.start()
        yield
        loop.stop()  # after uvicorn let open requests finish (GRACEFUL_S): the rest get a 503
        held = engine.num_blocks - engine.block_pool.num_free_blocks
        print(f"stopped; KV blocks still held by a request: {held}", file=sys.stderr, flush=True)

    app = build_app(loop, served, recorder, args.request_timeout, lifespan)
    config = uvicorn.Config(app, host=args.host, port=args.port, lifespan="on", access_log=args.access_log,
                            log_level="info", timeout_graceful_shutdown=GRACEFUL_S)
    return uvicorn.Server(config), loop


def serve_command(args: argparse.Namespace) -> None:
    """Serve until Ctrl-C or SIGTERM."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: binding {args.host}: anyone who can reach this machine can use the model", file=sys.stderr)
    loaded, engine = build_engine(args)
    server, _ = make_server(args, loaded, engine)
    print(f"serving {loaded.model_id} ({engine.num_blocks} KV blocks of {engine.config.block_size}) on "
          f"http://{args.host}:{args.port}/v1", file=sys.stderr, flush=True)
    try:
        server.run()  # uvicorn re-raises the signal that stopped it, once the lifespan has stopped the loop
    except KeyboardInterrupt:
        pass
