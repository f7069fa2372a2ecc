"""The lesson files under assets/lessons/: they load, fit their specs, ask only what the runs
measure, state the KV-cache facts right, and a broken file says what is wrong and where."""

import json
import re
import shutil

import pytest

from prefillviz import lessons
from prefillviz.analysis.memory import kv_memory_report
from prefillviz.analysis.model_shape import ModelShape
from prefillviz.lessons import ACTION_KINDS, LESSONS_DIR, LessonError, format_reveal, load_lessons, resolve_parameters
from prefillviz.lessons.claims import CLAIMS, NEVER

LESSON_ONE = "01_prefill_and_ttft"


def test_all_lessons_load_with_at_least_four_that_fit_in_ten_minutes():
    loaded = load_lessons()
    assert len(loaded) >= 4
    assert [lesson.number for lesson in loaded] == list(range(1, len(loaded) + 1))
    for lesson in loaded:
        assert lesson.title and lesson.intro and 1 <= lesson.minutes <= 10
        assert lesson.num_steps >= 3
        for step in lesson.steps:
            assert step.title and step.narration and step.after_reveal and step.question.text


def test_every_step_shows_a_small_diagram_and_at_most_three_sentences_before_its_question():
    for lesson in load_lessons():
        for step in lesson.steps:
            assert step.narration.startswith("```"), f"{lesson.slug}, step {step.index + 1}: no diagram first"
            assert len(step.narration.split("```")[1].strip().splitlines()) <= 6, (
                f"{lesson.slug}, step {step.index + 1}: a small one")
            # what is read between the diagram and the question
            text = step.narration.split("```")[-1].split("**Look at:**")[0]
            assert len(re.findall(r"[.!?](?:\s|$)", text.strip())) <= 3, (
                f"{lesson.slug}, step {step.index + 1}: more than three sentences")


def lessons_text() -> str:
    """Everything a student reads, in order, diagrams and {placeholders} left out (labels, not definitions)."""
    text = "\n".join(
        part for lesson in load_lessons()
        for part in [lesson.intro, *(p for s in lesson.steps for p in (s.narration, s.after_reveal))]
    )
    return re.sub(r"\{[a-z_0-9]+\}", "", re.sub(r"```.*?```", "", text, flags=re.DOTALL))


# (term, how it is written): the glossary's terms and the ones the steps lean on
TERMS = [
    ("token budget", r"token budget"), ("batch", r"\bbatch\b"), ("logits", r"logits"), ("greedy", r"greedy"),
    ("KV head", r"KV head"), ("activations", r"activations"), ("torch.distributed", r"torch\.distributed"),
    ("inter-token latency", r"inter-token latency"), ("token", r"\btokens?\b"), ("dtype", r"\bdtype\b"),
    ("FLOP", r"\bFLOPs?\b"), ("arithmetic intensity", r"arithmetic intensity"), ("ridge", r"\bridge\b"),
    ("KV cache", r"KV cache"), ("block", r"\bblocks?\b"), ("chunk", r"\bchunks?\b"), ("TTFT", r"\bTTFT\b"),
    ("ITL", r"\bITL\b"), ("RDMA", r"\bRDMA\b"), ("NVLink", r"\bNVLink\b"),
    ("KV write event", r"KV write events?"), ("block-sparse attention", r"block-sparse"),
    ("Amdahl's law", r"Amdahl"), ("continuous batching", r"continuous batching"),
]


@pytest.mark.parametrize("term, pattern", TERMS)
def test_a_term_is_defined_in_bold_where_the_lessons_first_use_it(term, pattern):
    text = lessons_text()
    first = re.search(pattern, text, flags=re.IGNORECASE if term.islower() else 0)
    assert first is not None, term
    bold = [m.span() for m in re.finditer(r"\*\*[^*]+\*\*", text)]
    assert any(start < first.start() < end for start, end in bold), (
        f"{term!r} is first used before it is defined: {text[max(0, first.start() - 80) : first.end() + 20]!r}")


def test_the_glossary_defines_every_term_and_every_step_can_reach_it():
    glossary = lessons.load_glossary()
    for term in ("token", "logits", "dtype", "FLOP", "arithmetic intensity", "ridge", "KV cache", "block", "chunk",
                 "TTFT", "ITL", "RDMA / NVLink", "KV write event", "block-sparse attention", "Amdahl's law",
                 "continuous batching"):
        assert len(glossary.get(term, "").split()) >= 8, term
    page = (lessons.ROOT / "views" / "walkthrough.py").read_text(encoding="utf-8")
    assert "glossary_markdown(GLOSSARY)" in page  # drawn above every step, whichever step is shown


