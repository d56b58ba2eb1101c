#!/usr/bin/env bash
# The GPU run in one command: build the CUDA backend, run its tests (kernels and whole models vs the CPU engine),
# then benchmark the three models. Needs nvcc, an NVIDIA driver new enough for CUDA 13, and the test models
# (`quantscope models fetch`, done by ./dev test).
#   tests/run_gpu.sh [PYTEST ARGS]
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || ./dev setup || exit 1
csrc/cuda/build.sh || exit 1
"$PY" -c 'from quantscope.core.engine import cuda_backend as cb; print("cuda:", cb.cuda_status()); print(cb.build_info())'
"$PY" -m pytest -q -p no:cacheprovider -rs tests/test_cuda.py "$@"
rc=$?
"$PY" tests/bench/bench_cuda.py || rc=1
exit $rc
