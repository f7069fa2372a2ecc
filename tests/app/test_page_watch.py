"""The Watch it happen page: it records the three runs on the bundled model and embeds the replay,
the same HTML the download button gives, its root carrying the frame count and its prefill scene the
attention maps of the prefill step."""

import json
import re

from tests.app.pages import open_page


def test_recording_embeds_the_replay_and_offers_the_same_file(bundled):
    app = open_page("watch")
    assert not app.exception
    assert not app.get("iframe")  # nothing to play before a run
    app.slider(key="watch_tokens").set_value(8)
    app.button(key="watch_run").click().run()
    assert not app.exception and not app.error
    frames = app.get("iframe")
    assert len(frames) == 1
    document = frames[0].proto.srcdoc
    count = int(re.search(r'<div id="replay" data-frames="(\d+)"', document).group(1))
    # 8 tokens: one step (step + 30 layers + token) and 8 steps of (step + 30 layers) + the token, then the others
    assert count > 32 + 8 * 31 + 1
    data = json.loads(re.search(r'id="replay-data">(.*?)</script>', document, re.S).group(1))
    attention = data["scenes"][0]["attention"]  # SmolLM2-135M: 30 layers of 9 heads; 8 tokens keep every head
    assert (attention["num_tokens"], attention["layers"], attention["heads"]) == (8, [0, 15, 29], list(range(9)))
    assert "inspection pass" in " ".join(caption.value for caption in app.caption)
    download = app.get("download_button")
    assert len(download) == 1 and "plays offline" in download[0].proto.label
