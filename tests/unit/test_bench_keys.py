"""The bench's keys are declared once: the docs' table is printed from them, and the bench
can't return a key that is not declared or leave one out."""

from pathlib import Path

import pytest

from prefillviz.measure.bench_keys import KEY_NAMES, in_order, markdown_table

DOCS = Path(__file__).resolve().parents[2] / "docs" / "BENCHMARKS.md"


def test_the_docs_table_is_the_declared_keys():
    assert markdown_table() in DOCS.read_text(), (
        "docs/BENCHMARKS.md's key table is stale: paste `python -m prefillviz.measure.bench_keys`")


def test_the_bench_json_comes_out_in_the_declared_order():
    values = {name: i for i, name in enumerate(reversed(KEY_NAMES))}
    assert list(in_order(values)) == list(KEY_NAMES)


def test_a_missing_or_undeclared_key_is_an_error():
    values = dict.fromkeys(KEY_NAMES, 0)
    with pytest.raises(KeyError, match="missing \\['quick'\\]"):
        in_order({k: v for k, v in values.items() if k != "quick"})
    with pytest.raises(KeyError, match="not declared \\['speed'\\]"):
        in_order({**values, "speed": 1.0})
