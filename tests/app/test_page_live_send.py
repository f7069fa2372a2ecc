"""The Live engine page's Send against a real ``prefillviz serve`` (the bundled model, uvicorn in a thread on a free
port): a prompt sent outside a room is tagged "you" and starred in the schedule; in a class room the student's page
reads the server the teacher's page shares, the student's Send is tagged "student 1", and the teacher's schedule
names it; an unreachable server is one error line."""


import pytest
from streamlit.testing.v1 import AppTest

from prefillviz.ui.rooms import ROOMS
from tests.app.pages import APP, chart_titled, open_page
from tests.served import server_in_thread

pytestmark = pytest.mark.usefixtures("one_torch_thread")
PROMPT = "Why is the sky blue?"


@pytest.fixture(scope="module")
def server_url(bundled):
    with server_in_thread(bundled, max_num_seqs=4) as (url, _, _):
        yield url


def send_and_wait(app: AppTest, prompt: str = PROMPT) -> None:
    app.text_area(key="live_send_prompt").set_value(prompt)
    app.button(key="live_send").click().run()
    assert not app.exception and not app.error, [e.value for e in app.error]
    assert app.session_state["live_sends"].wait_all(120), "the answer did not end within 120 s"
    app.button(key="live_refresh").click().run()  # the page shows the server's record as it is now
    assert not app.exception and not app.error, [e.value for e in app.error]


def budget_names(app: AppTest) -> list[str]:
    return [trace["name"] for trace in chart_titled(app, "Each step's token budget")["data"]]


def split_labels(app: AppTest) -> list[str]:
    return list(chart_titled(app, "Time to first token of each finished request")["data"][0]["y"])


def test_a_send_outside_a_room_is_tagged_you_and_starred_in_the_schedule(server_url):
    app = open_page("live_engine")
    app.text_input(key="live_url").set_value(server_url).run()
    send_and_wait(app)
    (sent,) = app.session_state["live_sends"].recent()
    assert sent.user == "you" and sent.text and sent.request_id
    mine = f"★ you · {sent.request_id.rsplit('-', 1)[-1][:6]}"
    assert mine in budget_names(app) and any(label.startswith(mine) for label in split_labels(app))
    assert any(c.value.startswith("**you** · “Why is the sky blue?”") for c in app.caption)  # its answer, listed

    app.text_input(key="live_url").set_value("http://127.0.0.1:9").run()  # nobody listens there
    app.button(key="live_send").click().run()
    assert not app.exception
    assert [e.value for e in app.error][0] == ("Can't reach http://127.0.0.1:9: is `make serve` (python -m prefillviz "
                                               "serve) running there?")


def test_in_a_room_the_student_sends_into_the_teachers_server_and_the_teacher_sees_it(server_url):
    teacher = open_page("walkthrough")
    teacher.button(key="class_room_start").click().run()
    code = teacher.query_params["room"]
    code = code[0] if isinstance(code, list) else code
    teacher.switch_page("views/live_engine.py").run()
    teacher.text_input(key="live_url").set_value(server_url).run()  # shared with the room
    assert ROOMS.get(code).live_url == server_url

    pupil = AppTest.from_file(APP, default_timeout=240)
    pupil.query_params["room"] = code
    pupil.run()
    pupil.switch_page("views/live_engine.py").run()
    assert not pupil.exception
    assert f"Class room {code}: this page reads your teacher's server, {server_url}." in [i.value for i in pupil.info]
    assert not [w for w in pupil.text_input if w.key == "live_url"]  # the room's server, not a field of its own
    send_and_wait(pupil, "What does a compiler do?")
    (sent,) = pupil.session_state["live_sends"].recent()
    tag = f"student 1 · {sent.request_id.rsplit('-', 1)[-1][:6]}"
    assert sent.user == "student 1" and f"★ {tag}" in budget_names(pupil)

    teacher.button(key="live_refresh").click().run()
    assert tag in budget_names(teacher) and f"★ {tag}" not in budget_names(teacher)  # the teacher's, unstarred
    assert any(label.startswith(tag) for label in split_labels(teacher))
