"""``/metrics``: the engine's own timestamps under vLLM's Prometheus names, so tools that read vLLM read us.

Names, labels (``model_name``, ``engine``) and bucket bounds are vLLM's (``vllm/v1/metrics/loggers.py``,
``buckets.py``). What each figure means here, as in vLLM:

    time_to_first_token_seconds   arrival at the server -> first token sampled
    request_queue_time_seconds    arrival -> first scheduled in a step (waiting)
    request_prefill_time_seconds  first scheduled -> first token (the prompt's steps, and the decodes beside them)
    request_decode_time_seconds   first token -> last token
    prefix_cache_queries / hits   prompt tokens looked up / found in the prefix cache (counters, ``_total``)

prometheus_client writes a counter ``vllm:x`` as ``vllm:x_total``, as vLLM's does.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from prefillviz.engine.request import Request, RequestStatus

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                   480.0, 960.0, 1920.0, 7680.0)
FINISH_REASONS = {RequestStatus.FINISHED_STOPPED: "stop", RequestStatus.FINISHED_LENGTH: "length",
                  RequestStatus.FINISHED_ABORTED: "abort"}
LABELS = ("model_name", "engine")


class ServeMetrics:
    """The server's Prometheus registry (its own, not the process-wide default)."""

    def __init__(self, model_name: str, prefix_queries: int = 0, prefix_hits: int = 0) -> None:
        """``prefix_queries``/``prefix_hits``: the scheduler's totals before serving (a warm-up's), not counted."""
        self.registry = CollectorRegistry()
        labels = {"labelnames": LABELS, "registry": self.registry}
        self._labels = (model_name, "0")

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, buckets=buckets, **labels).labels(*self._labels)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, **labels).labels(*self._labels)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, **labels).labels(*self._labels)

        self.running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.prefix_queries = counter("vllm:prefix_cache_queries",
                                      "Prefix cache queries, in terms of number of queried tokens.")
        self.prefix_hits = counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.")
        self.preemptions = counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        self.success = Counter("vllm:request_success", "Count of successfully processed requests.",
                               labelnames=(*LABELS, "finished_reason"), registry=self.registry)
        self.ttft = histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              TTFT_BUCKETS)
        self.itl = histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                             ITL_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                             LATENCY_BUCKETS)
        self.queue = histogram("vllm:request_queue_time_seconds",
                               "Histogram of time spent in WAITING phase for request.", LATENCY_BUCKETS)
        self.inference = histogram("vllm:request_inference_time_seconds",
                                   "Histogram of time spent in RUNNING phase for request.", LATENCY_BUCKETS)
        self.prefill = histogram("vllm:request_prefill_time_seconds",
                                 "Histogram of time spent in PREFILL phase for request.", LATENCY_BUCKETS)
        self.decode = histogram("vllm:request_decode_time_seconds",
                                "Histogram of time spent in DECODE phase for request.", LATENCY_BUCKETS)
        self._seen_queries, self._seen_hits = prefix_queries, prefix_hits

    def after_step(self, num_running: int, num_waiting: int, kv_usage: float, prefix_queries: int, prefix_hits: int,
                   num_preempted: int, num_generated: int) -> None:
        """The scheduler's state after one step (the prefix counters are the scheduler's running totals)."""
        self.running.set(num_running)
        self.waiting.set(num_waiting)
        self.kv_usage.set(kv_usage)
        self.prefix_queries.inc(prefix_queries - self._seen_queries)
        self.prefix_hits.inc(prefix_hits - self._seen_hits)
        self._seen_queries, self._seen_hits = prefix_queries, prefix_hits
        if num_preempted:
            self.preemptions.inc(num_preempted)
        self.generation_tokens.inc(num_generated)

    def finished(self, request: Request, received_time: float) -> None:
        """One request's times, from the engine's own timestamps (``received_time``: arrival at the server)."""
        self.success.labels(*self._labels, FINISH_REASONS.get(request.status, "abort")).inc()
        self.e2e.observe((request.finished_time or received_time) - received_time)
        if request.first_scheduled_time is not None:
            self.queue.observe(request.first_scheduled_time - received_time)
            if request.finished_time is not None:
                self.inference.observe(request.finished_time - request.first_scheduled_time)
        if request.first_token_time is None:
            return
        self.prompt_tokens.inc(request.num_prompt_tokens)
        self.ttft.observe(request.first_token_time - received_time)
        self.prefill.observe(request.first_token_time - (request.first_scheduled_time or received_time))
        self.decode.observe(request.token_times[-1] - request.first_token_time)
        for gap in request.inter_token_times_s:
            self.itl.observe(gap)

    def exposition(self) -> bytes:
        """The Prometheus text format of every metric."""
        return generate_latest(self.registry)
