#!/usr/bin/env bash
# The GPU run in one command: build the CUDA backend, run its tests (kernels, the dense architecture features and
# whole models vs the CPU engine and llama.cpp's recorded log-probabilities),
# then benchmark the three models. Needs nvcc, an NVIDIA driver new enough for CUDA 13, and the test models
# (`quantscope models fetch`, done by ./dev test). On a machine without them (a device machine receives at most
# 64 MiB and reaches no registry) the tests that need one are reported as skipped and the benchmark is left out;
# the synthetic whole-model test then takes its vocabulary from $QUANTSCOPE_VOCAB_SOURCE, a vocabulary-only GGUF;
# the architecture fixtures are written here from tests/data/arch (their vocabulary: vocab.json.gz).
#   tests/run_gpu.sh [PYTEST ARGS]
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || ./dev setup || exit 1
csrc/cuda/build.sh || exit 1
"$PY" -c 'from quantscope.core.engine import cuda_backend as cb; print("cuda:", cb.cuda_status()); print(cb.build_info())'
have_models=1
"$PY" -c 'import sys; from quantscope.core import catalog; sys.exit(all(map(catalog.is_present, catalog.MODELS)) ^ 1)' \
  || { have_models=0; export QUANTSCOPE_CATALOGUE_UNAVAILABLE=1; echo "run_gpu: catalogue models absent here" >&2; }
"$PY" -m pytest -q -p no:cacheprovider -rs tests/test_cuda.py tests/test_cuda_features.py "$@"
rc=$?
if [ "$have_models" = 1 ]; then "$PY" tests/bench/bench_cuda.py || rc=1; fi
exit $rc
