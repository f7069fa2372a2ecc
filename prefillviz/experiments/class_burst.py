"""A class presses *Send* at once: N student-sized prompts arrive together at the engine as
``prefillviz serve`` runs it (``served_engine.py``), and each one's time to first token, in arrival order.

    arrival:    s1 s2 ... sK sK+1 ... sN           all queued before the first step
    step 0:     [P s1 .. sK]                       at most K = max_num_running requests run at once
    step 1..:   [d s1 .. sK]                       their answers, one token a step each; the rest wait
    step j:     [d ... | P sK+1 ..]                an answer ends, its slot frees: the next prompt joins

A student's request is what the Live engine page's *Send* asks of the server: the prompt through the model's
chat template (as ``/v1/chat/completions`` does), ``STUDENT_MAX_NEW_TOKENS`` new tokens at most, greedy,
stopping at the end-of-text token. The run is the engine's own (in-process), on a warmed engine, so its
steps and clocks are the ones the served engine would record, without the HTTP around them.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from prefillviz.engine.engine import LLMEngine
from prefillviz.engine.request import SamplingParams
from prefillviz.engine.trace import Trace
from prefillviz.experiments.model_setup import model_tokenizer_and_id
from prefillviz.experiments.served_engine import served_engine_config, warm_full_batch
from prefillviz.machine.progress import StepProgress

STUDENT_MAX_NEW_TOKENS = 32  # the answer a Send asks for: short, so a class's answers come back in seconds
STUDENT_QUESTIONS = (
    "Why is the sky blue?",
    "What does a compiler do?",
    "How do vaccines work?",
    "Why do leaves change colour in autumn?",
    "What is a prime number?",
    "How does a rainbow form?",
    "Why is the sea salty?",
    "What is photosynthesis?",
    "How far away is the Moon?",
    "What makes a magnet stick to a fridge?",
    "Why do we have seasons?",
    "What is an algorithm?",
)


def student_request_id(index: int) -> str:
    return f"student-{index + 1}"


def student_prompt(index: int) -> str:
    """Student ``index``'s question (each one different: the class writes its own)."""
    question = STUDENT_QUESTIONS[index % len(STUDENT_QUESTIONS)]
    return question if index < len(STUDENT_QUESTIONS) else f"I am student {index + 1}. {question}"


def chat_token_ids(tokenizer, text: str) -> list[int]:
    """``text`` as one user turn through the model's chat template, ready for the answer (plain text without one)."""
    if not getattr(tokenizer, "chat_template", None):
        return list(tokenizer(text)["input_ids"])
    encoded = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                            tokenize=True)
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


@dataclass(frozen=True)
class StudentRequest:
    """One student's request of the burst (``index``: its place in the arrival order, from 0)."""

    index: int
    request_id: str
    num_prompt_tokens: int
    num_cached_tokens: int
    ttft_s: float
    first_scheduled_step: int  # the step its prompt first ran in (0: the burst's first step)
    first_token_step: int  # the step that sampled its first token


@dataclass(frozen=True)
class BurstStep:
    """One engine step of the burst: how many prompts shared it, beside how many decodes."""

    index: int
    num_prompts: int  # requests with a prefill chunk in it
    num_prompt_tokens: int
    num_decodes: int
    num_first_tokens: int  # first tokens it sampled
    wall_s: float


