"""Bad input fails with a clear PrefillVizError and leaves the engine usable; failed requests free their blocks.
On the command line, every size option is checked before any work starts: one line, exit status 2."""

import types

import psutil
import pytest
import torch

from prefillviz.cli import main
from prefillviz.engine.backend import TorchBackend
from prefillviz.engine.config import EngineConfig
from prefillviz.engine.engine import LLMEngine
from prefillviz.engine.errors import PrefillVizError, RequestError
from prefillviz.engine.request import SamplingParams
from tests.conftest import assert_matches_hf

PROMPT = list(range(3, 23))


def still_serves(engine, model):
    request = engine.add_request(PROMPT)
    engine.run()
    assert_matches_hf(model, PROMPT, request.first_token_logits)
    assert engine.block_pool.num_free_blocks == engine.num_blocks


@pytest.mark.parametrize("prompt", ["", "   \n\t "])
def test_empty_prompt_is_refused_then_the_engine_still_serves(bundled, prompt):
    engine = LLMEngine(bundled.model, bundled.tokenizer, EngineConfig())
    with pytest.raises(RequestError, match="empty"):
        engine.add_request(prompt)
    with pytest.raises(RequestError, match="empty"):
        engine.add_request([])
    still_serves(engine, bundled.model)


def test_prompt_longer_than_the_context_is_refused(tiny_llama):
    engine = LLMEngine(tiny_llama, None, EngineConfig())
    with pytest.raises(RequestError, match="context of 512 tokens. Shorten the prompt."):
        engine.add_request([5] * 600)
    with pytest.raises(
        RequestError, match="context of 512 tokens. Ask for at most 12 new tokens, or shorten the prompt."
    ):
        engine.add_request([5] * 500, SamplingParams(max_new_tokens=13))
    still_serves(engine, tiny_llama)


def test_prompt_longer_than_the_kv_capacity_is_refused(tiny_llama):
    engine = LLMEngine(tiny_llama, None, EngineConfig(block_size=4, num_blocks=6))
    with pytest.raises(RequestError, match="KV cache holds 24"):
        engine.add_request([5] * 20, SamplingParams(max_new_tokens=8))
    still_serves(engine, tiny_llama)


def test_bad_sampling_settings_are_refused(tiny_llama):
    engine = LLMEngine(tiny_llama, None, EngineConfig())
    for params in [SamplingParams(max_new_tokens=0), SamplingParams(temperature=-1), SamplingParams(top_p=0)]:
        with pytest.raises(RequestError):
            engine.add_request(PROMPT, params)
    with pytest.raises(RequestError, match="Token ids"):
        engine.add_request([1, 2, 10_000])


def test_kv_budget_below_one_block_is_refused(tiny_llama):
    with pytest.raises(RequestError, match="smaller than one block"):
        LLMEngine(tiny_llama, None, EngineConfig(kv_cache_memory_bytes=100))


class FailAtLayer(TorchBackend):
    """The textbook backend, but its attention raises once in layer 1: a real failure inside the model's forward."""

    def __init__(self, error):
        super().__init__()
        self.error = error

    def for_step(self, model, meta):
        ops, backend = super().for_step(model, meta), self
        attention = ops.attention

        def failing(layer, *args, **kwargs):
            if backend.error is not None and layer == 1:
                error, backend.error = backend.error, None
                raise error
            return attention(layer, *args, **kwargs)

        ops.attention = failing
        return ops


