"""The textbook engine stands alone: it imports nothing of prefillviz beyond ``prefillviz/engine/``, needs
nothing built (no compiler, no oneDNN), and its logits match the plain HF forward."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
import sys
from prefillviz.engine.engine import LLMEngine
from prefillviz.engine.config import EngineConfig
from tests.tiny_models import make_tiny_llama

model = make_tiny_llama()
prompt = list(range(3, 60))
engine = LLMEngine(model, None, EngineConfig(token_budget=16))
request = engine.add_request(prompt)
trace = engine.run()
loaded = sorted({name.split(".")[1] for name in sys.modules if name.startswith("prefillviz.")})
from tests.conftest import assert_matches_hf  # the suite's tolerances: after the count of what the engine loaded
assert_matches_hf(model, prompt, request.first_token_logits)  # within the fp32 forward's rounding
print(trace.num_steps, {step.ran["backend"] for step in trace.steps})
print(loaded)
"""


def test_the_textbook_engine_runs_on_its_own_and_matches_hf():
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "PREFILLVIZ_NO_ENGINE_OPS": "1",
           "PREFILLVIZ_NO_ONEDNN": "1"}  # nothing built, as on a machine without a compiler or oneDNN
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, cwd=ROOT, env=env,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    steps, modules = result.stdout.strip().splitlines()
    assert steps == "4 {'torch'}"  # 57 tokens in chunks of 16, on the textbook backend
    assert modules == "['engine']"  # no backends, machine, instrument, ... loaded
