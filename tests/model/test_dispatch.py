"""The measured dispatch: candidates checked and timed here, the fastest chosen per bucket, and
every candidate, when made the fastest by injected timings, run by the engine and still matching HF.

No CPU is assumed: the timings that make a choice are injected, so each test checks the same
thing on an AVX2 laptop, a Zen 4 or a Xeon with AMX.
"""

import copy
import dataclasses
import datetime
import json
import os
from pathlib import Path

import pytest
import torch

from prefillviz import cli
from prefillviz.backends import dispatch, dispatch_tables, dispatch_tuning, linear_checks
from prefillviz.backends.attention import ENGINE_KERNELS
from prefillviz.backends.dispatch import (
    ATTENTION,
    ATTENTION_CANDIDATES,
    BRGEMM_LINEAR,
    LINEAR_CANDIDATES,
    LINEARS,
    ONEDNN,
    SLAB_LINEAR,
    STOCK,
    TORCH_PACKED,
    V7,
    injected,
)
from prefillviz.backends.dispatch_buckets import BUCKET_NAMES, bucket_of
from prefillviz.backends.dispatch_tables import injected_table
from prefillviz.backends.measured import MEASURED
from prefillviz.engine.config import EngineConfig
from prefillviz.engine.engine import LLMEngine
from prefillviz.engine.errors import ConfigError
from prefillviz.engine.request import SamplingParams
from prefillviz.kernels.paged_attention import PagedStep
from tests.hf_oracle import hf_greedy_generate, hf_last_logits
from tests.tolerances import (
    assert_same_greedy_generation,
    assert_same_greedy_token,
    assert_within,
    logits_allowed_difference,
)

SDPA_VERSIONS = ("v6 loop, fp32 decodes", "v2 loop", "v3 packed")


def favouring(family: str, winner: str, statuses: dict) -> dict:
    """Injected timings where ``winner`` is 10x faster than every other runnable candidate of its family, in every
    bucket."""
    timings = {}
    for bucket in BUCKET_NAMES:
        timings[bucket] = {
            f: {c: (0.1 if (f == family and c == winner) else 1.0) for c, why in statuses[f].items() if not why}
            for f in (ATTENTION, LINEARS)
        }
    return timings


def excluded_of(statuses: dict) -> dict:
    return {family: {c: why for c, why in s.items() if why} for family, s in statuses.items()}


# --------------------------------------------------------------------------- choosing
def test_buckets_follow_the_step_shape():
    def step(*requests):  # (num_computed, num_new) per request
        starts = [0]
        for _, new in requests:
            starts.append(starts[-1] + new)
        return PagedStep(starts, [c for c, _ in requests], torch.arange(starts[-1]), [None] * len(requests))

    assert bucket_of(step((10, 1), (40, 1))) == "decode"
    assert bucket_of(step((1024, 29), (96, 1))) == "mixed"  # a prefix hit's chunk with a decode
    assert bucket_of(step((0, 5))) == "prefill_128"
    assert bucket_of(step((0, 300), (0, 200))) == "prefill_512"
    assert bucket_of(step((0, 2000))) == "prefill_2048"


def test_the_xeon_with_amx_figures_pick_sdpa_for_bf16_attention():
    """Issue 25's figures from a 2-core Xeon with AMX (one layer of the bundled model, bf16):
    torch's SDPA (its flash attention on oneDNN's AMX brgemm) 0.92 / 9.1 ms, v7 2.48 / 37.7 ms at 512 / 2,048 tokens."""
    timings = {
        bucket: {ATTENTION: {V7: 1.0, **dict.fromkeys(SDPA_VERSIONS, 1.2)}, LINEARS: {ONEDNN: 1.0}}
        for bucket in BUCKET_NAMES
    }
    timings["prefill_512"][ATTENTION] = {
        V7: 2.48e-3, "v2 loop": 0.92e-3, "v3 packed": 0.93e-3, "v6 loop, fp32 decodes": 0.93e-3
    }
    timings["prefill_2048"][ATTENTION] = {
        V7: 37.7e-3, "v2 loop": 9.6e-3, "v3 packed": 9.4e-3, "v6 loop, fp32 decodes": 9.1e-3
    }
    table = injected(timings, dtype="bfloat16")
    assert table.choice("prefill_512", ATTENTION) == "v2 loop"
    assert table.choice("prefill_2048", ATTENTION) == "v6 loop, fp32 decodes"
    assert table.choice("decode", ATTENTION) == V7  # where v7 was measured faster, it stays
    # 37.7 / 9.1, as the sidebar says it
    assert "4.1x faster than the engine's C++ kernel (v7)" in table.sentence(ATTENTION)


