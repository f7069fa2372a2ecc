"""The Guided lessons page's class room: start or join one, follow the teacher's step, the class's
predictions next to the measured answer (``rooms.py`` keeps the rooms).

A session's place in a room is its link: ``?room=CODE&member=ID`` (the member id is random), so a
student who reloads the page stays in the room, counted once. The join link the teacher shows
carries the code only.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass

import streamlit as st

from prefillviz import lessons
from prefillviz.engine.errors import PrefillVizError
from prefillviz.figures.classroom import class_predictions_figure
from prefillviz.loading.hosted import hosted_policy, normalized_url
from prefillviz.ui.presenter import presenter_mode
from prefillviz.ui.rooms import ROOMS, new_member_id, shared_live_url

ROOM_STATE = "class_room"  # session state: (code, member) of this session's room


@dataclass(frozen=True)
class InRoom:
    code: str
    member: str
    teacher: bool


def _enter(code: str, member: str | None = None) -> None:
    member = member or new_member_id()
    try:
        room = ROOMS.join(code, member, hosted=hosted_policy().enabled)
    except PrefillVizError as error:
        st.session_state["class_room_error"] = str(error)
        st.query_params.pop("room", None)
        st.query_params.pop("member", None)
        return
    st.session_state[ROOM_STATE] = (room.code, member)
    st.query_params["room"], st.query_params["member"] = room.code, member  # a reload stays in the room
    st.session_state["class_room_restore"] = room.teacher == member  # a teacher who reloaded picks up where the room is


def _start() -> None:
    member = new_member_id()
    try:
        room = ROOMS.create(member, hosted=hosted_policy().enabled)
    except PrefillVizError as error:
        st.session_state["class_room_error"] = str(error)
        return
    st.session_state[ROOM_STATE] = (room.code, member)
    st.query_params["room"], st.query_params["member"] = room.code, member


def _leave() -> None:
    st.session_state.pop(ROOM_STATE, None)
    st.query_params.pop("room", None)
    st.query_params.pop("member", None)


def current_room() -> InRoom | None:
    """This session's room: from its state, else from its link (a first visit or a reload); None outside one."""
    held = st.session_state.get(ROOM_STATE)
    if held is None and "room" in st.query_params and not st.session_state.get("class_room_link_tried"):
        st.session_state["class_room_link_tried"] = True
        _enter(st.query_params["room"], st.query_params.get("member"))
        held = st.session_state.get(ROOM_STATE)
    if held is None:
        return None
    room = ROOMS.get(held[0])
    if room is None:  # expired while we were away
        st.session_state["class_room_error"] = f"Class room {held[0]} has ended."
        _leave()
        return None
    return InRoom(room.code, held[1], room.teacher == held[1])


def join_qr_png(link: str, scale: int = 5) -> bytes:
    """The join link as a QR code (PNG), for students to scan off the projector."""
    import segno

    buffer = io.BytesIO()
    segno.make(link, error="m").save(buffer, kind="png", scale=scale, border=2)
    return buffer.getvalue()


def room_controls() -> InRoom | None:
    """The "Class room" box: start a room, join one by code, or the room's code and join link."""
    here = current_room()
    with st.expander("Class room: predict together" + (f" · room {here.code}" if here else ""),
                     expanded=here is not None and here.teacher):
        if error := st.session_state.pop("class_room_error", None):
            st.error(error)
        if here is None:
            st.caption("A teacher starts a room and shows its code; students join it, follow the teacher's step and "
                       "lock in their predictions; the teacher sees the class's predictions next to the measured "
                       "answer.")
            columns = st.columns([1, 1, 1], vertical_alignment="bottom")
            columns[0].button("Start a room (teacher)", key="class_room_start", on_click=_start, width="stretch")
            code = columns[1].text_input("Room code", key="class_room_code", max_chars=8, placeholder="e.g. K7QX2")
            columns[2].button("Join", key="class_room_join",
                              on_click=lambda: _enter(st.session_state.get("class_room_code", "")),
                              disabled=not code.strip(), width="stretch")
            return None
        room = ROOMS.get(here.code)
        members = len(room.members) - 1 if room else 0
        if here.teacher:
            link = f"{(st.context.url or '').split('?')[0]}?room={here.code}"
            st.markdown(f"### Room code: `{here.code}`" if not presenter_mode() else f"# Room code: {here.code}")
            st.caption(f"{members} student(s) joined. Students open the Guided lessons page and type the code, or open "
                       "this link (or scan the QR code):")
            st.code(link, language=None)
            st.image(join_qr_png(link, scale=10 if presenter_mode() else 5), caption=f"Join room {here.code}")
        else:
            st.caption(f"You are in room {here.code}: this page follows the teacher's step. "
                       "Lock in your prediction on each step.")
        st.button("Leave the room", key="class_room_leave", on_click=_leave)
    return here


def follow_teacher(here: InRoom | None, slugs: list[str]) -> bool:
    """For a student: put the page on the teacher's lesson and step (before their widgets are drawn); for a
    teacher who reloaded, once, where the room was. True if the page follows (a student)."""
    if here is None or (here.teacher and not st.session_state.pop("class_room_restore", False)):
        return False
    room = ROOMS.get(here.code)
    if room is None:
        return False
    lesson = min(room.lesson, len(slugs) - 1)
    st.session_state["lesson_choice"] = lesson
    st.session_state[f"lesson_step_{slugs[lesson]}"] = room.step
    return not here.teacher


