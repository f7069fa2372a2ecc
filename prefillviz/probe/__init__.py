"""Measure a real deployment from outside: any OpenAI-compatible server (vLLM, SGLang, TGI,
llama.cpp's server), with the same views as the local pages (``probe_server``)."""
