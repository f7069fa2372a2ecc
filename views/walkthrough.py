"""Guided lessons for a class: each step sets the app up, says what to look at, asks for a
prediction, runs the real model, and reveals the measured answer next to the prediction.

The lessons are files under assets/lessons/ (``prefillviz.lessons`` loads and checks them, and
runs their actions). Per-session state: the runs (by action, model and dtype), the predictions
and the revealed steps, keyed by lesson and step; no keyboard is needed anywhere.
"""

import streamlit as st

from prefillviz import lessons
from prefillviz.ui import classroom
from prefillviz.ui.results import get_result, save_result
from prefillviz.ui.running import measured_once, run_guarded, run_label
from prefillviz.ui.settings import set_setting
from prefillviz.ui.shell import page_frame, run_button, stop_page

loaded = page_frame()

st.title("Guided lessons")
st.markdown(
    "Short walkthroughs for a class or on your own. Each step tells you what to look at and asks you to "
    "**predict** a number; then it **runs the real model** on this machine and **reveals** what was measured. "
    "Everything is clickable: sliders and buttons, no typing."
)

try:
    LESSONS, GLOSSARY = lessons.load_lessons(), lessons.load_glossary()
except lessons.LessonError as error:
    st.error(f"The lesson files could not be loaded: {error}")
    stop_page()

here = classroom.room_controls()  # a class room: start, join, or its code and link
# a student: the teacher's lesson and step
following = classroom.follow_teacher(here, [lesson.slug for lesson in LESSONS])

state = st.session_state
runs = state.setdefault("lesson_runs", lessons.RunStore())  # action key (action, settings, model, dtype) -> run
predictions = state.setdefault("lesson_predictions", {})  # "slug/index" -> slider value or choice index
revealed = state.setdefault("lesson_revealed", set())  # "slug/index"


def step_id(lesson: lessons.Lesson, index: int) -> str:
    return f"{lesson.slug}/{index}"


def move(position_key: str, num_steps: int, delta: int) -> None:
    state[position_key] = max(0, min(num_steps - 1, state.get(position_key, 0) + delta))


def next_lesson(lesson_index: int) -> None:
    state["lesson_choice"] = lesson_index + 1


def apply_settings(settings: dict) -> None:
    """Set the sidebar widgets a step asks for (a callback: it runs before page_frame loads the model)."""
    for name, value in settings.items():
        set_setting(lessons.SETTINGS[name][0], value)


def record_prediction(sid: str, widget_key: str, lock: bool = True) -> None:
    predictions[sid] = state[widget_key]
    if lock:
        classroom.lock_prediction(here, sid, state[widget_key])  # in a room, the first one locked in counts


def reveal(sid: str, measured: float | None = None) -> None:
    if sid in predictions:
        revealed.add(sid)
        if measured is not None:
            classroom.publish_answer(here, sid, measured)  # the teacher's reveal shows the class the answer


lesson_index = st.radio(
    "Lesson",
    range(len(LESSONS)),
    format_func=lambda i: f"{LESSONS[i].number}. {LESSONS[i].title} · about {LESSONS[i].minutes} min",
    key="lesson_choice",
    disabled=following,
)
lesson = LESSONS[lesson_index]
position_key = f"lesson_step_{lesson.slug}"
index = min(state.setdefault(position_key, 0), lesson.num_steps - 1)
step, sid = lesson.steps[index], step_id(lesson, index)
last_step, last_lesson = index == lesson.num_steps - 1, lesson_index == len(LESSONS) - 1
classroom.publish_position(here, lesson_index, index)  # the teacher's step, for the students to follow
classroom.watch_room(here, lesson_index, index)


def navigation(where: str) -> None:
    back, middle, forward = st.columns([1, 2, 1], vertical_alignment="center")
    back.button("◀ Back", key=f"lesson_back_{where}", on_click=move, args=(position_key, lesson.num_steps, -1),
                disabled=index == 0 or following, width="stretch")
    middle.progress((index + 1) / lesson.num_steps, text=f"Step {index + 1} of {lesson.num_steps}: {step.title}")
    if last_step:
        forward.button("Next lesson ▶", key=f"lesson_next_{where}", type="primary", on_click=next_lesson,
                       args=(lesson_index,), disabled=last_lesson or following, width="stretch")
    else:
        forward.button("Next ▶", key=f"lesson_next_{where}", type="primary", on_click=move,
                       args=(position_key, lesson.num_steps, 1), disabled=following, width="stretch")


done = " · ".join(f"{'✓ ' if step_id(lesson, s.index) in revealed else ''}{s.index + 1}. {s.title}"
                  for s in lesson.steps)
st.caption(f"About {lesson.minutes} minutes, model runs included · {done}")
with st.expander("About this lesson", expanded=index == 0):
    st.markdown(lesson.intro)
with st.expander("Glossary: every term these lessons use"):  # above every step, whichever step is shown
    st.markdown(lessons.glossary_markdown(GLOSSARY))
navigation("top")

st.header(f"{index + 1}. {step.title}")
st.markdown(step.narration)
if step.settings:
    changes = ", ".join(f"{name} = {value}" for name, value in step.settings.items())
    st.caption(f"This step sets the sidebar's {changes} when you run it "
               "(the model is loaded in that setting first if needed).")

