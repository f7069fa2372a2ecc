"""Changes to the one shared model, made while any thread needs them and undone after.

The app's sessions are threads of one process that share one cached model
(``st.cache_resource``), so a change to the model (its attention implementation, the packed
linears' forward) is process-wide, whichever thread makes it. ``shared_setting`` makes a
change when the first thread enters and undoes it when the last one leaves, under one lock:
overlapping engine forwards never undo each other's change, and once none runs the model is
exactly as it was loaded. What must differ per thread is chosen per call, not by the change:
which linears run packed (``packed_weights``, a thread-local), and whether attention is the
engine's (``attention``: only the engine's call passes its metadata), so a plain forward in
another thread meanwhile computes what the stock model does.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_held: dict[tuple[int, str], tuple[int, Callable[[], None]]] = {}  # (id(model), name) -> (threads inside, undo)


@contextmanager
def shared_setting(model: object, name: str, apply: Callable[[], Callable[[], None]]) -> Iterator[None]:
    """Hold the change ``name`` of ``model`` inside the block.

    Args:
        model: the shared model.
        name: which change (one count per model and name).
        apply: makes the change and returns the function that undoes it; called only by the
            first thread in, the undo only by the last one out (even on error).
    """
    key = (id(model), name)
    with _lock:
        users, undo = _held.get(key, (0, None))
        if users == 0:
            undo = apply()
        _held[key] = (users + 1, undo)
    try:
        yield
    finally:
        with _lock:
            users, undo = _held.pop(key)
            if users > 1:
                _held[key] = (users - 1, undo)
            else:
                undo()

