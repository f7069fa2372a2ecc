"""``make run``: Streamlit's server for ``app.py``, with the first page's model made ready from the moment it starts.

``streamlit run app.py`` runs none of the app's code until a first visitor opens a page: only then are torch
and transformers imported and the model prepared (``preparation.py``), while that visitor watches. This
starts the preparation of the model every page opens with (the sidebar's first model, device and dtype),
then Streamlit's own command line, ``streamlit run app.py`` with the arguments given here, in this process:
the pages find the same preparation (one per model, device and dtype, shared by every session), further along
or ready. A Space runs ``streamlit run app.py`` itself; there the first visit starts it, as before.

    python -m prefillviz.ui.start [streamlit run's options, e.g. --server.port 8501]
"""

from __future__ import annotations

import sys
from pathlib import Path

APP = Path(__file__).resolve().parents[2] / "app.py"


def prepare_first_page() -> None:
    """Start preparing the model, device and dtype the sidebar selects first (hosted mode: the allow-listed)."""
    from prefillviz.ui.preparation import preparation
    from prefillviz.ui.settings import device_choices, dtype_choices, model_choices

    preparation(model_choices()[0], device_choices()[0], dtype_choices()[0])


def main(argv: list[str]) -> int:
    from streamlit.web import cli

    prepare_first_page()
    sys.argv = ["streamlit", "run", str(APP), *argv]
    return cli.main()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
