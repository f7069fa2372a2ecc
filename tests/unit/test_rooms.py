"""Class rooms in the server's memory (ui/rooms.py): a short code, members counted once (a reload
rejoins as the same member), the first locked prediction counts, only the teacher moves the step
and reveals, rooms expire when idle, and their number and size are capped (smaller when hosted)."""

import time

import pytest

from prefillviz.engine.errors import ConfigError
from prefillviz.ui import rooms
from prefillviz.ui.rooms import CODE_ALPHABET, CODE_LENGTH, Rooms


def test_a_room_has_a_short_code_that_reads_off_a_projector():
    room = Rooms().create("teacher")
    assert len(room.code) == CODE_LENGTH and set(room.code) <= set(CODE_ALPHABET) and not set(room.code) & set("01IO")


def test_students_join_by_code_and_a_reload_counts_once():
    registry = Rooms()
    room = registry.create("teacher")
    registry.join(room.code.lower(), "student-1")  # typed in lower case
    registry.join(room.code, "student-1")  # the same browser after a reload
    registry.join(room.code, "student-2")
    assert registry.get(room.code).members == {"teacher", "student-1", "student-2"}
    with pytest.raises(ConfigError, match="no class room"):
        registry.join("ZZZZZ", "student-3")


def test_predictions_lock_once_and_the_tally_holds_the_revealed_answer():
    registry = Rooms()
    code = registry.create("teacher").code
    for member, value in (("a", 8), ("b", 16), ("c", 16)):
        registry.join(code, member)
        assert registry.predict(code, member, "lesson/2", value)
    assert registry.predict(code, "a", "lesson/2", 64)  # a second value is not a second vote
    assert not registry.predict(code, "stranger", "lesson/2", 4)  # not a member
    counts, answer = registry.tally(code, "lesson/2")
    assert counts == {8.0: 1, 16.0: 2} and answer is None
    registry.reveal(code, "a", "lesson/2", 17.1)  # only the teacher reveals
    assert registry.tally(code, "lesson/2")[1] is None
    registry.reveal(code, "teacher", "lesson/2", 17.1)
    assert registry.tally(code, "lesson/2")[1] == 17.1
    assert registry.prediction(code, "a", "lesson/2") == 8.0


def test_only_the_teacher_moves_the_step():
    registry = Rooms()
    code = registry.create("teacher").code
    registry.join(code, "student")
    registry.follow(code, "student", 3, 2)
    assert (registry.get(code).lesson, registry.get(code).step) == (0, 0)
    registry.follow(code, "teacher", 1, 2)
    assert (registry.get(code).lesson, registry.get(code).step) == (1, 2)


def test_an_idle_room_expires():
    registry = Rooms(idle_s=0.2)
    code = registry.create("teacher").code
    time.sleep(0.3)
    assert registry.get(code) is None and len(registry) == 0
    with pytest.raises(ConfigError, match="ended"):
        registry.join(code, "late student")


def test_rooms_are_capped_in_number_and_size_and_more_so_when_hosted(monkeypatch):
    monkeypatch.setattr(rooms, "LIMITS", {False: (3, 4), True: (2, 3)})
    registry = Rooms()
    code = registry.create("t0", hosted=True).code
    registry.create("t1", hosted=True)
    with pytest.raises(ConfigError, match="2 class rooms"):
        registry.create("t2", hosted=True)
    registry.create("t2")  # off hosted mode the cap is higher
    registry.join(code, "s1", hosted=True)
    registry.join(code, "s2", hosted=True)
    with pytest.raises(ConfigError, match="full"):
        registry.join(code, "s3", hosted=True)
    registry.join(code, "s1", hosted=True)  # a member already in it still gets back in


def test_members_are_labelled_by_the_order_they_joined_and_a_reload_keeps_the_label():
    registry = Rooms()
    room = registry.create("teacher")
    for member in ("a", "b", "a", "c"):  # "a" reloads: still student 1
        registry.join(room.code, member)
    room = registry.get(room.code)
    assert [room.label(m) for m in ("teacher", "a", "b", "c")] == ["teacher", "student 1", "student 2", "student 3"]
    registry.join(room.code, "teacher")  # the teacher's own reload: still the teacher, no student number
    assert room.label("teacher") == "teacher" and room.label("stranger") == "not in the room"


def test_only_the_teacher_shares_the_rooms_server_and_every_member_reads_it():
    registry = Rooms()
    code = registry.create("teacher").code
    registry.join(code, "student")
    assert registry.get(code).live_url is None  # until the teacher opens the Live engine page
    registry.share_live_url(code, "student", "http://10.0.0.9:8000")
    assert registry.get(code).live_url is None
    registry.share_live_url(code, "teacher", "http://127.0.0.1:8000")
    assert registry.get(code).live_url == "http://127.0.0.1:8000"
    registry.share_live_url(code, "teacher", "http://127.0.0.1:8001")  # the teacher switched servers
    assert registry.get(code).live_url == "http://127.0.0.1:8001"


def test_a_students_live_page_reads_the_shared_server_only_where_the_hosted_allow_list_has_it():
    from prefillviz.loading.hosted import HostedPolicy
    from prefillviz.ui.rooms import shared_live_url

    registry = Rooms()
    code = registry.create("teacher").code
    registry.join(code, "student")
    room, local = registry.get(code), HostedPolicy(enabled=False)
    assert shared_live_url(room, "student", local) is None  # nothing shared yet: the page's own field
    registry.share_live_url(code, "teacher", "http://127.0.0.1:8000/v1/")
    assert shared_live_url(room, "student", local) == "http://127.0.0.1:8000"
    assert shared_live_url(room, "teacher", local) is None  # the teacher's page has the field it shares
    assert shared_live_url(None, "student", local) is None  # outside a room
    allowed = HostedPolicy(enabled=True, allowed_probe_urls=("http://127.0.0.1:8000",))
    assert shared_live_url(room, "student", allowed) == "http://127.0.0.1:8000"
    registry.share_live_url(code, "teacher", "http://10.0.0.9:8000")  # not on the demo's allow-list
    with pytest.raises(ConfigError, match="probes only http://127.0.0.1:8000"):
        shared_live_url(room, "student", allowed)
    assert shared_live_url(room, "student", local) == "http://10.0.0.9:8000"  # on one's own machine: any server
