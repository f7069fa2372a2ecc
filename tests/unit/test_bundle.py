"""Run bundles refuse what they did not write."""

import io
import json
import zipfile

import pytest

from prefillviz.engine.errors import PrefillVizError
from prefillviz.instrument.bundle import read_bundle


def zipped(files: dict) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def test_junk_is_not_a_bundle():
    with pytest.raises(PrefillVizError, match="not a prefillviz run bundle"):
        read_bundle(b"this is not a zip")
    with pytest.raises(PrefillVizError, match="not a prefillviz run bundle"):
        read_bundle(zipped({"other.txt": "hello"}))


def test_a_crafted_trace_name_is_refused():
    crafted = zipped({"meta.json": json.dumps({"traces": ["../../etc"]}), "../../etc/trace.json": "{}"})
    with pytest.raises(PrefillVizError, match="invalid trace"):
        read_bundle(crafted)
