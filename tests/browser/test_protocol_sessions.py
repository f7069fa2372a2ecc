"""The load test's client (scripts/streamlit_session.py) against the real server: two sessions over
Streamlit's websocket protocol, one runs its own prompt, the other never sees it."""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from streamlit_session import StreamlitSession  # noqa: E402


async def two_sessions(url: str) -> tuple[str, str, int]:
    async with StreamlitSession(url, timeout_s=240) as mine, StreamlitSession(url, timeout_s=240) as other:
        await mine.wait_for(lambda page: page.widget("button", "Run prefill"))  # a fresh server loads the model first
        await mine.set(mine.widget("text_area", "Prompt"), string_value="Code word PELICAN41. The capital of France is")
        await mine.click("Run prefill")
        await mine.wait_for(re.compile(r"Last run: “Code word PELICAN41"))
        await other.rerun()
        return mine.text(widgets=False), other.text(), mine.count("plotly_chart")


def test_a_protocol_session_runs_its_prompt_and_another_never_sees_it(app_url):
    mine, other, charts = asyncio.run(two_sessions(app_url))
    assert charts >= 3  # the page drew its charts for this session
    assert "PELICAN41" in mine  # in the run's own caption and charts, not only in the prompt box
    assert "PELICAN41" not in other
