"""Pre-packed linear weights (backends/packed_weights.py): same logits, really packed, per thread,
and, like the engine's attention, a change to the shared model that the last thread out undoes.

Which op ran is read with a TorchDispatchMode, which sees every op the dispatcher runs in
its thread: a stock linear is ``aten.linear``. A packed one runs either torch's
``mkldnn._linear_pointwise`` or oneDNN's matmul primitive (``prefillviz/backends/ops/onednn_linear.py``, no torch
op), so ``packed_linear`` itself is wrapped to record its calls in the recording thread.
"""

import copy
import threading

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from prefillviz.backends import packed_weights
from prefillviz.backends.measured import MeasuredBackend
from prefillviz.backends.packed_weights import cpu_runs_packed_linear, packed_linears, packing_status
from prefillviz.backends.stock_forward import ATTENTION_NAME, engine_attention
from prefillviz.engine.config import EngineConfig
from prefillviz.engine.engine import LLMEngine
from tests.conftest import assert_matches_hf
from tests.hf_oracle import hf_last_logits
from tests.tolerances import (
    MODEL_STEPS,
    allowed_difference,
    assert_linear_close,
    assert_same_greedy_token,
    assert_within,
    logits_allowed_difference,
    longest_sum,
)

pytestmark = pytest.mark.skipif(
    not packing_status(torch.nn.Linear(2, 2))[0],
    reason=f"no packed fp32 linear here: {packing_status(torch.nn.Linear(2, 2))[1]}",
)

PACKED_CALL = "packed_linear"


_recording = threading.local()  # .names: the active OpNames' list in this thread


@pytest.fixture(autouse=True)
def record_packed_calls(monkeypatch):
    """Every ``packed_linear`` call, named in the list of the OpNames recording in its thread."""
    original = packed_weights.packed_linear

    def recorded(*args, **kwargs):
        names = getattr(_recording, "names", None)
        if names is not None:
            names.append(PACKED_CALL)
        return original(*args, **kwargs)

    monkeypatch.setattr(packed_weights, "packed_linear", recorded)