def test_the_zen4_figures_pick_v7_and_a_second_pack_needs_a_clear_gain():
    timings = {
        bucket: {ATTENTION: {V7: 1.0, "v2 loop": 4.5}, LINEARS: {ONEDNN: 1.0, TORCH_PACKED: 1.8, STOCK: 2.5}}
        for bucket in BUCKET_NAMES
    }
    # within the noise: no second copy of the weights
    timings["prefill_512"][LINEARS] = {ONEDNN: 1.0, TORCH_PACKED: 0.97, STOCK: 1.2}
    table = injected(timings)
    assert {table.choice(b, ATTENTION) for b in BUCKET_NAMES} == {V7}
    assert table.linear_packs == {ONEDNN} and {table.choice(b, LINEARS) for b in BUCKET_NAMES} == {ONEDNN}
    timings["prefill_2048"][LINEARS] = {ONEDNN: 1.0, TORCH_PACKED: 0.8, STOCK: 1.2}  # a clear gain: worth a second pack
    table = injected(timings)
    assert table.primary_linears == ONEDNN and table.linear_packs == {ONEDNN, TORCH_PACKED}
    assert table.choice("prefill_2048", LINEARS) == TORCH_PACKED
    assert table.choice("prefill_512", LINEARS) == TORCH_PACKED  # its pack is kept now: the faster of the two
    assert table.choice("decode", LINEARS) == ONEDNN


def test_once_a_second_pack_is_kept_every_bucket_runs_the_faster_of_the_two():
    """The AMX Xeon's table at 11:49 UTC (ms a layer): torch's packed linear has the least total (it
    wins the 2,048-token bucket, the largest), oneDNN wins the short steps clearly, so both packs are
    kept; at 512 rows oneDNN was 4% faster, within the second-pack margin, and runs there too."""
    timings = {
        bucket: {ATTENTION: {V7: 1.0}, LINEARS: {ONEDNN: 0.23, TORCH_PACKED: 0.32, STOCK: 0.57}}
        for bucket in BUCKET_NAMES
    }
    timings["prefill_512"][LINEARS] = {ONEDNN: 1.443, TORCH_PACKED: 1.506, STOCK: 2.145}
    timings["prefill_2048"][LINEARS] = {ONEDNN: 6.344, TORCH_PACKED: 5.593, STOCK: 7.518}
    table = injected(timings, dtype="bfloat16")
    assert table.primary_linears == TORCH_PACKED and table.linear_packs == {TORCH_PACKED, ONEDNN}
    assert table.choice("decode", LINEARS) == ONEDNN and table.choice("prefill_512", LINEARS) == ONEDNN
    assert table.choice("prefill_2048", LINEARS) == TORCH_PACKED


def test_a_forced_candidate_wins_and_one_that_cannot_run_is_refused(monkeypatch):
    table = injected({b: {ATTENTION: {V7: 1.0, "v2 loop": 2.0}, LINEARS: {STOCK: 1.0}} for b in BUCKET_NAMES},
                     excluded={LINEARS: {ONEDNN: "oneDNN is not installed"}})
    monkeypatch.setenv("PREFILLVIZ_ATTENTION", "v2")
    assert table.choice("decode", ATTENTION) == "v2 loop" and (
        "forced by PREFILLVIZ_ATTENTION" in table.sentence(ATTENTION)
    )
    monkeypatch.setenv("PREFILLVIZ_LINEARS", "oneDNN matmul")
    with pytest.raises(ConfigError, match="can't run here: oneDNN is not installed"):
        table.choice("decode", LINEARS)
    monkeypatch.setenv("PREFILLVIZ_LINEARS", "v9")
    with pytest.raises(ConfigError, match="names no linears implementation"):
        table.choice("decode", LINEARS)


