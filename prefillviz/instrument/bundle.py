"""A whole run as one .zip file, loadable later without the model.

    bundle.zip
      meta.json          what the run was (prompt, token texts, model, settings)
      <name>/trace.json  one trace folder per pass (see trace_io), e.g. timing/, inspection/
      <name>/arrays.npz

Reading never extracts paths from the archive: only the member names this module writes
are read, so a crafted zip can't write outside a temporary folder.
"""

from __future__ import annotations

import io
import json
import re
import tempfile
import zipfile
from pathlib import Path

from prefillviz.engine.errors import PrefillVizError
from prefillviz.engine.trace import Trace
from prefillviz.instrument.trace_io import load_trace, save_trace

TRACE_FILES = ("trace.json", "arrays.npz", "chrome_trace.json")
_NAME = re.compile(r"^[a-z_]{1,32}$")


def bundle_bytes(traces: dict[str, Trace], meta: dict) -> bytes:
    """Zip ``traces`` (name -> Trace) and ``meta`` (JSON-ready) into bytes."""
    buffer = io.BytesIO()
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("meta.json", json.dumps({**meta, "traces": sorted(traces)}))
        for name, trace in traces.items():
            if not _NAME.match(name):
                raise ValueError(f"bad trace name {name!r}")
            folder = save_trace(trace, Path(tmp) / name)
            for file in TRACE_FILES:
                if (folder / file).is_file():
                    archive.write(folder / file, f"{name}/{file}")
    return buffer.getvalue()


def read_bundle(data: bytes) -> tuple[dict[str, Trace], dict]:
    """The traces and meta of a bundle made by ``bundle_bytes``.

    Raises:
        PrefillVizError: not a prefillviz bundle, or damaged.
    """
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive, tempfile.TemporaryDirectory() as tmp:
            meta = json.loads(archive.read("meta.json"))
            traces = {}
            for name in meta.get("traces", []):
                if not isinstance(name, str) or not _NAME.match(name):
                    raise PrefillVizError(f"The bundle names an invalid trace {name!r}.")
                folder = Path(tmp) / name
                folder.mkdir()
                for file in TRACE_FILES:
                    if f"{name}/{file}" in archive.namelist():
                        (folder / file).write_bytes(archive.read(f"{name}/{file}"))
                traces[name] = load_trace(folder)
                if traces[name].profile is not None:
                    traces[name].profile.chrome_trace_path = ""  # the temporary copy is gone; its bytes are kept
            return traces, meta
    except (zipfile.BadZipFile, KeyError, json.JSONDecodeError) as error:
        raise PrefillVizError(f"This file is not a prefillviz run bundle ({error}).") from error