class OpNames(TorchDispatchMode):
    """Records the name of every op dispatched in this thread while active, and every packed linear."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __enter__(self):
        _recording.names = self.names
        return super().__enter__()

    def __exit__(self, *exc):
        _recording.names = None
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))

    def count(self, *names):
        return sum(name in names for name in self.names)

    @property
    def packed(self):
        return self.count(PACKED_CALL)

    @property
    def stock(self):  # F.linear shows as aten.linear in inference mode, as mm/addmm otherwise
        return self.count("aten.linear", "aten.mm", "aten.addmm")


def linear_ops(model, x):
    with torch.inference_mode(), OpNames() as ops:
        model(x)
    return ops


def engine_logits(model, token_ids, pack):
    engine = LLMEngine(model, tokenizer=None, config=EngineConfig(), backend=MeasuredBackend(pack_linear_weights=pack))
    request = engine.add_request(token_ids)
    engine.run()
    return request.first_token_logits


def test_engine_runs_packed_linears_and_matches_hf_in_fp32(tiny_llama):
    prompt = list(range(3, 40))
    with packed_linears(tiny_llama) as packed:
        ops = linear_ops(tiny_llama, torch.tensor([prompt]))
    assert packed
    num_linears = sum(type(m) is torch.nn.Linear for m in tiny_llama.modules())  # 7 per layer + lm_head
    assert ops.packed == num_linears and ops.stock == 0
    assert_matches_hf(tiny_llama, prompt, engine_logits(tiny_llama, prompt, pack=True))
    # outside the block the same modules run the stock matmul again
    outside = linear_ops(tiny_llama, torch.tensor([prompt]))
    assert outside.packed == 0 and outside.stock == num_linears


@pytest.mark.skipif(
    not cpu_runs_packed_linear(torch.bfloat16)[0],
    reason=f"this CPU can't pack bf16: {cpu_runs_packed_linear(torch.bfloat16)[1]}",
)
def test_bundled_bf16_packed_equals_stock_and_greedy_agrees(bundled):
    """Packed and stock bf16 linears sum in other orders (AMX tiles, AVX512-BF16 dot products): each
    run, and the two against each other, within a few bf16 steps of the logits (``MODEL_STEPS``)."""
    model = copy.deepcopy(bundled.model).to(torch.bfloat16)
    prompt = bundled.tokenizer("The capital of France is")["input_ids"] * 8
    reference = hf_last_logits(model.float(), prompt)  # the same (bf16-rounded) weights in fp32 arithmetic
    model.to(torch.bfloat16)  # fp32 -> bf16 of bf16 values is exact: the same weights again
    packed, stock = engine_logits(model, prompt, pack=True), engine_logits(model, prompt, pack=False)
    allowed = logits_allowed_difference(model, reference, num_tokens=len(prompt))
    for name, logits in (("packed", packed), ("stock", stock)):
        assert_within(logits, reference, allowed, f"{name} bf16 against fp32")
        assert_same_greedy_token(reference, logits, allowed)
    assert_within(packed, stock, allowed, "packed against stock bf16")
    assert_same_greedy_token(stock, packed, allowed)


def test_only_the_thread_inside_the_block_runs_packed(tiny_llama):
    x = torch.tensor([list(range(3, 20))])
    inside, ready, done = {}, threading.Event(), threading.Event()

    def other_thread():
        ready.wait()
        inside["other"] = linear_ops(tiny_llama, x)  # runs while the main thread is inside the block
        done.set()

    thread = threading.Thread(target=other_thread)
    thread.start()
    with packed_linears(tiny_llama):
        ready.set()
        done.wait(timeout=60)
        inside["main"] = linear_ops(tiny_llama, x)
    thread.join()
    assert inside["main"].packed > 0 and inside["main"].stock == 0
    assert inside["other"].packed == 0 and inside["other"].stock == inside["main"].packed


def test_changed_weights_are_packed_again(tiny_llama):
    model = copy.deepcopy(tiny_llama)
    layer = model.model.layers[0].mlp.down_proj
    x = torch.randn(1, 5, layer.in_features)
    with torch.inference_mode(), packed_linears(model):
        before = layer(x)
    with torch.no_grad():
        layer.weight.mul_(2.0)  # in place: same storage, new version
    with torch.inference_mode(), packed_linears(model):
        after = layer(x)
    # doubling every weight doubles every product and sum exactly (powers of two)
    assert torch.equal(after, 2.0 * before)
    assert_linear_close(after, x, layer.weight)


def test_a_deep_copy_computes_with_its_own_weights(tiny_llama):
    with packed_linears(tiny_llama):  # copied while every linear's forward is rerouted
        copied = copy.deepcopy(tiny_llama)
    with torch.no_grad():
        copied.lm_head.weight.zero_()
    x = torch.tensor([[5, 6, 7]])
    with torch.inference_mode(), packed_linears(copied):
        assert copied(x).logits.abs().max().item() == 0.0
    with torch.inference_mode():
        assert tiny_llama(x).logits.abs().max().item() > 0.0


def test_packing_is_skipped_where_it_does_not_apply(tiny_llama):
    with packed_linears(tiny_llama, enabled=False) as packed:
        assert not packed
        ops = linear_ops(tiny_llama, torch.tensor([[5, 6]]))
        assert ops.packed == 0 and ops.stock > 0
    half = copy.deepcopy(tiny_llama).to(torch.float16)
    ok, why = packing_status(half)
    assert not ok and "float16" in why
    with packed_linears(half) as packed:
        assert not packed


def test_a_new_dtype_is_packed_again(tiny_llama):
    model = copy.deepcopy(tiny_llama)
    x = torch.tensor([[5, 6, 7, 8]])
    with torch.inference_mode():
        with packed_linears(model):
            model(x)  # packs the fp32 weights
        model.to(torch.bfloat16)
        with torch.no_grad():
            model.lm_head.weight.mul_(-1.0)
        model.to(torch.float32)  # fresh fp32 storage, version 0, possibly where the first one was freed
        with packed_linears(model):
            packed = model(x).logits
        stock = model(x).logits
    # a stale pack would keep the lm_head's old sign; the fresh one differs only in its sums' order
    assert_within(
        packed, stock, allowed_difference(torch.float32, stock, MODEL_STEPS, longest_sum(model, x.shape[1])),
        "packed against stock fp32",
    )


def engine_settings(model):
    """What the engine changes on the shared model: (attention implementation, linears with a rerouted forward)."""
    return (
        model.config._attn_implementation,
        sum("forward" in m.__dict__ for m in model.modules() if type(m) is torch.nn.Linear),
    )


def test_the_model_is_stock_again_after_the_blocks_even_on_error(tiny_llama):
    stock = engine_settings(tiny_llama)
    assert stock == ("sdpa", 0)
    with engine_attention(tiny_llama), packed_linears(tiny_llama):
        assert engine_settings(tiny_llama)[0] == ATTENTION_NAME and engine_settings(tiny_llama)[1] > 0
    assert engine_settings(tiny_llama) == stock
    with pytest.raises(RuntimeError, match="inside"), engine_attention(tiny_llama), packed_linears(tiny_llama):
        raise RuntimeError("failed inside the block")
    assert engine_settings(tiny_llama) == stock
    engine = LLMEngine(tiny_llama, None)
    engine.add_request([5, 6, 7])
    engine.run()
    assert engine_settings(tiny_llama) == stock


def test_overlapping_threads_never_undo_each_others_settings(tiny_llama):
    """Sessions are threads sharing one model: the first thread out must not restore it under the second."""
    x = torch.tensor([list(range(3, 20))])
    entered, leave, left = threading.Event(), threading.Event(), threading.Event()

    def first_session():
        with engine_attention(tiny_llama), packed_linears(tiny_llama):
            entered.set()
            leave.wait(timeout=60)
        left.set()

    thread = threading.Thread(target=first_session)
    thread.start()
    entered.wait(timeout=60)
    with engine_attention(tiny_llama), packed_linears(tiny_llama):
        leave.set()
        left.wait(timeout=60)  # the first session has left; this one is still inside
        assert tiny_llama.config._attn_implementation == ATTENTION_NAME
        assert linear_ops(tiny_llama, x).stock == 0
    thread.join()
    assert engine_settings(tiny_llama) == ("sdpa", 0)


def test_engines_in_two_threads_on_one_model_both_match_hf(tiny_llama):
    prompts = {"a": list(range(3, 60)), "b": list(range(70, 101))}
    logits, errors = {}, []

    def serve(name):
        try:
            for _ in range(3):
                engine = LLMEngine(tiny_llama, None, EngineConfig(token_budget=8))  # several steps each
                request = engine.add_request(prompts[name])
                engine.run()
                logits.setdefault(name, []).append(request.first_token_logits)
        except Exception as error:  # reported below, in the main thread
            errors.append(error)

    threads = [threading.Thread(target=serve, args=(name,)) for name in prompts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    for name, prompt in prompts.items():
        for row in logits[name]:
            assert_matches_hf(tiny_llama, prompt, row)
    assert engine_settings(tiny_llama) == ("sdpa", 0)