def publish_position(here: InRoom | None, lesson: int, step: int) -> None:
    if here is not None and here.teacher:
        ROOMS.follow(here.code, here.member, lesson, step)


def lock_prediction(here: InRoom | None, sid: str, value: float) -> None:
    if here is not None:
        ROOMS.predict(here.code, here.member, sid, value)


def locked_in_room(here: InRoom | None, sid: str) -> float | None:
    """This member's prediction the room holds for a step (None outside a room or before locking in)."""
    return None if here is None else ROOMS.prediction(here.code, here.member, sid)


def publish_answer(here: InRoom | None, sid: str, measured: float) -> None:
    if here is not None and here.teacher:
        ROOMS.reveal(here.code, here.member, sid, measured)


OUTSIDE_A_ROOM = "you"  # the tag of a Send from outside a class room


def member_label(here: InRoom | None) -> str:
    """The tag of this session's requests: "teacher" or "student N" in a room, "you" outside one."""
    room = ROOMS.get(here.code) if here is not None else None
    return room.label(here.member) if room is not None else OUTSIDE_A_ROOM


def share_live_url(here: InRoom | None, url: str) -> None:
    """The teacher's Live engine page shares the server it reads with the room (a URL that is not one: not shared)."""
    if here is not None and here.teacher:
        try:
            ROOMS.share_live_url(here.code, here.member, normalized_url(url))
        except PrefillVizError:  # not a server URL: the page's own read says so; the room keeps the last good one
            pass


def room_live_url(here: InRoom | None) -> str | None:
    """The server a student's Live engine page reads: the teacher's, once shared (None: the page's own field).

    Raises:
        ConfigError: the hosted demo's allow-list does not hold it.
    """
    if here is None:
        return None
    return shared_live_url(ROOMS.get(here.code), here.member, hosted_policy())


def _nearest_option(question: lessons.Question, measured: float) -> int:
    options = list(question.options)
    if question.compare == "difference" or measured <= 0 or min(options) <= 0:
        return min(range(len(options)), key=lambda i: abs(options[i] - measured))
    return min(range(len(options)), key=lambda i: abs(math.log(options[i] / measured)))


def class_histogram(here: InRoom | None, question: lessons.Question, sid: str) -> None:
    """The class's predictions of this step: always for the teacher, for students once the answer is revealed."""
    if here is None:
        return
    counts, measured = ROOMS.tally(here.code, sid)
    if not here.teacher and measured is None:
        return
    if question.kind == "number":
        labels = [lessons.format_value(v, question.unit) for v in question.options]
        per_option = [counts.get(float(v), 0) for v in question.options]
        answer = None if measured is None else _nearest_option(question, measured)
    else:
        labels = [choice.label for choice in question.choices]
        per_option = [counts.get(float(i), 0) for i in range(len(labels))]
        answer = None if measured is None else lessons.choice_for(question, measured)
    answer_text = None if measured is None else lessons.format_value(measured, question.unit)
    st.plotly_chart(class_predictions_figure(labels, per_option, answer, answer_text, question.text),
                    key=f"class_histogram_{sid}")
    if measured is None:
        st.caption("Only you (the teacher) see this until you reveal the answer: "
                   "the students' predictions stay their own.")


WATCH_EVERY_S = 10  # a small room's students see the teacher's next step within 10 s
WATCH_RATE_PER_S = 1.0  # a room's timers together ask the server for at most one rerun a second


def watch_interval_s(members: int) -> float:
    """How often a student's page checks the teacher's step: every ``WATCH_EVERY_S``, or less often in a
    big room, so that the room's timers together stay at ``WATCH_RATE_PER_S`` (30 students: every 30 s).

    Measured with scripts/load_test.py (30 students on 2 cores): at 10 s each, the timed reruns (3 a
    second) kept the server busy, the step's result took 42 s from the click (p50), and 2 of 30 lock-ins
    never redrew their page; at one second per member (31 s), 30 of 30 completed and the result took
    10 s (p50; p99 11 s)."""
    return max(float(WATCH_EVERY_S), members / WATCH_RATE_PER_S)


def _watch(code: str, lesson: int, step: int) -> None:
    room = ROOMS.get(code)
    if room is not None and (room.lesson, room.step) != (lesson, step):
        st.rerun(scope="app")


def watch_room(here: InRoom | None, lesson: int, step: int) -> None:
    """A student's page follows when the teacher moves on (checked every ``watch_interval_s``).

    Only a student's page gets the timer. A timed rerun is work for the server whatever it finds,
    and on a busy server it competes with the students' clicks; so the interval is long and grows
    with the room, and the teacher's page, which drives, has none.
    """
    if here is not None and not here.teacher:
        room = ROOMS.get(here.code)
        members = len(room.members) if room is not None else 1
        st.fragment(_watch, run_every=watch_interval_s(members))(here.code, lesson, step)
