"""Bad-input sweep: 30+ bad inputs against the engine, the model loader and the app.

    .venv/bin/python scripts/bad_inputs.py

Each case either runs normally, or fails with a ``PrefillVizError`` whose message a user can
act on ("handled"); anything else is a crash. The app cases drive the real pages with
Streamlit's AppTest and count an exception shown on the page as a crash. Prints one line per
case and the totals; exits non-zero if anything crashed.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from prefillviz.engine.config import EngineConfig  # noqa: E402
from prefillviz.engine.engine import LLMEngine  # noqa: E402
from prefillviz.engine.errors import PrefillVizError  # noqa: E402
from prefillviz.engine.request import SamplingParams  # noqa: E402
from prefillviz.instrument.capture import run_captured
from prefillviz.loading.models import load_model  # noqa: E402

LOADED = load_model(device="cpu", dtype="float32")
RESULTS: list[dict] = []


def case(name: str, fn) -> None:
    try:
        fn()
        outcome, message = "ran", ""
    except PrefillVizError as error:
        outcome, message = "handled", str(error)
    except Exception as error:  # a crash: the user would see a traceback
        outcome, message = "crashed", "".join(traceback.format_exception_only(type(error), error)).strip()
    RESULTS.append({"case": name, "outcome": outcome, "message": message[:160]})
    print(f"{outcome:8} {name:55} {message[:110]}")


def prefill(prompt, params=None, **config):
    engine = LLMEngine(LOADED.model, LOADED.tokenizer, EngineConfig(**config))
    engine.add_request(prompt, params or SamplingParams())
    engine.run()
    return engine


def engine_cases() -> None:
    token = LOADED.tokenizer("hello")["input_ids"][0]
    case("empty prompt", lambda: prefill(""))
    case("whitespace-only prompt", lambda: prefill("  \n\t  "))
    case("200k characters", lambda: prefill("lorem ipsum " * 16_667))
    case("emoji and mixed scripts", lambda: prefill("Привет, 世界! 🙂🚀 مرحبا नमस्ते — café"))
    case("NUL and control characters", lambda: prefill("abc\x00\x01\x07\x1b[31m def\x7f"))
    case("one token repeated past the context", lambda: prefill([token] * 9000))
    case("empty token list", lambda: prefill([]))
    case("negative token id", lambda: prefill([-1, 5]))
    case("token id past the vocabulary", lambda: prefill([10**9]))
    case("token budget 0", lambda: prefill("hi", token_budget=0))
    case("token budget -1", lambda: prefill("hi", token_budget=-1))
    case("token budget 10^9", lambda: prefill("hi", token_budget=10**9))
    case("block size 0", lambda: prefill("hi", block_size=0))
    case("block size 3", lambda: prefill("The capital of France is", block_size=3))
    case("block size 'sixteen'", lambda: prefill("hi", block_size="sixteen"))
    case("max running 0", lambda: prefill("hi", max_num_running=0))
    case("KV budget of 10 bytes", lambda: prefill("hi", kv_cache_memory_bytes=10))
    case("KV cache of 1 block for a long prompt", lambda: prefill("word " * 40, num_blocks=1))
    case("temperature -1", lambda: prefill("hi", SamplingParams(temperature=-1)))
    case("temperature 0", lambda: prefill("hi", SamplingParams(temperature=0)))
    case("temperature 1e9", lambda: prefill("hi", SamplingParams(temperature=1e9, seed=1)))
    case("top-p 0", lambda: prefill("hi", SamplingParams(temperature=1, top_p=0)))
    case("top-p 1.5", lambda: prefill("hi", SamplingParams(temperature=1, top_p=1.5)))
    case("top-k -5", lambda: prefill("hi", SamplingParams(temperature=1, top_k=-5)))
    case("max new tokens 0", lambda: prefill("hi", SamplingParams(max_new_tokens=0)))
    case("capture level 'everything'",
         lambda: run_captured(LLMEngine(LOADED.model, LOADED.tokenizer), capture_level="everything"))


def model_cases() -> None:
    for name, model_id in [
        ("unknown hub id", "no-such-org/no-such-model-xyz"),
        ("malformed id with spaces", "not a model id"),
        ("id with too many slashes", "a/b/c/d"),
        ("path with ..", "../../etc/passwd"),
        ("URL as a model id", "https://example.com/model.bin"),
        ("empty model id", ""),
        ("unknown bundled id", "bundled:gpt-17"),
    ]:
        case(f"model: {name}", lambda model_id=model_id: load_model(model_id, device="cpu"))
    case("model: unknown device", lambda: load_model(device="tpu9"))
    case("model: unknown dtype", lambda: load_model(dtype="float7"))
    os.environ["PREFILLVIZ_HOSTED"] = "1"
    try:
        case("hosted: local path", lambda: load_model(str(ROOT), device="cpu"))
        case("hosted: id off the allow-list", lambda: load_model("openai-community/gpt2", device="cpu"))
    finally:
        del os.environ["PREFILLVIZ_HOSTED"]


def app_cases() -> None:
    from streamlit.testing.v1 import AppTest

    def app_case(name: str, drive) -> None:
        def run() -> None:
            app = AppTest.from_file(str(ROOT / "app.py"), default_timeout=300)
            app.run()
            drive(app)
            if app.exception:
                raise RuntimeError(app.exception[0].value)
            if app.error:
                raise PrefillVizError(app.error[0].value)  # shown inline: handled

        case(f"app: {name}", run)

    def set_prompt(text):
        def drive(app):
            app.selectbox(key="prefill_preset").set_value("Short question").run()
            app.text_area(key="prefill_prompt").set_value(text).run()
            app.button(key="prefill_run").click().run()

        return drive

    app_case("empty prompt", set_prompt(""))
    app_case("whitespace prompt", set_prompt("   "))
    app_case("200k-character prompt", set_prompt("lorem ipsum " * 16_667))
    app_case("emoji prompt", set_prompt("🙂" * 50))
    app_case("NUL characters", set_prompt("\x00\x00 abc"))
    app_case("unknown model id",
             lambda app: app.text_input(key="sidebar_custom_model").set_value("no-such-org/nope").run())
    app_case("model id that is a URL", lambda app: app.text_input(key="sidebar_custom_model").set_value("http://127.0.0.1:1/x").run())

    def junk_query(app):
        app.query_params.update({"prompt": "\x00" * 5, "page": "../../etc", "token_budget": "-7e9", "dtype": "float7",
                                 "lesson": "999"})
        app.run()

    app_case("query string with junk values", junk_query)


if __name__ == "__main__":
    engine_cases()
    model_cases()
    app_cases()
    counts = {outcome: sum(r["outcome"] == outcome for r in RESULTS) for outcome in ("ran", "handled", "crashed")}
    print(json.dumps({"cases": len(RESULTS), **counts}))
    sys.exit(1 if counts["crashed"] else 0)
