"""What the server counted itself: its Prometheus text at ``/metrics``, read before and after.

The text is parsed by ``prometheus_client``'s own parser. A snapshot maps each sample
(``name{label="value"}``) to its value; histogram buckets and ``_created`` stamps are left
out. ``MetricsDelta`` is what changed between two snapshots: counters by their increase,
gauges by their values before and after.

vLLM's names (``vllm:``) that matter for prefill are listed in ``PREFILL_METRICS``; other
servers have their own names (SGLang ``sglang:``, TGI ``tgi_``, llama.cpp ``llamacpp:``), and
every one that changed is kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from prefillviz.probe.client import ProbeError

PREFILL_METRICS = {  # vLLM's sample names -> what they count, in words
    "vllm:prefix_cache_queries_total": "prompt tokens looked up in the prefix cache",
    "vllm:prefix_cache_hits_total": "prompt tokens found in the prefix cache",
    "vllm:prompt_tokens_total": "prompt tokens received",
    "vllm:prompt_tokens_cached_total": "prompt tokens served from a cache",
    "vllm:time_to_first_token_seconds_count": "first tokens timed by the server",
    "vllm:time_to_first_token_seconds_sum": "their time to first token, summed (s)",
    "vllm:request_queue_time_seconds_sum": "time requests waited in the engine's queue, summed (s)",
    "vllm:request_prefill_time_seconds_sum": "time from first scheduled to first token, summed (s)",
    "vllm:num_requests_running": "requests running",
    "vllm:num_requests_waiting": "requests waiting",
    "vllm:kv_cache_usage_perc": "KV cache in use (fraction)",
}
COUNTER_SUFFIXES = ("_total", "_count", "_sum")


def sample_key(name: str, labels: dict[str, str]) -> str:
    shown = {k: v for k, v in sorted(labels.items()) if k not in ("model_name", "engine")}
    return name + ("{" + ",".join(f'{k}="{v}"' for k, v in shown.items()) + "}" if shown else "")


def parse_metrics(text: str) -> dict[str, float]:
    """One snapshot of a Prometheus text page: sample key -> value."""
    snapshot: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name.endswith(("_created", "_bucket")):
                    continue
                key = sample_key(sample.name, sample.labels)
                snapshot[key] = snapshot.get(key, 0.0) + float(sample.value)  # several engines: their sum
    except ValueError as error:
        raise ProbeError(f"The server's /metrics is not Prometheus text: {error}") from error
    return snapshot


@dataclass
class MetricsDelta:
    """What changed on the server between two snapshots (empty when it has no /metrics)."""

    counters: dict[str, float] = field(default_factory=dict)  # sample -> increase
    gauges: dict[str, tuple[float, float]] = field(default_factory=dict)  # sample -> (before, after)

    @classmethod
    def between(cls, before: dict[str, float] | None, after: dict[str, float] | None) -> MetricsDelta:
        delta = cls()
        if not before or not after:
            return delta
        for key, value in after.items():
            old = before.get(key, 0.0)
            if value == old:
                continue
            if key.split("{")[0].endswith(COUNTER_SUFFIXES):
                delta.counters[key] = value - old
            else:
                delta.gauges[key] = (old, value)
        return delta

    def get(self, key: str, default: float = 0.0) -> float:
        return self.counters.get(key, default)

    def to_json(self) -> dict:
        return {
            **{k: round(v, 6) for k, v in self.counters.items()},
            **{k: {"before": a, "after": b} for k, (a, b) in self.gauges.items()},
        }

    def rows(self, experiment: str) -> list[dict]:
        rows = [{"experiment": experiment, "metric": k, "change": v, "before": None, "after": None,
                 "means": PREFILL_METRICS.get(k, "")}
                for k, v in self.counters.items()]
        rows += [{"experiment": experiment, "metric": k, "change": b - a, "before": a, "after": b,
                  "means": PREFILL_METRICS.get(k, "")}
                 for k, (a, b) in self.gauges.items()]
        return sorted(rows, key=lambda r: (r["means"] == "", r["metric"]))