def test_each_markdown_has_one_section_per_step_spec():
    for markdown in sorted(p for p in LESSONS_DIR.glob("*.md") if p.name != "glossary.md"):
        sections = re.findall(r"^## ", markdown.read_text(encoding="utf-8"), flags=re.MULTILINE)
        spec = json.loads(markdown.with_suffix(".json").read_text(encoding="utf-8"))
        assert len(sections) == len(spec["steps"]), markdown.name


def test_every_step_runs_a_known_action_and_asks_what_it_measures():
    kinds = set()
    for lesson in load_lessons():
        for step in lesson.steps:
            kind = ACTION_KINDS[step.action["kind"]]
            kinds.add(kind.name)
            assert step.question.answer in kind.measured
            assert step.figure in kind.figures
            assert (lessons.ROOT / step.view).is_file()
    # the four topics: prefill and TTFT, parallel vs token-by-token with the roofline, KV cache, chunked + prefix
    assert {"prefill", "ttft_ratio", "parallel_vs_sequential", "roofline", "kv_memory", "chunked", "prefix"} <= kinds
    # and the two steps that reveal a recorded replay's write order and block-sparse prefill's speedup
    assert {"kv_write_order", "sparse_speedup"} <= kinds
    # and the class room's step: the whole class's Send at once
    assert "class_burst" in kinds


def test_lesson_two_asks_the_400_token_question():
    lesson = load_lessons()[1]
    first = lesson.steps[0]
    assert first.action == {"kind": "parallel_vs_sequential", "preset": "Long document", "num_tokens": 400,
                            "parallel_timing_runs": 3}
    assert "400-token" in first.question.text and first.question.answer == "ratio"


def test_the_kv_lesson_states_the_formula_the_code_computes():
    shape = ModelShape(
        architecture="LlamaForCausalLM", family="llama", num_layers=30, num_heads=9, num_kv_heads=3, head_dim=64,
        hidden_size=576, intermediate_size=1536, vocab_size=49152, max_context=8192, dtype_bytes=4,
    )  # SmolLM2-135M
    text = (LESSONS_DIR / "03_kv_cache_and_gqa.md").read_text(encoding="utf-8")
    fp32, bf16 = kv_memory_report(shape, dtype="float32"), kv_memory_report(shape, dtype="bfloat16")
    assert f"{fp32.bytes_per_token:,} bytes per token" in text and f"{bf16.bytes_per_token:,} bytes per token" in text
    assert (f"{fp32.mha_bytes_per_token:,} bytes per token" in text and fp32.gqa_saving_factor == 3
            and "3× larger" in text)


NAMED_VIEWS = ("views/reproduce_papers.py", "views/prefix_cache.py", "views/disaggregated.py")


def test_narration_states_no_measured_times_as_facts():
    """No lesson states a time, a machine, a model or a rule of thumb that only a run can decide: those are
    written from the run (placeholders, and variants chosen by the measurement)."""
    timing = re.compile(r"\d[\d,.]*\s*(ms|s\b|seconds|GFLOP/s|tokens/s|GB/s)")
    for markdown in sorted(LESSONS_DIR.glob("*.md")):
        text = markdown.read_text(encoding="utf-8")
        assert not timing.search(text), f"{markdown.name}: {timing.search(text).group(0)!r}"
        fixed = [claim.pattern for claim in CLAIMS if claim.guard == NEVER and re.search(claim.pattern, text, re.I)]
        assert not fixed, f"{markdown.name}: {fixed}"
    for view in NAMED_VIEWS:  # the pages the lessons open: no fixed machine or model either
        text = (lessons.ROOT / view).read_text(encoding="utf-8")
        fixed = [claim.pattern for claim in CLAIMS if claim.guard == NEVER and re.search(claim.pattern, text, re.I)]
        assert not fixed, f"{view}: {fixed}"


@pytest.fixture
def lesson_copy(tmp_path):
    for suffix in (".md", ".json"):
        shutil.copy(LESSONS_DIR / f"{LESSON_ONE}{suffix}", tmp_path / f"{LESSON_ONE}{suffix}")
    spec_path = tmp_path / f"{LESSON_ONE}.json"

    def write(change):
        spec = json.loads(spec_path.read_text())
        change(spec)
        spec_path.write_text(json.dumps(spec))
        return tmp_path

    return write


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda s: s["steps"][1]["action"].update(kind="nope"),
         "step 2 ('Where the time to first token goes'): unknown action kind 'nope'"),
        (lambda s: s["steps"][0]["question"].update(answer="speed"),
         "the question's answer 'speed' is not measured by action kind 'prefill'"),
        (lambda s: s["steps"].pop(), "3 step spec(s) but 01_prefill_and_ttft.md has 4 '## ' step section(s)"),
        (lambda s: s.update(minutes=25),
         "'minutes' (the estimated time to complete) must be a whole number from 1 to 10"),
        (lambda s: s["steps"][2]["action"].update(long_token=512),
         "action 'ttft_ratio' has no parameter(s) ['long_token']"),
        (lambda s: s["steps"][0]["action"].update(preset="Poem"), "unknown preset 'Poem'"),
        (lambda s: s["steps"][0].update(view="views/nowhere.py"), "'view' must name a page file under views/"),
        (lambda s: s["steps"][0]["question"]["options"][0].pop("up_to"),
         "every choice but the last needs a number 'up_to'"),
        (lambda s: s["steps"][2]["question"].update(default=7), "the 'default' 7 is not one of the slider's options"),
        (lambda s: s["steps"][0].update(settings={"dtype": "int3"}), "setting dtype must be one of"),
    ],
)
def test_a_broken_spec_names_the_file_the_step_and_the_problem(lesson_copy, change, message):
    folder = lesson_copy(change)
    with pytest.raises(LessonError) as error:
        load_lessons(folder)
    assert f"{LESSON_ONE}.json" in str(error.value) and message in str(error.value)


