"""The replay (figures/replay): its frames are the trace's recorded events at their measured times, a
token's highlighted slots are its slot mapping, its attention maps are the inspection pass's softmax, and
the HTML file holds all of it with nothing fetched. Real runs of the tiny random Llama (2 layers, 4 heads);
the browser half is tests/browser/test_browser_replay.py."""

import random
import re

import numpy as np
import pytest

from prefillviz.analysis.attention_maps import attention_probs
from prefillviz.cli import main
from prefillviz.engine.errors import PrefillVizError
from prefillviz.experiments import chunked, prefix
from prefillviz.experiments.one_request import run_one
from prefillviz.experiments.replay_runs import ReplayRuns, texts_of
from prefillviz.figures.replay.attention import attention_payload, decode_cells
from prefillviz.figures.replay.build import replay_payload
from prefillviz.figures.replay.frames import num_events, sampled_time_s, scheduled_time_s, trace_frames
from prefillviz.figures.replay.page import SCRIPTS, check_writable, replay_html, write_replay
from prefillviz.figures.replay.scenes import lane_payload, token_slots

NUM_TOKENS = 20


def prompt_ids(n, seed=0):
    rng = random.Random(seed)
    return [rng.randrange(1, 128) for _ in range(n)]


@pytest.fixture(scope="module")
def tiny_runs(tiny_llama):
    """The four runs of a replay, made by the experiments the pages use, on the tiny model."""
    prompt = prompt_ids(NUM_TOKENS)
    parallel, _ = run_one(tiny_llama, None, prompt, NUM_TOKENS, "inspect")
    token_by_token, _ = run_one(tiny_llama, None, prompt, 1, "inspect")
    workload = chunked.ChunkedWorkload(
        short_prompts=(tuple(prompt_ids(6, 1)), tuple(prompt_ids(7, 2))), short_max_new_tokens=5,
        long_prompt=tuple(prompt_ids(30, 3)), long_max_new_tokens=2, arrival_step=1, token_budget=12, block_size=4,
    )
    chunked_trace = chunked.run_workload(tiny_llama, workload, True)
    shared = tuple(prompt_ids(10, 4))
    stream = prefix.PrefixStream((("q1", shared + (5, 6, 7)), ("q2", shared + (8, 9))), len(shared), 2, 4)
    runner = prefix.StreamRunner(tiny_llama, stream, True, None, "cache on")
    for request_id, ids in stream.prompts:
        runner.serve(request_id, ids)
    traces = [parallel, token_by_token, chunked_trace, runner.result().trace]
    return ReplayRuns("tiny", parallel.device, parallel.dtype, NUM_TOKENS, *traces, token_text=texts_of(None, traces))


def test_frames_are_the_traces_events_at_their_measured_times(tiny_runs):
    parallel, token_by_token = tiny_runs.parallel, tiny_runs.token_by_token
    # one step: scheduled, 2 layers wrote, 1 token sampled; token by token: 20 steps x (step + 2 layers) + 1 token
    assert [f.kind for f in trace_frames(parallel)] == ["step", "kv_write", "kv_write", "token"]
    assert len(trace_frames(token_by_token)) == num_events(token_by_token) == NUM_TOKENS * 3 + 1
    for trace in (parallel, token_by_token, tiny_runs.chunked, tiny_runs.prefix):
        frames = trace_frames(trace)
        assert len(frames) == num_events(trace)
        assert [f.time_s for f in frames] == sorted(f.time_s for f in frames)  # in the order they happened
        for frame in frames:
            step = trace.steps[frame.step]
            assert step.start_time_s <= frame.time_s <= step.start_time_s + step.wall_time_s
            if frame.kind == "step":
                assert frame.time_s == scheduled_time_s(step)
            if frame.kind == "token":
                assert frame.time_s == sampled_time_s(step)
                assert step.sampled_token_ids[frame.request_id] == frame.token_id
    # a layer's write sits at the end of its span: layer 1's is later than layer 0's by layer 1's measured time
    step = parallel.steps[0]
    kv = [f for f in trace_frames(parallel) if f.kind == "kv_write"]
    assert [f.layer for f in kv] == step.kv_writes.layers_written == [0, 1]
    assert kv[1].time_s - kv[0].time_s == pytest.approx(step.layer_times.layer_s[1])
    # a timing pass has no KV write log: steps and tokens only
    assert {f.kind for f in trace_frames(tiny_runs.chunked)} == {"step", "token"}