# --------------------------------------------------------------------------- the engine runs each candidate
@pytest.fixture(scope="module")
def bundled_bf16(bundled):
    return copy.deepcopy(bundled.model).to(torch.bfloat16)


@pytest.fixture(scope="module")
def bundled_bf16_weights_in_fp32(bundled_bf16):
    """The bf16 model's own (rounded) weights computed in fp32: the reference every bf16 path is held to."""
    return copy.deepcopy(bundled_bf16).float()


def engine_run(model, prompt, max_new_tokens=3):
    """First-token logits, the generated tokens and each step's dispatch (a 24-token prompt in chunks of 16: prefill,
    mixed, decodes)."""
    engine = LLMEngine(model, tokenizer=None, config=EngineConfig(token_budget=16), backend=MEASURED)
    request = engine.add_request(prompt, SamplingParams(max_new_tokens=max_new_tokens))
    trace = engine.run()
    return request.first_token_logits, trace.requests[request.request_id].output_token_ids, [s.ran for s in trace.steps]


FORCINGS = [
    pytest.param(family, candidate, dtype, id=f"{candidate}-{dtype}")
    for family, names in ((ATTENTION, ATTENTION_CANDIDATES), (LINEARS, LINEAR_CANDIDATES))
    for candidate in names for dtype in ("float32", "bfloat16")
]


@pytest.mark.parametrize("family,candidate,dtype", FORCINGS)
def test_each_candidate_made_fastest_is_run_and_matches_hf(
    bundled, bundled_bf16, bundled_bf16_weights_in_fp32, dtype, family, candidate
):
    model = bundled.model if dtype == "float32" else bundled_bf16
    statuses = dispatch_tuning.candidate_statuses(model)
    if statuses[family][candidate]:
        pytest.skip(f"{candidate} can't run here: {statuses[family][candidate]}")
    prompt = bundled.tokenizer("The capital of France is Paris, and the capital of Germany is")["input_ids"] * 2
    with injected_table(model, injected(favouring(family, candidate, statuses), excluded_of(statuses), dtype=dtype)):
        logits, generated, steps = engine_run(model, prompt)
    assert [s["bucket"] for s in steps] == ["prefill_128", "mixed", "decode", "decode"]
    assert all(s[family] == candidate for s in steps)
    if dtype == "float32":
        reference = hf_last_logits(model, prompt)
        # MODEL_STEPS of fp32's grid (tests/tolerances.py)
        allowed = logits_allowed_difference(model, reference, num_tokens=len(prompt))
        assert_within(logits, reference, allowed, f"{candidate} against the HF forward")
        assert_same_greedy_token(reference, logits, allowed)
        assert_same_greedy_generation(model, prompt, generated, hf_greedy_generate(model, prompt, 3))
    else:  # every bf16 path (HF's too) rounds elsewhere: each is held to the fp32 forward of the same bf16 weights
        reference = hf_last_logits(bundled_bf16_weights_in_fp32, prompt)
        allowed = logits_allowed_difference(model, reference, num_tokens=len(prompt))  # MODEL_STEPS of bf16's grid
        assert_within(logits, reference, allowed, f"{candidate} in bf16 against the fp32 forward of its weights")
        assert_same_greedy_token(reference, logits, allowed)


# --------------------------------------------------------------------------- measuring
def test_measuring_checks_each_candidate_and_excludes_a_wrong_one(tiny_llama, monkeypatch):
    kernel = ENGINE_KERNELS["v3 packed"]
    # a wrong result: the oracle check must catch it
    broken = dataclasses.replace(kernel, forward=lambda *args: kernel.forward(*args) * 1.5)
    monkeypatch.setitem(ENGINE_KERNELS, "v3 packed", broken)
    allocator = []
    monkeypatch.setattr(dispatch_tuning, "keep_freed_memory", lambda: allocator.append("kept") or "")
    table = dispatch_tuning.measure(tiny_llama)
    assert allocator == ["kept"]  # a CPU model's candidates are timed under the engine's allocator (host_memory)
    assert "differs from the naive oracle" in table.excluded[ATTENTION]["v3 packed"]
    assert set(table.timings) == set(BUCKET_NAMES)
    for bucket in BUCKET_NAMES:
        assert "v3 packed" not in table.timings[bucket][ATTENTION]
        assert table.choice(bucket, ATTENTION) != "v3 packed"
        runnable = {
            c for c, why in dispatch_tuning.candidate_statuses(tiny_llama)[ATTENTION].items() if not why
        } - {"v3 packed"}
        assert set(table.timings[bucket][ATTENTION]) == runnable  # every other candidate timed in every bucket
        assert all(seconds > 0 for seconds in table.timings[bucket][LINEARS].values())
    assert table.source == "measured" and table.other_cpu_percent is not None and table.measure_s > 0