def test_broken_files_give_clear_errors(tmp_path):
    (tmp_path / "01_x.json").write_text("{")
    (tmp_path / "01_x.md").write_text("# Title\n\nNo steps here.\n")
    with pytest.raises(LessonError, match="01_x.md: no steps; each step starts with a '## ' heading"):
        load_lessons(tmp_path)
    (tmp_path / "01_x.md").write_text("# Title\n\n## Step\n\nText.\n")
    with pytest.raises(LessonError, match="01_x.json: not valid JSON"):
        load_lessons(tmp_path)
    (tmp_path / "01_x.json").unlink()
    with pytest.raises(LessonError, match="its step spec 01_x.json is missing"):
        load_lessons(tmp_path)
    with pytest.raises(LessonError, match="no lessons"):
        load_lessons(tmp_path / "empty")


def test_scale_cuts_token_counts_but_not_below_their_floor():
    _, parameters = resolve_parameters({"kind": "parallel_vs_sequential", "num_tokens": 400}, scale=0.1)
    assert parameters["num_tokens"] == 40 and parameters["preset"] == "Long document" and parameters["prompt"] is None
    _, parameters = resolve_parameters({"kind": "roofline", "prefill_sizes": [16, 64, 256]}, scale=0.1)
    assert parameters["prefill_sizes"] == [4, 6, 26]
    _, parameters = resolve_parameters({"kind": "chunked"}, scale=0.05)
    assert (parameters["long_prompt_tokens"], parameters["token_budget"],
            parameters["num_short_requests"]) == (26, 8, 3)
    with pytest.raises(LessonError, match="scale must be in"):
        resolve_parameters({"kind": "prefill"}, scale=0)
    with pytest.raises(LessonError, match="unknown action kind 'decode'"):
        resolve_parameters({"kind": "decode"})


def test_the_reveal_compares_the_prediction_with_the_measurement():
    ratio = lessons.Question("number", "How many times slower?", "ratio", "×", (1, 10, 50, 100), 10)
    close = format_reveal(ratio, 38.2, 50)
    assert (close.measured_text, close.prediction_text, close.close) == ("38.2×", "50×", True)
    assert close.verdict == "Close: within a factor of 1.31 of the measurement."
    far = format_reveal(ratio, 40.0, 10)
    assert not far.close and far.verdict == "Off by a factor of 4.0: you guessed low." and far.off_by == 4.0
    share = lessons.Question("number", "Share?", "forward_share_percent", "%", (0, 50, 100), 50, compare="difference",
                             close_within=10)
    assert format_reveal(share, 97.4, 90).verdict == "Close: within 7.4% of the measurement."
    assert format_reveal(share, 97.4, 50).verdict == "Off by 47.4%: you guessed low."
    steps = load_lessons()[0].steps[0].question
    right = format_reveal(steps, 1.0, 0)
    assert right.close and right.measured_text == "1 step for the whole prompt (measured: 1)"
    wrong = format_reveal(steps, 1.0, 2)
    assert not wrong.close and "About one step per prompt token" in wrong.verdict
    assert lessons.choice_for(steps, 49) == 2 and lessons.format_value(46080, "B") == "46,080 B"
    assert lessons.format_value(0.049) == "0.049" and lessons.format_value(2.0, "×") == "2×"


def test_the_run_store_keeps_the_newest_runs():
    store = lessons.RunStore(max_runs=2)
    outcomes = [lessons.ActionOutcome("prefill", {}, {}, [], {}, "m", "cpu", "float32") for _ in range(3)]
    store.put("a", outcomes[0], "lesson 1, step 1")
    store.put("b", outcomes[1], "lesson 1, step 3")
    store.put("a", outcomes[2], "lesson 1, step 2")  # a run again: now the newest
    store.put("c", outcomes[0], "lesson 2, step 1")
    assert len(store) == 2 and store.get("b") is None and store.get("a") is outcomes[2]
    assert store.origin("a") == "lesson 1, step 2" and store.origin("b") == ""
