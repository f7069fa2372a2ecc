"""The lessons' glossary (``assets/lessons/glossary.md``): each term a student meets, defined in a
sentence or two, shown beside every lesson step.

    # Glossary
    ## token              <- one section a term, in the order a student meets them
    A piece of text ...
"""

from __future__ import annotations

import re
from pathlib import Path

from prefillviz.lessons.spec import LESSONS_DIR, LessonError

GLOSSARY_FILE = "glossary.md"


def load_glossary(folder: Path | str = LESSONS_DIR) -> dict[str, str]:
    """Term -> definition, in file order.

    Raises:
        LessonError: the file is missing, or a term has no definition.
    """
    path = Path(folder) / GLOSSARY_FILE
    if not path.is_file():
        raise LessonError(f"{path}: the lessons' glossary is missing.")
    parts = re.split(r"^## +(.+)$", path.read_text(encoding="utf-8"), flags=re.MULTILINE)
    terms = {}
    for term, text in zip(parts[1::2], parts[2::2]):
        definition = " ".join(text.split())
        if not definition:
            raise LessonError(f"{path.name}: the term {term.strip()!r} has no definition.")
        terms[term.strip()] = definition
    return terms


def glossary_markdown(terms: dict[str, str]) -> str:
    """The glossary as one markdown list: **term**: definition."""
    return "\n".join(f"- **{term}**: {definition}" for term, definition in terms.items())
