"""A trace's recorded events, one frame each, at the time the run measured: what a replay plays.

Three kinds of event, each one a fact the trace holds (nothing between them is made up):

    step       the scheduler handed out this step's chunks and blocks     at start + schedule
    kv_write   one layer wrote the step's K/V into its cache slots        at the end of that layer's span
    token      a request sampled its next token                           at start + schedule + prepare
                                                                             + forward + sample

    one step of a 3-layer model, 2 requests sampling:
    time ->  |sched|prep|emb|layer 0|layer 1|layer 2|head|sample|update|
    frames:        step             kv 0    kv 1    kv 2           token token

A layer's frame is placed at the end of its span on the per-layer clock (forward start +
embedding + the spans of the layers up to it), so only a trace with a KV write log (capture level
``inspect``) has ``kv_write`` frames; a timing pass has steps and tokens. Times are seconds since
the run's first step. "Step order" is the same frames one per tick, in the order they happened.
"""

from __future__ import annotations

from dataclasses import dataclass

from prefillviz.engine.trace import StepRecord, Trace

FRAME_KINDS = ("step", "kv_write", "token")


@dataclass(frozen=True)
class Frame:
    """One recorded event of a run.

    Attributes:
        kind: one of ``FRAME_KINDS``.
        step: index of its step in ``trace.steps``.
        time_s: when it happened, seconds since the run's first step (measured, see the module doc).
        layer: the layer that wrote (``kv_write``), else -1.
        request_id: the request that sampled (``token``), else "".
        token_id: the token it sampled (``token``), else -1.
    """

    kind: str
    step: int
    time_s: float
    layer: int = -1
    request_id: str = ""
    token_id: int = -1


def scheduled_time_s(step: StepRecord) -> float:
    """When the scheduler had decided the step (seconds since the run's first step)."""
    return step.start_time_s + step.schedule_time_s


def layer_end_times_s(step: StepRecord) -> dict[int, float]:
    """When each layer's span ended on the per-layer clock: the forward's start, the embedding, then the
    layers in order (the forward runs them in index order). Empty without per-layer times."""
    times = step.layer_times
    if times is None:
        return {}
    clock = step.start_time_s + step.schedule_time_s + step.prepare_time_s + times.embedding_s
    ends = {}
    for layer, seconds in enumerate(times.layer_s):
        clock += seconds
        ends[layer] = clock
    return ends


def sampled_time_s(step: StepRecord) -> float:
    """When the step's tokens had been sampled."""
    return step.start_time_s + step.schedule_time_s + step.prepare_time_s + step.forward_time_s + step.sample_time_s


def step_frames(step: StepRecord) -> list[Frame]:
    """The frames of one step, in the order they happened."""
    frames = [Frame("step", step.step_index, scheduled_time_s(step))]
    if step.kv_writes is not None:
        ends = layer_end_times_s(step)
        frames += [Frame("kv_write", step.step_index, ends[layer], layer=layer)
                   for layer in step.kv_writes.layers_written]
    sampled = sampled_time_s(step)
    frames += [Frame("token", step.step_index, sampled, request_id=request_id, token_id=token_id)
               for request_id, token_id in step.sampled_token_ids.items()]
    return frames


def trace_frames(trace: Trace) -> list[Frame]:
    """Every recorded event of ``trace``, one frame each, in the order they happened (step order).

    Raises:
        ValueError: a step with a KV write log but no per-layer times (no time to place its writes at).
    """
    frames: list[Frame] = []
    for step in trace.steps:
        if step.kv_writes is not None and step.layer_times is None:
            raise ValueError(f"Step {step.step_index} has a KV write log but no per-layer times.")
        frames += step_frames(step)
    return frames


def num_events(trace: Trace) -> int:
    """How many events the trace recorded: its steps, its layers' KV writes and its sampled tokens."""
    return sum(1 + (len(step.kv_writes.layers_written) if step.kv_writes is not None else 0)
               + len(step.sampled_token_ids) for step in trace.steps)