@dataclass(frozen=True)
class ClassBurst:
    """What a class's burst measured (``requests`` in arrival order, ``steps`` from the burst's first)."""

    model_id: str
    device: str
    dtype: str
    token_budget: int
    max_num_running: int
    max_new_tokens: int
    requests: tuple[StudentRequest, ...]
    steps: tuple[BurstStep, ...]
    warm_up_s: float

    @property
    def num_students(self) -> int:
        return len(self.requests)

    @property
    def first_ttft_s(self) -> float:
        return min(r.ttft_s for r in self.requests)

    @property
    def last_ttft_s(self) -> float:
        return max(r.ttft_s for r in self.requests)

    @property
    def median_ttft_s(self) -> float:
        return statistics.median(r.ttft_s for r in self.requests)

    @property
    def steps_to_last_first_token(self) -> int:
        """Engine steps from the burst's first to the one that gave the last first token, both counted."""
        return 1 + max(r.first_token_step for r in self.requests)

    @property
    def num_waited(self) -> int:
        """Students whose prompt did not run in the burst's first step (queued for a running slot or budget)."""
        return sum(r.first_scheduled_step > 0 for r in self.requests)

    @property
    def max_prompts_per_step(self) -> int:
        return max(step.num_prompts for step in self.steps)

    @property
    def prompt_steps(self) -> tuple[BurstStep, ...]:
        """The steps that ran some prompt."""
        return tuple(step for step in self.steps if step.num_prompts)

    @property
    def mean_prompt_tokens(self) -> float:
        return statistics.mean(r.num_prompt_tokens for r in self.requests)

    @property
    def cached_fraction(self) -> float:
        """Prompt tokens the prefix cache served (the chat template's shared start, once computed)."""
        return sum(r.num_cached_tokens for r in self.requests) / sum(r.num_prompt_tokens for r in self.requests)


def burst_of(trace: Trace, request_ids: list[str], token_budget: int, max_num_running: int, max_new_tokens: int,
             warm_up_s: float = 0.0) -> ClassBurst:
    """The burst's measurements from its trace (``request_ids`` in arrival order; the trace holds only the burst)."""
    first_scheduled: dict[str, int] = {}
    first_token: dict[str, int] = {}
    steps = []
    for index, step in enumerate(trace.steps):
        prompts = [chunk for chunk in step.chunks if chunk.is_prefill]
        for chunk in step.chunks:
            first_scheduled.setdefault(chunk.request_id, index)
        new = [rid for rid in step.sampled_token_ids if rid not in first_token]
        first_token.update(dict.fromkeys(new, index))
        steps.append(BurstStep(index, len(prompts), sum(c.num_tokens for c in prompts),
                               len(step.chunks) - len(prompts), len(new), step.wall_time_s))
    requests = []
    for index, request_id in enumerate(request_ids):
        record = trace.requests[request_id]
        requests.append(StudentRequest(index, request_id, record.num_prompt_tokens, record.num_cached_tokens,
                                       record.time_to_first_token_s, first_scheduled[request_id],
                                       first_token[request_id]))
    return ClassBurst(trace.model_id, trace.device, trace.dtype, token_budget, max_num_running, max_new_tokens,
                      tuple(requests), tuple(steps), warm_up_s)


def estimated_num_steps(num_students: int, max_num_running: int, max_new_tokens: int) -> int:
    """About how many steps the burst takes (progress bars only): one answer's length per wave of students."""
    return math.ceil(num_students / max_num_running) * max_new_tokens


def run_class_burst(loaded_or_pair, num_students: int, max_new_tokens: int = STUDENT_MAX_NEW_TOKENS,
                    max_num_running: int | None = None, progress: StepProgress | None = None) -> ClassBurst:
    """Warm the served engine up, queue ``num_students`` student prompts at once, and run them to the end.

    Args:
        loaded_or_pair: a ``LoadedModel`` or a ``(model, tokenizer)`` pair (the tokenizer's chat template formats
            the prompts).
        num_students: requests in the burst.
        max_new_tokens: each answer's most new tokens (a Send's ``max_tokens``).
        max_num_running: the server's ``--max-num-seqs`` (None: its default).
        progress: called after each step of the burst with (steps done, the step record).
    """
    model, tokenizer, model_id = model_tokenizer_and_id(loaded_or_pair)
    changes = {} if max_num_running is None else {"max_num_running": max_num_running}
    engine = LLMEngine(model, tokenizer, served_engine_config(**changes), model_id=model_id)
    warm_up_s = warm_full_batch(engine)
    eos = getattr(tokenizer, "eos_token_id", None)
    params = SamplingParams(max_new_tokens=max_new_tokens, stop_token_ids=() if eos is None else (eos,))
    request_ids = [student_request_id(i) for i in range(num_students)]
    for index, request_id in enumerate(request_ids):
        engine.add_request(chat_token_ids(tokenizer, student_prompt(index)), params, request_id=request_id)
    trace = engine.run(progress=progress)
    config = engine.config
    return burst_of(trace, request_ids, config.token_budget, config.max_num_running, max_new_tokens, warm_up_s)