# ---------------------------------------------------------------- 1. predict
question, locked = step.question, sid in revealed
st.subheader("① Predict")
widget_key = f"lesson_predict_{sid}"
if question.kind == "number":
    value = st.select_slider(
        question.text,
        options=list(question.options),
        value=predictions.get(sid, question.default),
        format_func=lambda v: lessons.format_value(v, question.unit),
        key=widget_key,
        on_change=record_prediction,
        args=(sid, widget_key, False),  # moving the slider is not locking in (in a room, the button is)
        disabled=locked,
    )
    in_room = classroom.locked_in_room(here, sid)
    if sid not in predictions or (here is not None and in_room is None):
        st.button(f"Lock in my prediction: {lessons.format_value(value, question.unit)}", key="lesson_lock",
                  on_click=record_prediction, args=(sid, widget_key))
    elif in_room is not None:
        st.caption(f"Locked in for the class: {lessons.format_value(in_room, question.unit)}")
else:
    st.radio(
        question.text,
        range(len(question.choices)),
        index=predictions.get(sid),
        format_func=lambda i: question.choices[i].label,
        key=widget_key,
        on_change=record_prediction,
        args=(sid, widget_key),
        disabled=locked,
    )

# in a room: the class's predictions (the teacher's, and everyone's after the reveal)
classroom.class_histogram(here, question, sid)

# ---------------------------------------------------------------- 2. run
st.subheader("② Run it on the model")
in_settings = all(state.get(lessons.SETTINGS[name][0]) == value for name, value in step.settings.items())
key = lessons.action_key(step.action, loaded, step.settings) if loaded is not None else None
outcome = runs.get(key) if in_settings else None  # a run in other settings doesn't answer this step
clicked = run_button(
    "Run again" if outcome is not None else "Run this step on the model",
    key="lesson_run",
    type="secondary" if outcome is not None else "primary",
    on_click=apply_settings,
    args=(step.settings,),
    width="stretch",
)
if clicked and loaded is not None:
    with run_guarded(f"Step {index + 1}", queue=False):
        bar = st.progress(0.0, text=f"Step {index + 1}: starting")
        try:  # a class running the same step at once: measured once (the same action, settings, model and dtype)
            shared = measured_once(
                ("lesson step", sid, key),
                lambda others: lessons.run_action(
                    loaded, step.action, progress=lambda fraction, text: bar.progress(min(1.0, fraction), text=text)
                ),
            )
            outcome = shared.result
            state["lesson_sharing"] = (key, shared.viewers, shared.joined)
        finally:
            bar.empty()
        runs.put(key, outcome, f"lesson {lesson.number}, step {index + 1}")
        for name, value in lessons.page_results(outcome, f"{run_label(loaded, 'none')}").items():
            save_result(name, value)  # the full view shows this same run
        state["lesson_page_state"] = (outcome.raw.get("prefill"), lessons.page_state(outcome))
if outcome is not None:
    origin = runs.origin(key)
    shared = "" if origin == f"lesson {lesson.number}, step {index + 1}" else f" (the run of {origin})"
    sharing = state.get("lesson_sharing")
    viewers = (
        f" Measured once for {sharing[1]} viewer(s)"
        f"{' (you joined a run another session started)' if sharing[2] else ''}."
        if sharing and sharing[0] == key else ""
    )
    st.caption(
        f"Ran in {outcome.elapsed_s:,.1f} s on {outcome.model_id} ({outcome.device}, "
        f"{outcome.dtype}){shared}.{viewers} The answer stays hidden until you reveal it."
    )

# ---------------------------------------------------------------- 3. reveal
st.subheader("③ Reveal")
if sid not in predictions:
    st.caption("Make your prediction first: "
               + ("move the slider, or lock in its value." if question.kind == "number" else "pick an answer."))
elif outcome is None:
    st.caption("Now run the step on the model.")
st.button(
    "Reveal the measured answer",
    key="lesson_reveal",
    type="primary",
    on_click=reveal,
    args=(sid, outcome.measured[question.answer] if outcome is not None else None),
    disabled=sid not in predictions or outcome is None or locked,
    width="stretch",
)
if locked and outcome is not None:
    answer = lessons.format_reveal(question, outcome.measured[question.answer], predictions[sid])
    columns = st.columns(2)
    if question.kind == "number":
        columns[0].metric("Measured", answer.measured_text)
        columns[1].metric("Your prediction", answer.prediction_text)
    else:
        columns[0].markdown(f"**Measured:** {answer.measured_text}")
        columns[1].markdown(f"**Your prediction:** {answer.prediction_text}")
    (st.success if answer.close else st.info)(answer.verdict)
    st.markdown("\n".join(f"- {label}: **{value}**" for label, value in outcome.facts))
    st.plotly_chart(lessons.step_figure(step, outcome), key="lesson_figure")
    st.caption(f"Measured on {outcome.model_id} ({outcome.device}, {outcome.dtype}) in this session's run.")
    if step.after_reveal:
        # written from this run: its numbers, its outcome's variant
        st.markdown(lessons.step_after_reveal(step, outcome))
    same_run = bool(lessons.page_results(outcome, ""))
    st.page_link(step.view,
                 label="Open the full view of this run" if same_run else "Open the full view to explore further",
                 icon=":material/open_in_new:")
elif locked:
    st.caption("Revealed before, but that run is no longer kept or was on another model or setting: "
               "run the step again to see its answer.")

navigation("bottom")

# The Prefill page's prompt box shows the prompt of the lesson's run while that run is the page's
# result. Set on every rerun here: Streamlit drops a value set for another page's widget once a
# rerun ends without that widget, and the user may open the page several reruns later.
shown_run, page_state = state.get("lesson_page_state", (None, {}))
if shown_run is not None and get_result("prefill") is shown_run:
    state.update(page_state)
