"""The engine stays a textbook a student reads in one sitting: at most 2,000 lines of Python, no C++,
and none of the speed lab's words (those live in ``prefillviz/backends/``)."""

import re
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[2] / "prefillviz" / "engine"
MAX_LINES = 2000
SPEED_LAB_WORDS = ("onednn", "brgemm", "dispatch table", "huge page", "mallopt")


def test_the_engine_is_at_most_2000_lines_of_python_and_no_cpp():
    sources = sorted(ENGINE.rglob("*.py"))
    lines = {path.name: len(path.read_text().splitlines()) for path in sources}
    assert sum(lines.values()) <= MAX_LINES, f"{sum(lines.values())} lines: {lines}"
    assert not [p for p in ENGINE.rglob("*") if p.suffix in (".cpp", ".cc", ".c", ".h", ".hpp")]


def test_the_engine_never_names_the_speed_lab():
    for path in ENGINE.rglob("*.py"):
        text = path.read_text().lower()
        found = [word for word in SPEED_LAB_WORDS if re.search(re.escape(word), text)]
        assert not found, f"{path.name} names {found}"


def test_the_readme_and_the_benchmarks_stay_short_references():
    root = ENGINE.parents[1]
    assert len((root / "README.md").read_text().splitlines()) <= 150
    assert len((root / "docs" / "BENCHMARKS.md").read_text().splitlines()) <= 250
