"""The command line's size checks: each option checked before any work starts, one line that names it.

``at_least`` refuses a count below its minimum before the model loads; ``check_context_of``
refuses an option whose longest sequence passes the loaded model's context, right after the load
and before an engine is built; ``option_named`` puts the option in front of a check's own message.
"""

from __future__ import annotations

import contextlib

from prefillviz.engine.errors import ConfigError, PrefillVizError, RequestError


@contextlib.contextmanager
def option_named(option: str):
    """A check's error raised inside names the option it is about: ``--sizes 16384: N = 16,384 is past ...``."""
    try:
        yield
    except PrefillVizError as error:
        raise type(error)(f"{option}: {error}") from None


def at_least(option: str, value: int, minimum: int, meaning: str) -> None:
    """Refuse ``option value`` below ``minimum`` before any work starts (the model's load included)."""
    if value < minimum:
        raise ConfigError(f"{option} {value}: must be at least {minimum} ({meaning}).")


def check_context_of(option: str, value: int, what: str, total: int, largest: int, loaded, also: str = "") -> None:
    """Refuse ``option value`` whose longest sequence, ``what`` = ``total`` tokens, passes the loaded
    model's context; ``largest`` is the most the option may ask, given the other options."""
    context = loaded.info.max_context
    if context and total > context:
        fix = f"use {option} {largest} or less{also}" if largest >= 1 else "ask for fewer tokens"
        raise RequestError(f"{option} {value}: {what} = {total:,} tokens, but {loaded.model_id}'s context is "
                           f"{context:,} tokens; {fix}.")


def check_bench_sizes(loaded, num_tokens: int, with_vllm: bool) -> None:
    """``bench --num-tokens N`` within the model's context, before any part runs. Its longest sequence
    (``bench.py``) is the prefix hit's: a 2N-token prefix, 32 more prompt tokens and the first new one
    (the peer's 2N-token prompts with 32 new, the chunked workload's 2N + 4, are shorter); the
    side-by-side with vLLM (``measure/versus_vllm.py``) prefills 4N and gives vLLM a max_model_len of 4N + 64."""
    from prefillviz.peers.vllm_client import unavailable_for

    context = loaded.info.max_context or 0
    if with_vllm and unavailable_for(loaded.model_id, loaded.device.type) is None:
        also = f" ({(context - 33) // 2} or less with --no-vllm)"
        check_context_of("--num-tokens", num_tokens, "the bench prefills up to 4 x N + 64", 4 * num_tokens + 64,
                         (context - 64) // 4, loaded, also)
    check_context_of("--num-tokens", num_tokens, "the bench's prefix hit runs 2 x N + 33", 2 * num_tokens + 33,
                     (context - 33) // 2, loaded)


def check_long_prompt_options(args) -> tuple[list[int], tuple[float, ...]]:
    """``sparse`` and ``wall``'s sizes and keep fractions, before the model loads: (the sizes, the keep fractions)."""
    def numbers(option: str, text: str, kind: type) -> list:
        try:
            return [kind(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise ConfigError(f"{option} {text}: must be comma-separated numbers.") from None

    at_least("--runs", args.runs, 1, "timed runs")
    if args.command == "wall":
        sizes = numbers("--sizes", args.sizes, int)
        if len(set(sizes)) < 3 or min(sizes) < 1:
            raise ConfigError(f"--sizes {args.sizes}: need at least 3 different positive prompt lengths for the fits.")
        return sizes, ()
    at_least("--tokens", args.tokens, 1, "a prompt needs a token")
    keeps = tuple(numbers("--keep", args.keep, float))
    if not keeps or any(not 0 < keep <= 1 for keep in keeps):
        raise ConfigError(f"--keep {args.keep}: each fraction of key blocks kept must be in (0, 1] (1.0: dense).")
    return [args.tokens], keeps
