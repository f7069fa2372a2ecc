"""The model made ready behind the page, in a thread of its own: loaded, this machine's kernels timed,
warmed up through the engine.

A cold start (an empty cache, a fresh server, a Space's restart) takes seconds. No page waits for it
with a blank main area: ``shell.page_frame`` draws a progress bar that names the stage and about how
long is left, the page draws its title, text and controls at once, its run buttons say they are
waiting (``shell.run_button``), and when the model is ready the page runs again
(``shell.finish_page``, from ``views/navigation.py``).

On a machine's first start the kernels are timed on the step shapes the first page's first run needs
(``FIRST_BUCKETS``); the page is ready after the warm-up, and the other shapes are timed after it, one at
a time, in the run queue's turn whenever no session's run is waiting (never beside one).

One preparation per model id, device and dtype, shared by every session (the model is shared, as
``st.cache_resource`` shares it); the last ``KEPT`` are kept. A failed one is forgotten once a page
has shown its error, so the next visit tries again. Each stage's time is kept per machine
(``$PREFILLVIZ_CACHE/startup_seconds.json``): the next start says how long is left from what this
machine took, and ``scripts/first_minute.py`` reads it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict

from prefillviz.backends.dispatch_tables import time_next_bucket
from prefillviz.engine.errors import PrefillVizError
from prefillviz.experiments.warm_up import prepare_dispatch, warm_up
from prefillviz.loading import bundled
from prefillviz.loading.model_registry import BUNDLED_MODEL_ID
from prefillviz.loading.models import LoadedModel, load_model
from prefillviz.machine.devices import cache_root
from prefillviz.ui.run_queue import RUN_QUEUE

logger = logging.getLogger(__name__)
FIRST_BUCKETS = ("decode", "prefill_128")  # the Prefill page's preset prompt, its timing pass and its decodes
IDLE_BEFORE_TIMING_S = 3.0  # the other step shapes are timed one at a time, once no run has asked for this long
KEPT = 2  # models kept ready at once (each holds its weights)
STAGES = {  # stage -> (what the progress bar says, its seconds on a 2-core CPU where this machine has not timed it)
    "dequantize": ("dequantizing the bundled model (first start only)", 4.0),
    "load": ("loading the model", 2.0),
    "kernels": ("timing this machine's kernels (first start only)", 3.0),
    "warm up": ("warming up: the first runs of each kind, so that no timed run is a cold one", 2.0),
}


class Preparation:
    """One model being made ready; its stage, and how long is left, for the page that waits."""

    def __init__(self, model_id: str, device: str, dtype: str) -> None:
        self.model_id, self.device, self.dtype = model_id, device, dtype
        self.loaded: LoadedModel | None = None
        self.error: str | None = None
        first_start = model_id == BUNDLED_MODEL_ID and bundled.bundled_package_installed() and not bundled.cache_ready()
        self.stages = (["dequantize"] if first_start else []) + ["load", "kernels", "warm up"]
        self.stage, self.stage_started = self.stages[0], time.monotonic()
        self.durations: dict[str, float] = {}
        self.expected = {stage: seconds for stage, (_, seconds) in STAGES.items()} | measured_seconds()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"prepare {model_id}", daemon=True)
        self.thread.start()

    def _enter(self, stage: str) -> None:
        now = time.monotonic()
        self.durations[self.stage] = now - self.stage_started
        self.stage, self.stage_started = stage, now

    def _run(self) -> None:
        try:
            loaded = load_model(self.model_id, device=self.device, dtype=self.dtype, progress=self._loader_said)
            self._enter("kernels")
            with RUN_QUEUE.turn():  # measured now (the first page's shapes first), or read from this machine's cache
                prepare_dispatch(loaded, buckets=FIRST_BUCKETS)
            self._enter("warm up")
            with RUN_QUEUE.turn():  # never beside another session's timed run
                loaded.warm_up_s = warm_up(loaded)
            self._enter("ready")
            self.loaded = loaded
            keep_seconds(self.durations)
        except PrefillVizError as error:
            self.error = str(error)
        except Exception as error:  # noqa: BLE001 -- shown to the person, the traceback to the log
            logger.exception("preparing %s failed", self.model_id)
            self.error = f"Preparing {self.model_id} failed unexpectedly ({type(error).__name__}: {error})."
        finally:
            self.done.set()
        if self.loaded is not None:
            self._time_the_other_shapes()

    def _time_the_other_shapes(self) -> None:
        """The step shapes a first start left for later, one at a time in the run queue's turn, whenever no run has
        asked for the model for ``IDLE_BEFORE_TIMING_S`` (a run of a shape not timed yet meanwhile runs the nearest
        timed shape's choice, and says so)."""
        try:
            while True:
                while not RUN_QUEUE.wait_idle(IDLE_BEFORE_TIMING_S, timeout_s=60.0):
                    pass
                with RUN_QUEUE.turn():
                    if not time_next_bucket(self.loaded.model):
                        return
        except Exception:  # noqa: BLE001 -- a later `tune` or Measure again times them; the traceback to the log
            logger.exception("timing the other step shapes of %s failed", self.model_id)

    def _loader_said(self, message: str) -> None:
        """The loader's progress: past the dequantizing, the model loads (from the copy just saved)."""
        if self.stage == "dequantize" and message.startswith("saving a safetensors copy"):
            self._enter("load")

    @property
    def ready(self) -> bool:
        return self.loaded is not None

    def seconds_left(self) -> float:
        """About how many seconds are left: what the current stage is expected to take more, and the stages after it."""
        if self.done.is_set() or self.stage not in self.stages:
            return 0.0
        later = self.stages[self.stages.index(self.stage) + 1 :]
        current = max(0.0, self.expected[self.stage] - (time.monotonic() - self.stage_started))
        return current + sum(self.expected[stage] for stage in later)

    def fraction(self) -> float:
        """The share of the expected time that has passed (for the progress bar), below 1 until ready."""
        if self.done.is_set():
            return 1.0
        total = sum(self.expected[stage] for stage in self.stages)
        return min(0.95, max(0.0, 1 - self.seconds_left() / total))

    def text(self) -> str:
        """The progress bar's line: the stage, which of how many, and about how long is left."""
        what = STAGES.get(self.stage, ("ready", 0.0))[0]
        number = self.stages.index(self.stage) + 1 if self.stage in self.stages else len(self.stages)
        left = self.seconds_left()
        when = f"about {left:.0f} s left" if left >= 1 else "a few more seconds"
        return f"Preparing {self.model_id}, step {number} of {len(self.stages)}: {what} ({when})"


def seconds_file():
    return cache_root() / "startup_seconds.json"


def measured_seconds() -> dict[str, float]:
    """Each stage's seconds the last time this machine went through it ({} before the first time)."""
    try:
        data = json.loads(seconds_file().read_text())
    except (OSError, ValueError):
        return {}
    known = {stage: seconds for stage, seconds in data.items() if stage in STAGES}
    return {stage: float(seconds) for stage, seconds in known.items() if isinstance(seconds, int | float)}


def keep_seconds(durations: dict[str, float]) -> None:
    """Keep the stages' seconds for the next start's estimate (a disk that can't be written only costs that)."""
    try:
        seconds_file().parent.mkdir(parents=True, exist_ok=True)
        seconds_file().write_text(json.dumps(measured_seconds() | {k: round(v, 3) for k, v in durations.items()}))
    except OSError:
        pass


_preparations: OrderedDict[tuple[str, str, str], Preparation] = OrderedDict()
_lock = threading.Lock()


def preparation(model_id: str, device: str, dtype: str) -> Preparation:
    """The model's preparation, started on the first ask and shared by every session after."""
    key = (model_id, device, dtype)
    with _lock:
        prepared = _preparations.get(key)
        if prepared is None:
            prepared = _preparations[key] = Preparation(model_id, device, dtype)
            while len(_preparations) > KEPT:  # the oldest model goes (its weights with it, once no page holds it)
                _preparations.popitem(last=False)
        _preparations.move_to_end(key)
        return prepared


def forget(prepared: Preparation) -> None:
    """Drop a failed preparation, so that the next visit tries again."""
    with _lock:
        key = (prepared.model_id, prepared.device, prepared.dtype)
        if _preparations.get(key) is prepared:
            del _preparations[key]
