"""The pages' "same tokens either way" block: a pass/FAIL table of each request's tokens, and a verdict.

Chunked prefill and the prefix cache each compare every request's output with a reference run
(``experiments/outputs.py``); this draws that comparison the same way on both pages.
"""

from __future__ import annotations

from collections.abc import Callable

import streamlit as st

from prefillviz.experiments.outputs import OutputCheck


def same_tokens_block(
    checks: list[tuple[str, OutputCheck]],
    shown: Callable[[list[int]], str],
    columns: tuple[str, str],
    key: str,
    identical_text: str,
    why_they_may_differ: str,
) -> None:
    """A table with one row per check, then a success line or a warning naming the requests that differ.

    Args:
        checks: (the run's name, or "" when there is one run, its check).
        shown: how a token-id list is written (decoded text, or ids when another model is loaded now).
        columns: the reference run's and the run's column titles.
        key: the table's widget key.
        identical_text: the success line when every check passes.
        why_they_may_differ: appended to the warning that names the failing requests.
    """
    reference, run = columns
    rows = []
    for run_name, check in checks:
        row = {"run": run_name} if run_name else {}
        row |= {"request": check.request_id, "new tokens": len(check.tokens), reference: shown(check.tokens_reference),
                run: shown(check.tokens)}
        rows.append(row | {"identical": "pass" if check.identical else "FAIL"})
    st.dataframe(rows, hide_index=True, key=key)
    failed = [f"{check.request_id} ({run_name})" if run_name else check.request_id
              for run_name, check in checks if not check.identical]
    if failed:
        st.warning(f"Outputs differ for {', '.join(failed)}. {why_they_may_differ}")
    else:
        st.success(identical_text)