def test_a_tokens_slots_are_its_slot_mapping_in_every_layer(tiny_runs):
    for trace in (tiny_runs.parallel, tiny_runs.token_by_token):
        request_id = next(iter(trace.requests))
        table = [b for step in trace.steps for b in step.blocks_allocated.get(request_id, [])]
        block_size = trace.engine_config["block_size"]
        for position in (0, 7, NUM_TOKENS - 1):
            slot = table[position // block_size] * block_size + position % block_size  # the block table's slot
            assert token_slots(trace, request_id, position) == [(0, slot), (1, slot)]
        lane = lane_payload(trace, "lane")
        logged = {p: s for step in lane["steps"] for _, positions, slots in step["kv"]
                  for p, s in zip(positions, slots)}
        assert logged == {p: token_slots(trace, request_id, p)[0][1] for p in range(NUM_TOKENS)}
    assert token_slots(tiny_runs.chunked, chunked.LONG_REQUEST_ID, 3) == []  # no write log: nothing made up


def test_the_payload_counts_every_event_and_names_what_ran(tiny_runs):
    payload = replay_payload(tiny_runs)
    traces = {"prefill": [tiny_runs.parallel, tiny_runs.token_by_token], "chunked": [tiny_runs.chunked],
              "prefix": [tiny_runs.prefix]}
    assert [s["id"] for s in payload["scenes"]] == list(traces)
    for scene in payload["scenes"]:
        assert scene["num_frames"] == sum(num_events(t) for t in traces[scene["id"]])
        for lane, trace in zip(scene["lanes"], traces[scene["id"]]):
            assert len(lane["frames"]["time_s"]) == num_events(trace) and len(lane["steps"]) == trace.num_steps
    assert payload["num_frames"] == sum(num_events(t) for ts in traces.values() for t in ts)
    prefill, chunked_scene, prefix_scene = payload["scenes"]
    assert [lane["pass"].split(" (")[0] for lane in prefill["lanes"]] == ["inspection pass"] * 2
    assert chunked_scene["lanes"][0]["pass"].startswith("timing pass")
    assert f"same {NUM_TOKENS}-token prompt" in prefill["caption"]
    assert "q2 finds 2 blocks (8 tokens) and computes 4" in prefix_scene["caption"]  # 10 shared tokens = 2 full blocks
    assert "a 30-token prompt" in chunked_scene["caption"]


def test_the_attention_map_is_the_inspection_passs_softmax_one_byte_a_cell(tiny_runs):
    parallel = tiny_runs.parallel
    captured = parallel.captured_qk[next(iter(parallel.requests))]
    attention = replay_payload(tiny_runs)["scenes"][0]["attention"]
    assert attention["layers"] == [0, 1] and attention["heads"] == [0, 1, 2, 3]  # tiny: every map fits
    assert (attention["num_heads"], attention["num_kv_heads"], attention["scale"]) == (4, 2, "sqrt")
    assert [(m["layer"], m["head"]) for m in attention["maps"]] == [(layer, head) for layer in (0, 1)
                                                                     for head in range(4)]
    for entry in attention["maps"]:
        recorded = decode_cells(entry["cells"], NUM_TOKENS)
        assert recorded.shape == (NUM_TOKENS, NUM_TOKENS)
        assert not np.triu(recorded, 1).any()  # causal: nothing above the diagonal
        layer, head = entry["layer"], entry["head"]
        probs = attention_probs(captured.queries[layer], captured.keys[layer], head, captured.scaling[layer]).numpy()
        # within half a uint8 step on the sqrt scale, and so within one step of p
        assert np.abs(np.sqrt(recorded) - np.sqrt(probs)).max() <= 0.5 / 255 + 1e-6
        assert np.abs(recorded - probs).max() <= 2 / 255
        assert recorded[0, 0] == 1.0 and np.allclose(recorded.sum(axis=1), 1, atol=NUM_TOKENS * 2 / 255)
    # a long prompt keeps head 0 of each layer past the budget; a timing pass has no map to show
    assert attention_payload(parallel, max_bytes=1)["heads"] == [0]
    assert attention_payload(tiny_runs.chunked) is None


def test_the_html_file_is_self_contained_and_carries_its_frame_count(tiny_runs, tmp_path):
    payload = replay_payload(tiny_runs)
    document = replay_html(payload)
    assert re.search(r'<div id="replay" data-frames="(\d+)"', document).group(1) == str(payload["num_frames"])
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=", document)  # nothing fetched
    assert "default-src 'none'" in document  # and the page may fetch nothing
    payload["token_text"]["1"] = "</script><!--"  # a token's text can't end the data early
    tricky = replay_html(payload)
    assert tricky.count("</script>") == document.count("</script>") == 1 + len(SCRIPTS) + 1 and "<!--" not in tricky
    path = write_replay(document, tmp_path / "deeper" / "replay.html")
    assert path.read_text(encoding="utf-8") == document
    with pytest.raises(PrefillVizError, match="in the way"):
        write_replay(document, tmp_path)
    with pytest.raises(PrefillVizError, match="in the way"):
        check_writable(tmp_path)


def test_an_unwritable_out_is_one_line_before_the_model_loads(capsys, tmp_path):
    blocker = tmp_path / "a file"
    blocker.write_text("")
    assert main(["replay", "--tokens", "16", "--out", str(blocker / "replay.html"), "--model", "/no/such/model"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("error: --out ") and "\n" not in error and "Can't write" in error
    assert main(["replay", "--tokens", "1", "--out", str(tmp_path / "r.html")]) == 2
    assert "between 2 and" in capsys.readouterr().err
