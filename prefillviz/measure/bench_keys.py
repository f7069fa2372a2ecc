"""The keys of ``python -m prefillviz bench --json``, declared once as data (``bench_keys.toml``):
the bench fills exactly these, in this order; the tests check its JSON against them; the key table of
``docs/BENCHMARKS.md`` is printed from them (``python -m prefillviz.measure.bench_keys``) and a
test keeps it so."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class BenchKey:
    name: str
    meaning: str
    # "setting": what was measured; "figure": a measured number; "vllm": a figure against vLLM (null without it);
    # "record"
    kind: str = "figure"


KEYS_FILE = Path(__file__).with_name("bench_keys.toml")
BENCH_KEYS: tuple[BenchKey, ...] = tuple(BenchKey(**key) for key in tomllib.loads(KEYS_FILE.read_text())["key"])
KEY_NAMES: tuple[str, ...] = tuple(key.name for key in BENCH_KEYS)
VLLM_KEYS: tuple[str, ...] = tuple(key.name for key in BENCH_KEYS if key.kind == "vllm")


def in_order(values: dict) -> dict:
    """``values`` in the declared order; raises ``KeyError`` naming what is missing or not declared."""
    missing, extra = [k for k in KEY_NAMES if k not in values], [k for k in values if k not in KEY_NAMES]
    if missing or extra:
        raise KeyError(f"the bench's keys differ from BENCH_KEYS: missing {missing}, not declared {extra}")
    return {name: values[name] for name in KEY_NAMES}


def markdown_table() -> str:
    """The key table of ``docs/BENCHMARKS.md``."""
    rows = ["| key | what it measures |", "|---|---|"]
    rows += [f"| `{key.name}` | {key.meaning} |" for key in BENCH_KEYS]
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
