"""Measure a real deployment from outside: any OpenAI-compatible server (vLLM, SGLang, TGI,
llama.cpp's server), with the same views as the local pages (``probe_server``), and under load
(``load_sweep``): TTFT percentiles, goodput and the knee, split into queue and prefill by the
server's own histograms."""
