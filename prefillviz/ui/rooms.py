"""A room for a class: the teacher starts one, students join with its short code (or its link), follow
the teacher's lesson step, and lock in their predictions; the class's predictions sit next to the
measured answer once the teacher reveals it (peer instruction: predict, vote, see the truth).

The room also shares a served engine: the teacher's Live engine page publishes its server URL
(``live_url``) and the students' Live pages use it, so each student's *Send* goes into the same
engine, tagged with the member's label ("teacher", "student 7": the order they joined in).

Rooms live in this server's memory only, bounded in number and size, and expire when idle. Nothing
personal is stored: a member is a random id kept in that browser's link (so a reload stays in the
room), a label is a number from the joining order, and a prediction is a number (a slider value or
a choice index) under that id.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from prefillviz.engine.errors import ConfigError
from prefillviz.loading.hosted import HostedPolicy, normalized_url

CODE_ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"  # no 0/O, 1/I: read off a projector
CODE_LENGTH = 5
ROOM_IDLE_S = 3 * 3600.0  # a room nobody touched for this long is gone
LIMITS = {False: (200, 300), True: (20, 60)}  # hosted: (rooms, members per room)


def new_member_id() -> str:
    """A random id for one browser in a room (nothing personal)."""
    return secrets.token_urlsafe(9)


@dataclass
class Room:
    """One class: its code, who teaches, where the lesson is, and the predictions by step."""

    code: str
    teacher: str  # the teacher's member id
    created_s: float
    active_s: float
    lesson: int = 0  # index into the loaded lessons
    step: int = 0
    members: set[str] = field(default_factory=set)
    predictions: dict[str, dict[str, float]] = field(default_factory=dict)  # step id -> member -> value
    answers: dict[str, float] = field(default_factory=dict)  # step id -> the measured answer, once revealed
    student_numbers: dict[str, int] = field(default_factory=dict)  # member -> 1, 2, ... in the order they joined
    live_url: str | None = None  # the served engine the teacher's Live engine page reads: the students' too

    def label(self, member: str) -> str:
        """What a member's requests are tagged with: "teacher", or "student N" (N: the order they joined in)."""
        if member == self.teacher:
            return "teacher"
        number = self.student_numbers.get(member)
        return f"student {number}" if number is not None else "not in the room"


class Rooms:
    """Every room of this server process (thread-safe: each session runs in a thread of its own)."""

    def __init__(self, idle_s: float = ROOM_IDLE_S) -> None:
        self.idle_s = idle_s
        self._lock = threading.Lock()
        self._rooms: dict[str, Room] = {}

    def _expire(self, now: float) -> None:
        for code in [c for c, room in self._rooms.items() if now - room.active_s > self.idle_s]:
            del self._rooms[code]

    def __len__(self) -> int:
        with self._lock:
            self._expire(time.monotonic())
            return len(self._rooms)

    def create(self, teacher: str, hosted: bool = False) -> Room:
        """A new room taught by ``teacher``.

        Raises:
            ConfigError: this server already holds as many rooms as it allows.
        """
        max_rooms, _ = LIMITS[hosted]
        with self._lock:
            now = time.monotonic()
            self._expire(now)
            if len(self._rooms) >= max_rooms:
                raise ConfigError(f"This server already holds {max_rooms} class rooms; try again when one has ended.")
            code = "".join(secrets.choice(CODE_ALPHABET) for _ in range(CODE_LENGTH))
            while code in self._rooms:
                code = "".join(secrets.choice(CODE_ALPHABET) for _ in range(CODE_LENGTH))
            room = self._rooms[code] = Room(code, teacher, now, now, members={teacher})
            return room

    def join(self, code: str, member: str, hosted: bool = False) -> Room:
        """``member`` in room ``code`` (again, after a reload: the same member, counted once).

        Raises:
            ConfigError: no such room (mistyped, or expired), or the room is full.
        """
        _, max_members = LIMITS[hosted]
        code = (code or "").strip().upper()
        with self._lock:
            now = time.monotonic()
            self._expire(now)
            room = self._rooms.get(code)
            if room is None:
                raise ConfigError(f"There is no class room {code!r} on this server (mistyped, "
                                  "or it ended): ask for the code again.")
            if member not in room.members and len(room.members) >= max_members:
                raise ConfigError(f"Class room {code} is full ({max_members} members).")
            room.members.add(member)
            if member != room.teacher:
                room.student_numbers.setdefault(member, len(room.student_numbers) + 1)
            room.active_s = now
            return room

    def get(self, code: str) -> Room | None:
        with self._lock:
            self._expire(time.monotonic())
            return self._rooms.get((code or "").strip().upper())

    def follow(self, code: str, teacher: str, lesson: int, step: int) -> None:
        """The teacher's lesson and step, for the students to follow (only the teacher moves it)."""
        with self._lock:
            room = self._rooms.get(code)
            if room is not None and room.teacher == teacher and (room.lesson, room.step) != (lesson, step):
                room.lesson, room.step, room.active_s = lesson, step, time.monotonic()

    def share_live_url(self, code: str, teacher: str, url: str) -> None:
        """The teacher's served engine (its Live engine page's URL), for the students' Live pages to use."""
        with self._lock:
            room = self._rooms.get(code)
            if room is not None and room.teacher == teacher and room.live_url != url:
                room.live_url, room.active_s = url, time.monotonic()

    def predict(self, code: str, member: str, step_id: str, value: float) -> bool:
        """Lock in ``member``'s prediction for a step (the first one counts); False if not in the room."""
        with self._lock:
            room = self._rooms.get(code)
            if room is None or member not in room.members:
                return False
            room.predictions.setdefault(step_id, {}).setdefault(member, float(value))
            room.active_s = time.monotonic()
            return True

    def prediction(self, code: str, member: str, step_id: str) -> float | None:
        """``member``'s locked prediction of a step (None: none yet)."""
        with self._lock:
            room = self._rooms.get(code)
            return None if room is None else room.predictions.get(step_id, {}).get(member)

    def reveal(self, code: str, teacher: str, step_id: str, measured: float) -> None:
        """The teacher's measured answer of a step, shown beside the class's predictions."""
        with self._lock:
            room = self._rooms.get(code)
            if room is not None and room.teacher == teacher:
                room.answers[step_id] = float(measured)

    def tally(self, code: str, step_id: str) -> tuple[Counter, float | None]:
        """(how many predicted each value, the measured answer if revealed) for one step."""
        with self._lock:
            room = self._rooms.get(code)
            if room is None:
                return Counter(), None
            return Counter(room.predictions.get(step_id, {}).values()), room.answers.get(step_id)


def shared_live_url(room: Room | None, member: str, policy: HostedPolicy) -> str | None:
    """The served engine a student's Live engine page reads: the teacher's, once shared. None for the teacher, outside
    a room, or before the teacher shared one (the page's own field then).

    Raises:
        ConfigError: the hosted demo's allow-list does not hold the room's URL (a room can't open it wider).
    """
    if room is None or member == room.teacher or room.live_url is None:
        return None
    policy.check_probe_url(room.live_url)
    return normalized_url(room.live_url)


ROOMS = Rooms()
"""The server's rooms."""
