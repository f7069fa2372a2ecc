#!/usr/bin/env bash
# The GPU checks of issue 6, as one prepared run (see prefillviz/measure/gpu_check.py):
#   scripts/gpu_check.sh               on a CUDA machine: prefill tok/s and MFU, CUDA events vs
#                                      the profiler, the Triton kernel vs SDPA (JSON lines)
#   scripts/gpu_check.sh --self-test   anywhere: the same code on the CPU with tiny sizes
# Uses .venv's python when there is one, else $PYTHON or python3. Exit status 1: a check failed.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=${PYTHON:-python3}; fi
export PYTHONUNBUFFERED=1
exec "$PY" -m prefillviz.measure.gpu_check "$@"