@pytest.mark.parametrize(
    "error, expected",
    [
        (torch.OutOfMemoryError("CUDA out of memory"), "Out of memory"),
        (
            RuntimeError("[enforce fail at alloc_cpu.cpp:121] DefaultCPUAllocator: can't allocate memory"),
            "Out of memory",
        ),
        (RuntimeError("kernel failed"), "kernel failed"),
    ],
)
def test_a_failed_step_frees_its_requests_blocks_and_the_engine_recovers(tiny_llama, error, expected):
    engine = LLMEngine(tiny_llama, None, EngineConfig(block_size=4))
    engine.add_request([7] * 9, SamplingParams(max_new_tokens=3), request_id="decoding")
    engine.step()
    engine.runner.backend = FailAtLayer(error)
    victim = engine.add_request([9] * 30, request_id="victim")
    with pytest.raises((PrefillVizError, RuntimeError), match=expected):
        engine.step()
    assert victim.status.value == engine.trace().requests["victim"].status == "finished_aborted"
    assert victim.block_table == []
    assert engine.block_pool.num_free_blocks == engine.num_blocks
    still_serves(engine, tiny_llama)


# ---------------------------------------------------------------- the command line: refused before any work
BUNDLED = "bundled:SmolLM2-135M-Instruct"  # its context: 8,192 tokens


@pytest.fixture
def no_work(monkeypatch):
    """Every command's work fails the test if it is reached: the model's load, an engine (it may first
    measure its dispatch), the bench, the kernel benchmark, the disaggregated run."""

    def started(*args, **kwargs):
        pytest.fail("the work started before the check refused it")

    for target in (
        "prefillviz.loading.models.load_model", "prefillviz.engine.engine.LLMEngine",
        "prefillviz.measure.bench.run_bench", "prefillviz.measure.kernel_bench.run_kernel_benchmark",
        "prefillviz.disagg.experiment.compare_setups",
    ):
        monkeypatch.setattr(target, started)
    return monkeypatch


@pytest.fixture
def loads_bundled(no_work, bundled):
    """As ``no_work``, but loading the model is allowed (the session's bundled model, at once)."""
    no_work.setattr("prefillviz.loading.models.load_model", lambda *args, **kwargs: bundled)
    return no_work


def refused(capsys, *argv) -> str:
    """``python -m prefillviz *argv`` in this process: exit status 2, nothing on stdout, one line on
    stderr (returned), and no process started or left running."""
    children = set(psutil.Process().children(recursive=True))
    assert main(list(argv)) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert len(captured.err.splitlines()) == 1, captured.err
    assert set(psutil.Process().children(recursive=True)) <= children
    return captured.err.strip()


def test_run_options_are_refused_before_the_model_loads(no_work, capsys):
    assert refused(capsys, "run", "--prompt", "hi", "--max-new-tokens", "0") == (
        "error: --max-new-tokens 0: must be at least 1 (the prefill samples the first token)."
    )
    assert refused(capsys, "trace", "--prompt", "hi", "--out", "unused", "--block-size", "0") == (
        "error: --token-budget 2048, --block-size 0: block_size must be a positive whole number, got 0."
    )


def test_run_past_the_context_is_refused_before_an_engine_is_built(loads_bundled, bundled, capsys):
    assert refused(capsys, "run", "--prompt", "The capital of France is", "--max-new-tokens", "9000") == (
        "error: --max-new-tokens 9000: The prompt has 5 tokens; with 9,000 new token(s) that is 9,005, more than "
        f"{BUNDLED}'s context of 8,192 tokens. Ask for at most 8,187 new tokens, or shorten the prompt."
    )
    long_prompt = "word " * 9000
    num_tokens = len(bundled.tokenizer(long_prompt)["input_ids"])
    assert refused(capsys, "run", "--prompt", long_prompt) == (
        f"error: --prompt: The prompt has {num_tokens:,} tokens; with 1 new token(s) that is {num_tokens + 1:,}, "
        f"more than {BUNDLED}'s context of 8,192 tokens. Shorten the prompt."
    )


