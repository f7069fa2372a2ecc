"""One Streamlit session driven over Streamlit's own websocket protocol, without a browser.

A load test of 30 students on a 2-core machine can't afford 30 headless Chromiums: each renders
every Plotly chart of the page, and together they starve the server they are meant to load. This
client speaks to the same endpoint a browser does (``/_stcore/stream``) with Streamlit's own
protobuf messages (``streamlit.proto``) and the ``websockets`` client: the server runs a real
session for it, with its own session state, widgets, callbacks and fragments. It reads the
elements each run sends, and "clicks" a widget the way the browser does, by sending the widget's
id with its new value in a rerun request. What it skips is only the rendering.

Like the browser, it keeps the page's query string (a room link's ``?room=...&member=...``) and
reruns a timed fragment (``st.fragment(run_every=...)``) at the interval the server asks for.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
import time
from urllib.parse import urlsplit

from streamlit.proto.BackMsg_pb2 import BackMsg
from streamlit.proto.ForwardMsg_pb2 import ForwardMsg
from streamlit.proto.WidgetStates_pb2 import WidgetState
from websockets.asyncio.client import connect

FULL_RUN_DONE = ForwardMsg.FINISHED_SUCCESSFULLY
INPUTS = {"text_area", "text_input", "chat_input", "number_input", "selectbox", "multiselect"}


def _strings(message, out: list[str]) -> None:
    """Every string of a protobuf message, nested ones included (bytes decoded: an Arrow table's text)."""
    for field, value in message.ListFields():
        values = value if field.is_repeated else [value]
        for item in values:
            if isinstance(item, str):
                out.append(item)
            elif isinstance(item, bytes):
                out.append(item.decode("utf-8", errors="ignore"))
            elif hasattr(item, "ListFields"):
                _strings(item, out)


class StreamlitSession:
    """A session of the app at ``url`` (``http://host:port/page?query``), as one browser tab would hold it."""

    def __init__(self, url: str, timeout_s: float = 300.0, name: str = "") -> None:
        parts = urlsplit(url)
        self.name, self._begun = name, time.perf_counter()
        # every message sent and every run's end, on stderr
        self._trace = bool(os.environ.get("STREAMLIT_SESSION_TRACE"))
        self.stream = f"ws://{parts.netloc}/_stcore/stream"
        self.page_name = parts.path.strip("/")
        self.query_string = parts.query
        self.timeout_s = timeout_s
        self.page_script_hash = ""
        self.elements: dict[tuple[int, ...], object] = {}  # delta path -> Element, as the page shows it
        self._seen: set[tuple[int, ...]] = set()
        # widgets this client has set (the browser sends them with every rerun)
        self._values: dict[str, WidgetState] = {}
        self._finished = asyncio.Queue()
        self._timers: dict[str, asyncio.Task] = {}
        self._intervals: dict[str, float] = {}
        self._socket = None
        self._reader: asyncio.Task | None = None
        self.closed = ""  # why the connection closed, once it has

    async def __aenter__(self) -> StreamlitSession:
        self._socket = await connect(self.stream, subprotocols=["streamlit"], max_size=None,
                                     open_timeout=self.timeout_s, ping_interval=None)
        self._reader = asyncio.create_task(self._read())
        await self.rerun()  # what a browser sends when it opens the page
        return self

    async def __aexit__(self, *exc) -> None:
        for timer in self._timers.values():
            timer.cancel()
        if self._reader is not None:
            self._reader.cancel()
        if self._socket is not None:
            await self._socket.close()

    # ------------------------------------------------------------------ what the server sends
    async def _read(self) -> None:
        try:
            await self._read_frames()
        finally:  # the server closed the connection (or this client did): no run will end any more
            self.closed = f"the connection closed ({self._socket.close_code}, {self._socket.close_reason!r})"
            self._log(self.closed)
            self._finished.put_nowait(None)

    async def _read_frames(self) -> None:
        async for frame in self._socket:
            message = ForwardMsg()
            message.ParseFromString(frame)
            kind = message.WhichOneof("type")
            if kind == "new_session":
                self.page_script_hash = message.new_session.page_script_hash or self.page_script_hash
                self._seen = set()
            elif kind == "delta" and message.delta.WhichOneof("type") == "new_element":
                path = tuple(message.metadata.delta_path)
                self.elements[path] = message.delta.new_element
                self._seen.add(path)
            elif kind == "navigation":  # st.navigation: the page this run showed, to ask for it again
                self.page_script_hash = message.navigation.page_script_hash or self.page_script_hash
            elif kind == "page_info_changed":
                self.query_string = message.page_info_changed.query_string
            elif kind == "auto_rerun":
                fragment, interval = message.auto_rerun.fragment_id, message.auto_rerun.interval
                if self._intervals.get(fragment) != interval:  # a new timer, or a new interval for it
                    if fragment in self._timers:
                        self._timers[fragment].cancel()
                    self._timers[fragment] = asyncio.create_task(self._every(interval, fragment))
                    self._intervals[fragment] = interval
            elif kind == "stop_auto_rerun":
                for timer in self._timers.values():
                    timer.cancel()
                self._timers.clear()
                self._intervals.clear()
            elif kind == "script_finished":
                if message.script_finished == FULL_RUN_DONE:  # the page is whole: drop what this run didn't draw
                    self.elements = {path: e for path, e in self.elements.items() if path in self._seen}
                self._log(f"run ended: {ForwardMsg.ScriptFinishedStatus.Name(message.script_finished)}")
                self._finished.put_nowait(message.script_finished)

    async def _every(self, interval_s: float, fragment_id: str) -> None:
        while True:
            await asyncio.sleep(interval_s)
            await self._send(fragment_id=fragment_id, auto=True)

    # ------------------------------------------------------------------ what this client sends
    async def _send(self, extra: list[WidgetState] = (), fragment_id: str = "", auto: bool = False) -> None:
        back = BackMsg()
        state = back.rerun_script
        state.query_string = self.query_string
        state.page_script_hash = self.page_script_hash
        state.page_name = "" if self.page_script_hash else self.page_name
        state.fragment_id = fragment_id
        state.is_auto_rerun = auto
        sent = {w.id: w for w in self._values.values()}
        sent.update({w.id: w for w in extra})
        state.widget_states.widgets.extend(sent.values())
        self._log(f"sent: {'timed fragment rerun' if auto else 'rerun'} {[w.id.split('-', 2)[-1] for w in extra]}")
        await self._socket.send(back.SerializeToString())

    def _log(self, what: str) -> None:
        if self._trace:
            print(f"{time.perf_counter() - self._begun:7.1f} s  {self.name}: {what}", file=sys.stderr, flush=True)

    async def rerun(self, extra: list[WidgetState] = ()) -> None:
        """Send a rerun (with the widgets' values) and wait until a full run of the page has finished."""
        while not self._finished.empty():
            self._finished.get_nowait()
        if self.closed:
            raise ConnectionError(self.closed)
        await self._send(extra)
        async with asyncio.timeout(self.timeout_s):
            while (status := await self._finished.get()) != FULL_RUN_DONE:
                if status is None:
                    raise ConnectionError(self.closed)

    # ------------------------------------------------------------------ the page
    def text(self, widgets: bool = True) -> str:
        """All the text the page shows (a chart's spec and a table's cells included); ``widgets=False``
        leaves out the input widgets (a text box's own value)."""
        out: list[str] = []
        for path in sorted(self.elements):
            element = self.elements[path]
            if widgets or element.WhichOneof("type") not in INPUTS:
                _strings(element, out)
        return "\n".join(out)

    def count(self, kind: str) -> int:
        """How many elements of ``kind`` ("plotly_chart", "button", ...) the page shows."""
        return sum(1 for element in self.elements.values() if element.WhichOneof("type") == kind)

    def widget(self, kind: str, label: str | re.Pattern | None = None, key: str | None = None):
        """The first widget of ``kind`` ("button", "slider", ...) whose label is ``label`` (or matches it),
        or whose ``key=`` starts with ``key`` (Streamlit ends a keyed widget's id with its key)."""
        for path in sorted(self.elements):
            element = self.elements[path]
            if element.WhichOneof("type") == kind:
                inner = getattr(element, kind)
                if key is not None:
                    if inner.id.split("-", 2)[-1].startswith(key):
                        return inner
                elif label.search(inner.label) if isinstance(label, re.Pattern) else inner.label == label:
                    return inner
        return None

    async def click(self, label: str | re.Pattern) -> None:
        button = self.widget("button", label)
        if button is None:
            raise LookupError(f"no button {label!r} on the page")
        await self.rerun([WidgetState(id=button.id, trigger_value=True)])

    async def set(self, widget, **value) -> None:
        """Give ``widget`` (from :meth:`widget`) a value (``string_value="..."``,
        ``string_array_value={"data": [...]}``) and rerun, as the browser does when a widget changes."""
        state = WidgetState(id=widget.id, **value)
        self._values[widget.id] = state
        await self.rerun()

    async def wait_for(self, found, every_s: float = 0.5):
        """Wait until the page shows what ``found`` looks for: a text, a pattern, or a test of this session
        (returning something true). The page changes only when the server reruns it (a timed fragment does)."""
        if isinstance(found, str):
            found = (lambda page, text=found: text in page.text())
        elif isinstance(found, re.Pattern):
            found = (lambda page, pattern=found: pattern.search(page.text()))
        async with asyncio.timeout(self.timeout_s):
            while not (answer := found(self)):
                if self.closed:
                    raise ConnectionError(self.closed)
                await asyncio.sleep(every_s)
        return answer
