"""Each server's knee in the side-by-side (``serve_side_by_side``), and whether ours serves at least vLLM's
throughput there.

The knee is the probe's (``probe.load_stats.find_knee``): the heaviest load whose TTFT p99 stays within
``knee_factor`` × the lightest load's. That bound is relative, so it can't see a server already past its
knee at the lightest load: its p99 there is already a queue's, and heavier loads stay "within 2×" of it.
So the lightest load is checked first: a server that served it at under ``KEEP_UP_SHARE`` of the rate its
requests were sent at (at most the load asked for) did not keep up, and its knee is below the loads swept;
the most it served at any load bounds its throughput at that knee from above.

The verdict compares the requests per second each server achieved at its knee (the same arrivals went to
both at every load).
"""

from __future__ import annotations

from prefillviz.probe.load_stats import PointResult
from prefillviz.probe.load_sweep import LoadReport

KEEP_UP_SHARE = 0.8  # served over sent, at the lightest load: below it the server did not keep up


def served_per_s(point: PointResult) -> float:
    return point.per_second(len(point.ok_records)) or 0.0


def sent_per_s(point: PointResult) -> float | None:
    """The rate the point's requests were actually sent at (its Poisson draw), from the first to the last."""
    sent = sorted(r.sent_s for r in point.run.records)
    return (len(sent) - 1) / (sent[-1] - sent[0]) if len(sent) >= 2 and sent[-1] > sent[0] else None


def kept_up(point: PointResult) -> bool:
    """Served at least ``KEEP_UP_SHARE`` of the rate it was sent (the load asked for, when the draw sent
    faster: a few requests sent close together can't be served at their burst's rate)."""
    sent = sent_per_s(point)
    return sent is None or served_per_s(point) >= KEEP_UP_SHARE * min(sent, point.load)


def _at(point: PointResult) -> dict:
    return {"requests_per_s": served_per_s(point),
            "output_tokens_per_s": point.per_second(sum(r.output_tokens for r in point.ok_records)),
            "ttft_s_p99": point.ttft_s(99)}


def knee_of(report: LoadReport | None) -> dict | None:
    """The knee's load and what the server achieved there. ``reached`` False: no heavier load went past it
    (a lower bound). ``below_sweep``: not kept up at the lightest load (``load`` None; the figures are those
    of the load where it served most, ``served_most_at``)."""
    if report is None or not report.points:
        return None
    lightest = report.points[0]
    if not kept_up(lightest):
        most = max(report.points, key=served_per_s)
        return {"load": None, "reached": True, "below_sweep": True, "served_most_at": most.load,
                "lightest_sent_per_s": sent_per_s(lightest), **_at(most)}
    index, reached = report.knee()
    if index is None:
        return None
    point = report.points[index]
    return {"load": point.load, "reached": reached, "below_sweep": False, **_at(point)}


def comparison(servers: dict[str, dict]) -> dict:
    """Ours against vLLM: the req/s each achieved at its knee. A knee not reached is a lower bound
    (``both_knees_reached`` False: heavier loads would tell more)."""
    ours, theirs = servers["ours"]["knee"], servers["vllm"]["knee"]
    if not ours or not theirs:
        return {"ours_at_least_vllm_at_knee": None, "ours_over_vllm_requests_per_s_at_knee": None,
                "both_knees_reached": False}
    ratio = ours["requests_per_s"] / theirs["requests_per_s"] if theirs["requests_per_s"] else None
    return {"ours_at_least_vllm_at_knee": ours["requests_per_s"] >= theirs["requests_per_s"],
            "ours_over_vllm_requests_per_s_at_knee": None if ratio is None else round(ratio, 3),
            "both_knees_reached": ours["reached"] and theirs["reached"]}