def test_bench_sizes_are_refused_before_the_bench_runs(loads_bundled, capsys):
    assert refused(capsys, "bench", "--runs", "0") == "error: --runs 0: must be at least 1 (timed runs per figure)."
    assert refused(capsys, "bench", "--num-tokens", "0") == (
        "error: --num-tokens 0: must be at least 1 (the prompt length the bench prefills)."
    )
    # vLLM here: it prefills 4N
    loads_bundled.setattr("prefillviz.peers.vllm_client.unavailable_for", lambda *args: None)
    assert refused(capsys, "bench", "--num-tokens", "8192") == (
        "error: --num-tokens 8192: the bench prefills up to 4 x N + 64 = 32,832 tokens, but "
        f"{BUNDLED}'s context is 8,192 tokens; use --num-tokens 2032 or less (4079 or less with --no-vllm)."
    )
    assert refused(capsys, "bench", "--num-tokens", "4080", "--no-vllm") == (
        "error: --num-tokens 4080: the bench's prefix hit runs 2 x N + 33 = 8,193 tokens, but "
        f"{BUNDLED}'s context is 8,192 tokens; use --num-tokens 4079 or less."
    )
    benched = []
    loads_bundled.setattr("prefillviz.measure.bench.run_bench", lambda *args, **kwargs: benched.append(args[3]) or {})
    assert main(["bench", "--num-tokens", "2032"]) == 0 and main(["bench", "--num-tokens", "4079", "--no-vllm"]) == 0
    assert benched == [2032, 4079]  # the largest sizes pass the check


def test_kernel_sizes_are_refused_before_any_kernel_runs(no_work, capsys):
    assert refused(capsys, "kernels", "--runs", "0") == (
        "error: --runs 0: must be at least 1 (timed runs per kernel and N)."
    )
    assert refused(capsys, "kernels", "--sizes", "128,16384") == (
        "error: --sizes 128,16384: N = 16,384 is past smollm2-135m's context of 8,192 tokens; use N of 8,192 or less."
    )
    no_work.setattr("prefillviz.measure.kernel_bench.device_memory_bytes", lambda device: 64 * 2**30)
    assert refused(capsys, "kernels", "--shape", "llama-3.2-1b", "--sizes", "4096,50000", "--device", "cpu") == (
        "error: --sizes 4096,50000: N = 50,000 needs 298.0 GiB for v1's (H, N, N) fp32 scores (H = 32), "
        "more than this machine's 64.0 GiB; use N of 23,170 or less."
    )


def test_disagg_sizes_are_refused_before_any_run(loads_bundled, capsys):
    assert refused(capsys, "disagg", "--short-new-tokens", "1") == (
        "error: --short-new-tokens 1: must be at least 2 (the prefill worker makes the first token, "
        "the decode worker the rest)."
    )
    assert refused(capsys, "disagg", "--arrival-step", "-1") == (
        "error: --arrival-step -1: must be at least 0 (engine steps before the long prompt arrives)."
    )
    assert refused(capsys, "disagg", "--token-budget", "0") == (
        "error: --token-budget 0: token_budget must be a positive whole number, got 0."
    )
    assert refused(capsys, "disagg", "--long-prompt-tokens", "9000") == (
        "error: --long-prompt-tokens 9000: the long request is 9,000 prompt + 4 new tokens = 9,004 tokens, "
        f"but {BUNDLED}'s context is 8,192 tokens; use --long-prompt-tokens 8188 or less."
    )
    assert refused(capsys, "disagg", "--short-new-tokens", "8190") == (  # the larger part is the one named
        "error: --short-new-tokens 8190: the short request is 16 prompt + 8,190 new tokens = 8,206 tokens, "
        f"but {BUNDLED}'s context is 8,192 tokens; use --short-new-tokens 8176 or less."
    )
    workloads = []
    loads_bundled.setattr(
        "prefillviz.disagg.experiment.compare_setups",
        lambda loaded, workload: workloads.append(workload) or types.SimpleNamespace(as_json=dict),
    )
    assert main(["disagg", "--long-prompt-tokens", "8188"]) == 0  # the largest passes
    assert len(workloads[0].long_prompt) + workloads[0].long_max_new_tokens == 8192
