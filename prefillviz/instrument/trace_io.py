"""Save a ``Trace`` to a folder and load it back, without the model.

    DIR/trace.json    every field, arrays replaced by {"__array__": "a12"}
    DIR/arrays.npz    the arrays (queries, keys, KV write log, norms, logits)
    DIR/chrome_trace.json   the profiler's trace, when the run was profiled

Dataclasses are written as {"__type__": "StepRecord", ...} and rebuilt from the known
trace classes only, so loading never imports or runs anything named in the file.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import tempfile
from pathlib import Path

import numpy as np

from prefillviz.engine import trace as trace_module
from prefillviz.engine.errors import PrefillVizError
from prefillviz.engine.scheduler import ScheduledChunk
from prefillviz.instrument import records

TRACE_CLASSES = {
    cls.__name__: cls
    for cls in (
        trace_module.Trace,
        trace_module.StepRecord,
        trace_module.RequestRecord,
        records.LayerTimes,
        records.KVWriteRecord,
        records.CapturedQK,
        records.ProfileRecord,
        ScheduledChunk,
    )
}
FORMAT_VERSION = 1


def _encode(value, arrays: dict[str, np.ndarray]):
    if isinstance(value, np.ndarray):
        key = f"a{len(arrays)}"
        arrays[key] = value
        return {"__array__": key}
    if dataclasses.is_dataclass(value):
        encoded = {"__type__": type(value).__name__}
        for field in dataclasses.fields(value):
            encoded[field.name] = _encode(getattr(value, field.name), arrays)
        return encoded
    if isinstance(value, dict):
        return {str(k): _encode(v, arrays) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_encode(v, arrays) for v in value]
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    return value


def _decode(value, arrays):
    if isinstance(value, dict):
        if "__array__" in value:
            return arrays[value["__array__"]]
        if "__type__" in value:
            cls = TRACE_CLASSES.get(value["__type__"])
            if cls is None:
                raise PrefillVizError(f"This trace file names an unknown record type {value['__type__']!r}.")
            names = {field.name for field in dataclasses.fields(cls)}
            return cls(**{k: _decode(v, arrays) for k, v in value.items() if k in names})
        return {k: _decode(v, arrays) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v, arrays) for v in value]
    return value


def writable_folder(directory: str | Path) -> Path:
    """``directory``, created if needed, once a file could be written in it.

    Raises:
        PrefillVizError: it can't be made or written (read-only, a file in the way, ``/proc``, no permission).
    """
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".prefillviz-write-check-"):
            pass
    except OSError as error:
        reason = error.strerror or type(error).__name__
        raise PrefillVizError(f"Can't write to {directory} ({reason}): pick a folder you can write to.") from None
    return directory


def save_trace(trace: trace_module.Trace, directory: str | Path) -> Path:
    """Write ``trace`` into ``directory`` (created if needed); returns the folder.

    Raises:
        PrefillVizError: the folder can't be written.
    """
    directory = writable_folder(directory)
    arrays: dict[str, np.ndarray] = {}
    data = {"format_version": FORMAT_VERSION, "trace": _encode(trace, arrays)}
    if trace.profile is not None:
        profile = data["trace"]["profile"]
        del profile["chrome_trace_gz"]  # bytes: written as its own file
        profile["chrome_trace_path"] = ""
        if trace.profile.chrome_trace_gz:
            (directory / "chrome_trace.json").write_bytes(trace.profile.chrome_trace_json())
            profile["chrome_trace_path"] = "chrome_trace.json"
    (directory / "trace.json").write_text(json.dumps(data))
    np.savez_compressed(directory / "arrays.npz", **arrays)
    return directory


def load_trace(directory: str | Path) -> trace_module.Trace:
    """Read a trace written by ``save_trace``.

    Raises:
        PrefillVizError: the folder holds no trace, or one this version can't read.
    """
    directory = Path(directory)
    try:
        data = json.loads((directory / "trace.json").read_text())
        with np.load(directory / "arrays.npz", allow_pickle=False) as npz:
            arrays = {key: npz[key] for key in npz.files}
    except (OSError, ValueError) as error:
        raise PrefillVizError(f"No readable trace in {directory}: {error}") from error
    if data.get("format_version") != FORMAT_VERSION:
        raise PrefillVizError(
            f"Trace format {data.get('format_version')} is not supported (expected {FORMAT_VERSION})."
        )
    trace = _decode(data["trace"], arrays)
    if trace.profile is not None:  # only the folder's own chrome_trace.json: never a path the file names
        path = directory / "chrome_trace.json"
        trace.profile.chrome_trace_path = str(path) if path.is_file() else ""
        if path.is_file():
            trace.profile.chrome_trace_gz = gzip.compress(path.read_bytes(), 6)
    return trace


def trace_summary(trace: trace_module.Trace) -> dict:
    """The trace's JSON-ready scalars and lists (no arrays): what a saved and reloaded trace must keep."""
    data = dataclasses.asdict(trace)
    data.pop("captured_qk")
    for step, record in zip(data["steps"], trace.steps):
        step["num_scheduled_tokens"] = record.num_scheduled_tokens
        step.pop("kv_writes")
        step.pop("hidden_norms")
    for request in data["requests"].values():
        request.pop("first_token_logits")
    return data
