"""The Your server page without a server (tests/peer runs it against a real vllm serve): hosted mode
keeps the probe off unless the demo allow-lists URLs, and a URL nobody serves is an inline error."""

from tests.app.pages import open_page


def test_hosted_mode_turns_the_probe_off_without_an_allow_list(bundled, monkeypatch):
    monkeypatch.setenv("PREFILLVIZ_HOSTED", "1")
    monkeypatch.delenv("PREFILLVIZ_PROBE_URLS", raising=False)
    app = open_page("your_server", dtype=None)  # hosted mode fixes the dtype
    assert not app.exception
    assert any("Probing a server is off in this hosted demo" in i.value for i in app.info)
    assert not [t for t in app.text_input if t.key == "probe_url"] and not app.button  # nothing to press


def test_hosted_mode_offers_only_the_allow_listed_urls(bundled, monkeypatch):
    monkeypatch.setenv("PREFILLVIZ_HOSTED", "1")
    monkeypatch.setenv("PREFILLVIZ_PROBE_URLS", "http://127.0.0.1:9, http://10.0.0.7:8000")
    app = open_page("your_server", dtype=None)  # hosted mode fixes the dtype
    assert app.selectbox(key="probe_url").options == ["http://127.0.0.1:9", "http://10.0.0.7:8000"]
    app.button(key="probe_run").click().run()
    assert not app.exception
    assert any("Could not reach http://127.0.0.1:9" in e.value for e in app.error)  # allowed, but nothing listens there
