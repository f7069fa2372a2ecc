"""Running something on the shared model from a page: its turn in the queue, an inline error that
keeps earlier results, progress bars, and the caption that says what a number measured."""

from __future__ import annotations

import gc
import logging
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import streamlit as st
import torch
from streamlit.errors import StreamlitAPIException

from prefillviz.backends.dispatch_tables import choice_label
from prefillviz.backends.labels import forward_label
from prefillviz.backends.packed_weights import linear_weights_label
from prefillviz.engine.backend import using_backend
from prefillviz.engine.errors import OutOfMemory, PrefillVizError, is_out_of_memory
from prefillviz.experiments.prefill import TIMING_RUNS
from prefillviz.instrument.passes import pass_label
from prefillviz.loading.models import LoadedModel
from prefillviz.machine.devices import dtype_name
from prefillviz.ui.run_queue import RUN_QUEUE
from prefillviz.ui.settings import backend_choice, session_backend
from prefillviz.ui.shared_runs import SHARED_RUNS, Shared

logger = logging.getLogger(__name__)


def run_label(loaded: LoadedModel, capture: str) -> str:
    """What a number measured: the pass (``instrument.passes``), the device and its threads, for captions under
    results."""
    where = f"{loaded.model_id} on {loaded.device}, {dtype_name(loaded.dtype)}"
    backend = session_backend()
    measured = "" if backend is not None else f"{linear_weights_label(loaded.model)} · {choice_label(loaded.model)} · "
    return (f"{pass_label(capture)} · {where} · {forward_label(loaded.model, backend)} · "
            f"{measured}{torch.get_num_threads()} torch threads")


@contextmanager
def run_guarded(what: str, queue: bool = True) -> Iterator[None]:
    """Wait for the shared model's turn, then run; show an inline error instead of a crash.

    Sessions queue for the model one run at a time (``RUN_QUEUE``) and see their place in
    line; ``queue=False`` for runs that don't use it (the server probe). After an
    out-of-memory error the caches are freed. Earlier results stay in ``st.session_state``
    untouched, so the page keeps showing them.
    """
    try:
        with queue_turn() if queue else nullcontext(0.0), using_backend(session_backend()):  # the sidebar's engine ops
            yield
    except PrefillVizError as error:
        if isinstance(error, OutOfMemory):
            free_memory()
        st.error(f"{what} failed: {error}")
    except Exception as error:
        if is_out_of_memory(error):
            free_memory()
            st.error(f"{what} ran out of memory. Try a shorter prompt, a smaller token budget or a smaller model.")
            return
        if isinstance(error, StreamlitAPIException):  # a bug in a page, not bad input: let tests see it
            raise
        logger.exception("%s failed", what)  # the traceback goes to the server log
        st.error(f"{what} failed unexpectedly ({type(error).__name__}: {error}). "
                 "Earlier results are kept; please report this.")


def _wait_text(ahead: int) -> str:
    eta = RUN_QUEUE.estimate_s(ahead)
    estimate = f", about {eta:,.0f} s from the last runs' median" if eta is not None else ""
    return (f"Waiting for the shared model: you are number {ahead + 1} in line "
            f"({ahead} run(s) ahead of yours{estimate})…")


@contextmanager
def queue_turn() -> Iterator[float]:
    """This session's turn on the shared model (``RUN_QUEUE``), with its place in line and an estimate
    from the last runs while it waits, and how long it waited after; yields the seconds waited."""
    waiting = st.empty()
    with RUN_QUEUE.turn(on_wait=lambda ahead: waiting.info(_wait_text(ahead))) as waited_s:
        st.session_state["last_queue_wait_s"] = waited_s
        if waited_s >= 0.1:
            waiting.caption(f"Waited {waited_s:.1f} s for the shared model")
        else:
            waiting.empty()
        yield waited_s


def measured_once(key: tuple, measure: Callable[[int], Any]) -> Shared:
    """``measure(others_waiting)`` run once for every session asking the same ``key`` (``SHARED_RUNS``):
    the first takes its turn in the queue and measures, the others join and wait for its result.
    Use it inside ``run_guarded(what, queue=False)``; ``others_waiting`` is how many runs queued
    behind when the turn came (a long line may ask for fewer timing passes)."""
    joining = st.empty()

    def measure_in_turn() -> Any:
        with queue_turn():
            return measure(RUN_QUEUE.num_waiting)

    viewer = st.session_state.setdefault("shared_runs_viewer", uuid.uuid4().hex)  # this session, in its own state
    shared = SHARED_RUNS.run(
        (*key, backend_choice()), measure_in_turn, viewer=viewer,
        on_join_wait=lambda viewers: joining.info("An identical run is being measured; "
                                                  f"you will see its result ({viewers} viewers so far)…"),
    )
    joining.empty()
    return shared


BUSY_TIMING_RUNS = 3  # timing passes when other runs wait behind this one: never fewer than 3 (a median with a spread)


def timing_runs_for(others_waiting: int) -> int:
    """Timing passes for a run with ``others_waiting`` runs queued behind it: the full count alone, 3 in a line."""
    return TIMING_RUNS if others_waiting == 0 else min(TIMING_RUNS, BUSY_TIMING_RUNS)


def sharing_note(sharing: dict, timing_runs: int) -> str:
    """The caption under a shared or shortened run: who measured it, for how many viewers, and why fewer passes."""
    who = "Joined an identical run another session started" if sharing["joined"] else "Measured by this session"
    note = f"{who}: measured once for {sharing['viewers']} viewer(s)."
    if sharing["waiting_behind"] and timing_runs < TIMING_RUNS:
        note += (f" {timing_runs} timing passes instead of {TIMING_RUNS}: "
                 f"{sharing['waiting_behind']} run(s) were waiting behind it.")
    return note


def free_memory() -> None:
    """Give back what a failed run held: Python garbage and the CUDA caching allocator's blocks."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def progress_callback(total_steps: int, label: str) -> Callable[[int, Any], None]:
    """An ``engine.run(progress=...)`` callback that drives a progress bar: steps done of total, and the phase."""
    bar = st.progress(0.0, text=f"{label}: starting")

    def update(steps_done: int, record) -> None:
        phase = "prefill" if record.num_prefill_tokens else "decode"
        fraction = min(1.0, steps_done / max(total_steps, 1))
        bar.progress(fraction, text=f"{label}: step {steps_done} of ~{total_steps} ({phase}, "
                                    f"{record.num_scheduled_tokens} tokens)")

    return update


@contextmanager
def progress_bar(label: str) -> Iterator[Callable[[float, str], None]]:
    """A progress bar driven by an experiment's (fraction, text) callback; gone when the run ends or fails."""
    bar = st.progress(0.0, text=f"{label}: starting")
    try:
        yield lambda fraction, text: bar.progress(fraction, text=f"{label}: {text}")
    finally:
        bar.empty()