@pytest.mark.parametrize("candidate", LINEAR_CANDIDATES)
def test_the_linears_are_timed_as_the_engine_runs_them(tiny_llama, candidate):
    """The tuning times each candidate on the calls the engine's forward makes: q|k|v and gate|up one
    packed matmul each, or, stock, one ``F.linear`` per weight and the outputs side by side (timing
    stock on stacked weights had it win the 2,048-token bucket on a Xeon where the engine's calls lost)."""
    from prefillviz.backends.llama_weights import llama_weights

    if dispatch_tuning.candidate_statuses(tiny_llama)[LINEARS][candidate]:
        pytest.skip(dispatch_tuning.candidate_statuses(tiny_llama)[LINEARS][candidate])
    groups = linear_checks.layer_linears(tiny_llama)
    attn, mlp = tiny_llama.model.layers[0].self_attn, tiny_llama.model.layers[0].mlp
    assert [[w.data_ptr() for w in g] for g in groups] == [
        [m.weight.data_ptr() for m in ms]
        for ms in (
            [attn.q_proj, attn.k_proj, attn.v_proj], [attn.o_proj], [mlp.gate_proj, mlp.up_proj], [mlp.down_proj]
        )
    ]
    engine_layer = llama_weights(tiny_llama, candidate).layers[0]
    inputs = linear_checks.linear_inputs(groups, 9)
    timed = linear_checks.linear_layer(groups, candidate)(inputs)
    gate_up = engine_layer.gate_up(inputs[2])
    # silu(gate) * up, or [gate | up]
    assert gate_up.shape[-1] == mlp.up_proj.out_features * (1 if engine_layer.gate_up.activates else 2)
    # the forward's silu_mul
    activation = gate_up if engine_layer.gate_up.activates else linear_checks.silu_mul_for(gate_up)(gate_up)
    engine = [engine_layer.qkv(inputs[0]), engine_layer.o(inputs[1]), activation, engine_layer.down(inputs[3])]
    assert engine_layer.gate_up.activates == (candidate in (BRGEMM_LINEAR, SLAB_LINEAR))  # the packs that fuse the SiLU
    assert all(torch.equal(a, b) for a, b in zip(timed, engine))  # the same calls: the same bits


