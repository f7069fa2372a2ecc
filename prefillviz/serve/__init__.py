"""The engine behind an OpenAI-compatible HTTP server (``python -m prefillviz serve``).

One concept per file:

    protocol.py       an OpenAI request body -> a checked ``Generation`` (a 400 names what is wrong)
    openai_format.py  the bodies OpenAI answers with: completions, chat, stream chunks, usage, errors
    request_stream.py one request's way back: tokens from the engine thread to its HTTP response
    engine_loop.py    continuous batching: one thread steps the engine; requests join between steps
    metrics.py        ``/metrics`` with vLLM's Prometheus names, from the engine's own timestamps
    live.py           recent steps and each finished request's TTFT split, for the "Live engine" page
    app.py            the Starlette routes
    server.py         loads the model, starts the loop and uvicorn on 127.0.0.1, stops on Ctrl-C
"""
