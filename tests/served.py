"""``prefillviz serve`` in the test's own process (uvicorn in a thread, on a free port): a test can read its engine."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

from prefillviz.cli_parser import build_parser
from prefillviz.engine.config import EngineConfig
from prefillviz.engine.engine import LLMEngine
from prefillviz.peers.vllm_server import free_port
from prefillviz.serve.server import make_server


@contextlib.contextmanager
def server_in_thread(bundled, max_num_seqs: int) -> Iterator[tuple[str, LLMEngine, object]]:
    """(its URL, its engine, its engine loop) while it runs; on exit it stops, and nothing of it is left running."""
    port = free_port()
    args = build_parser().parse_args(["serve", "--port", str(port), "--max-num-seqs", str(max_num_seqs)])
    engine = LLMEngine(bundled.model, bundled.tokenizer, EngineConfig(max_num_running=max_num_seqs, token_budget=256),
                       model_id=bundled.model_id)
    server, loop = make_server(args, bundled, engine)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start within 30 s"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}", engine, loop
    server.should_exit = True
    thread.join(30)
    assert not thread.is_alive() and not loop.alive