def test_the_table_is_cached_and_measured_again_when_stale(tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setenv("PREFILLVIZ_DISPATCH_CACHE", str(tmp_path))
    monkeypatch.setattr(dispatch_tables, "_tables", {})
    measured = dispatch_tables.table_for(tiny_llama)
    path = dispatch_tables.cache_path(tiny_llama)
    assert path.exists() and measured.source == "measured"
    measured.other_cpu_percent = 0.0  # as if measured on a quiet machine (this one may be busy with other tests)
    measured.spreads = {}
    dispatch_tables.write_cached(path, measured)
    monkeypatch.setattr(dispatch_tables, "_tables", {})  # a new process: read from the cache, not timed again
    monkeypatch.setattr(
        dispatch_tuning, "measure", lambda *a, **k: pytest.fail("a fresh cached table must not be measured again")
    )
    cached = dispatch_tables.table_for(tiny_llama)
    assert cached.source == "cache" and cached.choices() == measured.choices() and cached.timings == measured.timings
    old = datetime.datetime.now(datetime.UTC) - dispatch_tables.MAX_AGE - datetime.timedelta(hours=1)
    assert "older than" in dispatch_tables.is_stale(
        dispatch.DispatchTable.from_dict({**cached.as_dict(), "measured_at": old.isoformat()}), tiny_llama
    )
    assert "busy" in dispatch_tables.is_stale(
        dispatch.DispatchTable.from_dict({**cached.as_dict(), "other_cpu_percent": 90.0}), tiny_llama
    )
    assert "changed" in dispatch_tables.is_stale(
        dispatch.DispatchTable.from_dict({**cached.as_dict(), "fingerprint": "torch 0; nothing"}), tiny_llama
    )
    # a run 4x another
    noisy_spreads = {b: {f: {c: 4.0 for c in t} for f, t in fams.items()} for b, fams in cached.timings.items()}
    noisy = dispatch.DispatchTable.from_dict({**cached.as_dict(), "spreads": noisy_spreads})
    assert (
        noisy.noisy and "varied" in dispatch_tables.is_stale(noisy, tiny_llama)
        and "measured again" in noisy.provenance()
    )
    assert dispatch_tables.is_stale(cached, tiny_llama) == ""
    data = json.loads(path.read_text())
    assert data["table"]["choices"] == measured.choices() and data["format"] == dispatch_tables.FORMAT


def test_a_first_start_times_the_first_pages_shapes_then_completes_the_rest_without_checking_again(
        tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setenv("PREFILLVIZ_DISPATCH_CACHE", str(tmp_path))
    monkeypatch.setattr(dispatch_tables, "_tables", {})
    first = dispatch_tables.table_for(tiny_llama, buckets=("decode", "prefill_128"))
    assert first.partial and set(first.timings) == {"decode", "prefill_128"}
    assert not dispatch_tables.cache_path(tiny_llama).exists()  # a part is never kept on disk
    assert first.nearest_timed("prefill_512") == "prefill_128" and first.nearest_timed("decode") == "decode"
    assert dispatch_tables.table_for(tiny_llama, part_will_do=True) is first  # what the engine's steps run on
    ran = engine_run(tiny_llama, list(range(3, 27)), max_new_tokens=1)[2]
    assert ran[0]["bucket"] == "prefill_128"  # its 16-token chunk; the next step says whose choice it ran
    assert ran[1]["bucket"].startswith("mixed (not timed yet: ")
    checks = []
    for name in ("check_attention", "check_linears"):
        monkeypatch.setattr(dispatch_tuning, name, lambda *a, name=name: checks.append(name) or "")
    assert dispatch_tables.time_next_bucket(tiny_llama)  # one more bucket, as the app times them when idle
    assert set(dispatch_tables.table_for(tiny_llama, part_will_do=True).timings) == {"decode", "mixed", "prefill_128"}
    whole = dispatch_tables.table_for(tiny_llama)  # whoever needs the whole table (tune, bench) times the rest
    assert not whole.partial and tuple(whole.timings) == BUCKET_NAMES  # in the buckets' order
    assert not dispatch_tables.time_next_bucket(tiny_llama)
    assert checks == [] and whole.excluded == first.excluded  # the first part's checks stand
    assert {b: whole.timings[b] for b in first.timings} == first.timings
    assert dispatch_tables.read_cached(dispatch_tables.cache_path(tiny_llama)).timings == whole.timings
    assert dispatch_tables.table_for(tiny_llama) is whole


def test_a_losers_noisy_runs_make_the_table_noisy_only_where_they_may_have_decided():
    def table(v3_ms, v3_spread, v2_spread=1.2):
        timings = {b: {ATTENTION: {"v2 loop": 1.0, "v3 packed": v3_ms}, LINEARS: {STOCK: 1.0}} for b in BUCKET_NAMES}
        spreads = {
            b: {ATTENTION: {"v2 loop": v2_spread, "v3 packed": v3_spread}, LINEARS: {STOCK: 1.1}} for b in BUCKET_NAMES
        }
        return dispatch.DispatchTable(
            "cpu", "float32", "here", 2, "H4-KVH2-D16-hidden64-mlp128", timings, spreads=spreads
        )

    assert table(2.0, 1.5).choice("decode", ATTENTION) == "v2 loop" and not table(2.0, 1.5).noisy
    assert not table(2.0, 2.5).noisy  # ordinary jitter on a 2-core VM
    assert table(2.0, 4.0).noisy  # v3's fastest run may have been 0.5 ms, under v2's 1.0: measured again
    assert not table(5.0, 4.0).noisy  # its fastest run was at least 1.25 ms: it lost either way
    assert table(2.0, 1.5, v2_spread=3.5).noisy  # the chosen one's own runs


def test_tables_go_to_the_dispatch_folder_and_the_suites_is_not_the_users(tiny_llama, tmp_path, monkeypatch):
    suite_folder = Path(os.environ["PREFILLVIZ_DISPATCH_CACHE"])  # conftest's, for the whole run
    assert not suite_folder.is_relative_to(Path("~/.cache/prefillviz").expanduser())
    assert dispatch_tables.cache_path(tiny_llama).parent == suite_folder
    monkeypatch.delenv("PREFILLVIZ_DISPATCH_CACHE")
    monkeypatch.setenv("PREFILLVIZ_CACHE", str(tmp_path))
    assert dispatch_tables.cache_path(tiny_llama).parent == tmp_path / "dispatch"  # the app's default layout


def test_a_switch_that_removes_a_candidate_gives_a_table_without_it(tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setenv("PREFILLVIZ_DISPATCH_CACHE", str(tmp_path))
    # not a table an earlier test kept for the same runnable candidates
    monkeypatch.setattr(dispatch_tables, "_tables", {})
    monkeypatch.setenv("PREFILLVIZ_STOCK_LINEARS", "1")
    table = dispatch_tables.table_for(tiny_llama)
    assert {table.choice(b, LINEARS) for b in BUCKET_NAMES} == {STOCK}
    assert "PREFILLVIZ_STOCK_LINEARS is set" in table.excluded[LINEARS][ONEDNN]


def test_tune_prints_the_choice_and_the_timings_behind_it(bundled, capsys):
    assert cli.main(["tune", "--dtype", "float32", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result["choices"]) == set(BUCKET_NAMES)
    for bucket, chosen in result["choices"].items():
        for family in (ATTENTION, LINEARS):
            timed = result["timings_ms"][bucket][family]
            if not result["attention" if family == ATTENTION else "linears"].endswith(
                "forced by PREFILLVIZ_" + family.upper()
            ):
                # linears: the primary pack within 10%
                assert timed[chosen[family]] == min(timed.values()) or family == LINEARS
    assert result["attention"].startswith("attention: ") and "x faster than" in result["attention"] + result["linears"]
    assert all(name in ATTENTION_CANDIDATES + LINEAR_CANDIDATES for fam in result["excluded"].values() for name in fam)


def test_the_kernels_command_marks_the_engines_choice(monkeypatch, tmp_path):
    from prefillviz.measure.kernel_bench import benchmark_json, run_kernel_benchmark

    monkeypatch.setenv("PREFILLVIZ_DISPATCH_CACHE", str(tmp_path))  # no table on disk: only the one kept below
    monkeypatch.setattr(dispatch_tables, "_tables", {})  # nor one an earlier test kept for the tiny model's heads
    timings = {b: {ATTENTION: {"v2 loop": 1.0, "v3 packed": 2.0}, LINEARS: {STOCK: 1.0}} for b in BUCKET_NAMES}
    timings["mixed"][ATTENTION] = {"v2 loop": 2.0, "v3 packed": 1.0}
    table = dispatch.DispatchTable("cpu", "float32", "here", torch.get_num_threads(), "H4-KVH2-D16-hidden64-mlp128",
                                   timings, measured_at="2026-12-02T06:00:00+00:00")
    bench = run_kernel_benchmark(4, 2, 16, [32], "cpu", torch.float32, ("paged",), include_flex=False, runs=1)
    # nothing measured for these heads yet: said, not guessed
    assert benchmark_json(bench)["engine_choice"]["measured"] is False
    monkeypatch.setattr(dispatch_tables, "_tables", {("key",): table})
    result = benchmark_json(bench)
    assert result["engine_choice"]["by_bucket"]["prefill_128"] == "v2 loop" and (
        result["engine_choice"]["by_bucket"]["mixed"] == "v3 packed"
    )
    marked = {(row["workload"], row["kernel"]) for row in result["rows"] if row["engine_choice"]}
    assert marked == {("prefill", "v2 loop"), ("mixed", "v3 packed")}
