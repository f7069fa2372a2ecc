"""The Starlette routes of the OpenAI-compatible server.

    POST /v1/completions, /v1/chat/completions   stream (SSE) or not; 400 bad request, 429 queue full
    GET  /v1/models, /health, /metrics (Prometheus text, vLLM's names), /version
    GET  /prefillviz/steps?since=N               the live record (``live.py``) for the "Live engine" page

A streaming response whose client goes away is cancelled by Starlette; its ``finally`` aborts the
request in the engine, which frees its blocks before the next step.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from prefillviz.serve.engine_loop import EngineLoop, NotRunning, QueueFull
from prefillviz.serve.live import LiveRecorder
from prefillviz.serve.openai_format import DONE, ResponseBuilder, error_body, usage
from prefillviz.serve.protocol import CHAT, COMPLETION, BadRequest, parse_generation
from prefillviz.serve.request_stream import Failed, Finished, IncrementalText, RequestStream, Tokens

SERVER_VERSION = "prefillviz-serve 1"


@dataclass(frozen=True)
class ServedModel:
    """What the routes need to know of the model."""

    names: list[str]  # the first is the default and the one /v1/models lists first
    tokenizer: object
    max_context: int | None
    eos_token_id: int | None


def error_response(status: int, message: str, param: str | None = None, code: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param, code), status_code=status)


def _usage_of(finish: Finished) -> dict:
    return usage(finish.num_prompt_tokens, finish.num_output_tokens, finish.num_cached_tokens)


def build_app(loop: EngineLoop, served: ServedModel, recorder: LiveRecorder | None = None,
              request_timeout_s: float = 600.0, lifespan=None) -> Starlette:
    """The server's ASGI app around a started ``EngineLoop`` (``lifespan``: Starlette's, for start and stop)."""
    created = int(time.time())

    async def health(_: Request) -> Response:
        if loop.alive:
            return Response(status_code=200)
        return error_response(503, f"The engine loop is not running: {loop.failure or 'stopped'}.")

    async def version(_: Request) -> Response:
        return JSONResponse({"version": SERVER_VERSION})

    async def models(_: Request) -> Response:
        data = [{"id": name, "object": "model", "created": created, "owned_by": "prefillviz", "root": served.names[0],
                 "max_model_len": served.max_context} for name in served.names]
        return JSONResponse({"object": "list", "data": data})

    async def metrics(_: Request) -> Response:
        return Response(loop.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    async def steps(request: Request) -> Response:
        if recorder is None:
            return error_response(404, "This server was started without the live record (--no-live).")
        try:
            since = int(request.query_params.get("since", "0"))
        except ValueError:
            return error_response(400, "since must be a whole number (a step index).", "since")
        began = time.perf_counter()
        response = JSONResponse(recorder.snapshot(since))  # rendered here: the JSON is part of the read's cost
        recorder.count_read(time.perf_counter() - began)
        return response

    async def sse(stream: RequestStream, builder: ResponseBuilder) -> AsyncIterator[str]:
        """Each step's token as one event; the last carries the finish reason, then usage, then [DONE]."""
        text, done = IncrementalText(served.tokenizer), False
        ids = stream.generation.return_token_ids
        try:
            async for event in stream.events(request_timeout_s):
                if isinstance(event, Tokens):
                    piece = text.add(event.token_ids)
                    new_ids = event.token_ids if ids else None
                    if event.finish is None:
                        yield builder.chunk(piece, None, new_ids)
                        continue
                    event = event.finish
                    piece += text.flush()
                else:
                    piece, new_ids = text.flush(), [] if ids else None
                if isinstance(event, Finished):
                    done = True
                    yield builder.chunk(piece, event.finish_reason, new_ids)
                    if stream.generation.include_usage:
                        yield builder.usage_chunk(_usage_of(event))
                elif isinstance(event, Failed):
                    yield builder.error_chunk(event.status, event.message)
                yield DONE
        finally:
            if not done:  # the client left, the deadline passed, or the engine failed it: free its blocks
                loop.abort(stream.request_id)

    async def whole(request: Request, stream: RequestStream, builder: ResponseBuilder) -> Response:
        text, generation = IncrementalText(served.tokenizer), stream.generation
        try:
            async for event in stream.events(request_timeout_s, request.is_disconnected):
                if isinstance(event, Tokens):
                    text.add(event.token_ids)
                    event = event.finish or event
                if isinstance(event, Finished):
                    text.flush()
                    ids = (generation.prompt_token_ids, text.token_ids) if generation.return_token_ids else None
                    return JSONResponse(builder.full(text.text, event.finish_reason, _usage_of(event), ids))
                if isinstance(event, Failed):
                    loop.abort(stream.request_id)
                    return error_response(event.status, event.message)
        except asyncio.CancelledError:
            loop.abort(stream.request_id)
            raise
        loop.abort(stream.request_id)  # the client went away
        return Response(status_code=499)

    async def generate(request: Request, kind: str) -> Response:
        received_time = time.perf_counter()  # before the body is read and tokenized, as vLLM counts
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError):
            return error_response(400, "The body is not valid JSON.")
        try:
            generation = parse_generation(body, kind, served.names, served.tokenizer, served.max_context,
                                          served.eos_token_id)
            loop.check(generation)
        except BadRequest as error:
            return error_response(400, error.message, error.param, error.code)
        if not loop.alive:
            return error_response(503, f"The engine loop is not running: {loop.failure or 'stopped'}.")
        request_id = f"{'chatcmpl' if kind == CHAT else 'cmpl'}-{uuid.uuid4().hex}"
        stream = RequestStream(request_id, generation, asyncio.get_running_loop(), received_time)
        try:
            loop.submit(stream)
        except QueueFull as error:
            return error_response(429, str(error), code="queue_full")
        except NotRunning as error:
            return error_response(503, str(error))
        builder = ResponseBuilder(kind, request_id, generation.model)
        if generation.stream:
            return StreamingResponse(sse(stream, builder), media_type="text/event-stream")
        return await whole(request, stream, builder)

    async def completions(request: Request) -> Response:
        return await generate(request, COMPLETION)

    async def chat_completions(request: Request) -> Response:
        return await generate(request, CHAT)

    routes = [
        Route("/health", health),
        Route("/version", version),
        Route("/v1/models", models),
        Route("/metrics", metrics),
        Route("/prefillviz/steps", steps),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    ]
    return Starlette(routes=routes, lifespan=lifespan)
