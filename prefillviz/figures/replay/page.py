"""One self-contained HTML file that plays a replay: the data, the player's CSS and JS, all inlined.

Nothing is fetched: no CDN, no font, no chart library (the player draws on canvas with plain JS),
and the page's Content-Security-Policy forbids every request, so it plays the same from a USB stick
on a projector as inside the app (``streamlit.components.v1.html``). The root element carries the
frame count as ``data-frames`` for any test to read.

    <div id="replay" data-frames="N">         the player builds itself in here (player_core.js)
    <script type="application/json">          the replay's data (build.replay_payload)
    <script> player_core.js, the attention map, then each scene kind (kv, schedule, prefix), then Replay.start()
"""

from __future__ import annotations

import html
import json
import tempfile
from pathlib import Path
from typing import Any

from prefillviz.engine.errors import PrefillVizError
from prefillviz.instrument.trace_io import writable_folder

ASSETS = Path(__file__).parent
SCRIPTS = ("player_core.js", "player_attention.js", "player_kv.js", "player_schedule.js", "player_prefix.js")
CSP = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:"


def _script_json(payload: dict[str, Any]) -> str:
    """JSON safe inside a <script> element: every "<" escaped, so no token's text can end it or open a comment."""
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).replace("<", "\\u003c")


def replay_html(payload: dict[str, Any], presenter: bool = False) -> str:
    """The replay as one HTML document (a string).

    Args:
        payload: ``build.replay_payload``'s dict.
        presenter: open in presenter mode (larger text and controls; the page's button toggles it).
    """
    css = (ASSETS / "player.css").read_text(encoding="utf-8")
    scripts = "\n".join(f"<script>\n{(ASSETS / name).read_text(encoding='utf-8')}\n</script>" for name in SCRIPTS)
    mode = ' class="presenter"' if presenter else ""
    title = html.escape(f"Prefill replay: {payload['model_id']}, {payload['num_tokens']} tokens")
    return (
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
        f"<meta http-equiv=\"Content-Security-Policy\" content=\"{CSP}\">\n"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
        f"<title>{title}</title>\n<style>\n{css}</style></head>\n<body>\n"
        f"<div id=\"replay\" data-frames=\"{payload['num_frames']}\"{mode}></div>\n"
        f"<script type=\"application/json\" id=\"replay-data\">{_script_json(payload)}</script>\n"
        f"{scripts}\n<script>Replay.start();</script>\n</body></html>\n"
    )


def write_replay(document: str, path: str | Path) -> Path:
    """Write the HTML ``document`` to ``path`` (its folder created if needed), all or nothing.

    Raises:
        PrefillVizError: the file can't be written there (read-only, a folder in the way, no permission).
    """
    path = Path(path)
    try:
        if path.is_dir():
            raise IsADirectoryError(21, "a folder of that name is in the way")
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=path.parent, prefix=".replay-", suffix=".html",
                                         delete=False) as handle:
            handle.write(document)
        Path(handle.name).replace(path)
    except OSError as error:
        if "handle" in locals():
            Path(handle.name).unlink(missing_ok=True)
        reason = error.strerror or type(error).__name__
        raise PrefillVizError(f"Can't write {path} ({reason}): pick a file in a folder you can write to.") from None
    return path


def check_writable(path: str | Path) -> None:
    """Refuse an ``--out`` that can't be written, before anything runs (an existing file is left as it is).

    Raises:
        PrefillVizError: a folder in the way, or a folder that can't be made or written.
    """
    path = Path(path)
    if path.is_dir():
        raise PrefillVizError(f"Can't write {path} (a folder of that name is in the way): name an .html file.")
    writable_folder(path.parent)
