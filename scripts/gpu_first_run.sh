#!/usr/bin/env bash
# The first run on a GPU just lent, in one prepared go of at most 9 minutes (prefillviz/measure/gpu_first_run.py):
# versions, the Triton tests on CUDA, one prefill, an equality check, an inspection and a profile pass on the
# bundled model's config with random weights, the 8,192-token context edge, then scripts/gpu_check.sh.
#   scripts/gpu_first_run.sh [--out DIR]            on a CUDA machine; everything it measured goes under DIR
#                                                   (default out/gpu_first_run)
#   scripts/gpu_first_run.sh --self-test [--out D]  anywhere: the same steps on the CPU, small
# Uses .venv's python when there is one, else $PYTHON or python3. Exit status 1: a check failed; 2: no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=${PYTHON:-python3}; fi
export PYTHONUNBUFFERED=1
exec timeout --kill-after=15 570 "$PY" -m prefillviz.measure.gpu_first_run "$@"
