"""A class room on the Guided lessons page (two AppTests: a teacher and a student in one server
process): the student joins by the link, follows the teacher's step, locks in a prediction that the
teacher's histogram counts, sees the class's histogram after the teacher's reveal, and a reload
keeps the student in the room, counted once."""

import json

from streamlit.testing.v1 import AppTest

from prefillviz.ui.classroom import join_qr_png
from prefillviz.ui.rooms import ROOMS
from tests.app.pages import APP, open_page


def histogram(app) -> dict | None:
    for chart in app.get("plotly_chart"):
        spec = json.loads(chart.proto.spec)
        if spec["layout"]["title"]["text"].startswith("The class's predictions"):
            return spec
    return None


def student(query: dict) -> AppTest:
    app = AppTest.from_file(APP, default_timeout=240)
    for name, value in query.items():
        app.query_params[name] = value
    app.run()
    app.switch_page("views/walkthrough.py").run()
    assert not app.exception
    return app


def test_a_student_follows_the_teacher_and_the_class_predictions_meet_the_answer(bundled):
    teacher = open_page("walkthrough")
    teacher.button(key="class_room_start").click().run()
    code = (teacher.query_params["room"][0] if isinstance(teacher.query_params["room"], list)
            else teacher.query_params["room"])
    room = ROOMS.get(code)
    assert room is not None and any(f"Room code: `{code}`" in m.value for m in teacher.markdown)
    assert teacher.get("image")  # the join link's QR code, to scan off the projector
    assert join_qr_png(f"http://localhost/walkthrough?room={code}").startswith(b"\x89PNG")

    pupil = student({"room": code})
    member = pupil.query_params["member"]
    member = member[0] if isinstance(member, list) else member
    assert member in ROOMS.get(code).members and member != room.teacher
    assert pupil.radio(key="lesson_choice").disabled  # following: the teacher moves the steps

    teacher.button(key="lesson_next_top").click().run()  # the teacher moves to step 2
    pupil.run()
    assert ([h.value for h in pupil.header] == [h.value for h in teacher.header]
            and pupil.header[0].value.startswith("2. "))

    pupil.button(key="lesson_lock").click().run()  # a number question: lock in the slider's value
    sid = next(s for s in ROOMS.get(code).predictions)
    assert list(ROOMS.get(code).predictions[sid]) == [member]
    assert histogram(pupil) is None  # before the reveal a student sees no one else's predictions
    teacher.run()
    spec = histogram(teacher)
    assert spec is not None and sum(spec["data"][0]["y"]) == 1 and "1 locked in" in spec["layout"]["title"]["text"]

    teacher.button(key="lesson_lock").click().run()
    teacher.button(key="lesson_run").click().run()
    teacher.button(key="lesson_reveal").click().run()
    assert not teacher.exception
    assert "measured:" in histogram(teacher)["layout"]["title"]["text"]
    pupil.run()
    assert histogram(pupil) is not None  # after the reveal the class sees it too

    again = student({"room": code, "member": member})  # the student reloads the page
    assert again.radio(key="lesson_choice").disabled
    assert len(ROOMS.get(code).members) == 2  # the teacher and one student, counted once

    # the teacher reloads: still the teacher, on the room's step
    teacher_again = student({"room": code, "member": room.teacher})
    assert not teacher_again.radio(key="lesson_choice").disabled and teacher_again.header[0].value.startswith("2. ")
    assert histogram(teacher_again) is not None
