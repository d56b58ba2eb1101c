#!/usr/bin/env bash
# The one device check: build the CUDA backend for sm_90, write the test files it needs, run tests/test_cuda*.py
# (device kernels and whole models against the CPU engine), print one summary table. Self-contained for a device
# machine that reaches nothing and receives at most 64 MiB: what its image lacks travels in build/gpu-carry (a few
# MiB), made beforehand where the registry is reachable:
#   tests/run_gpu.sh --prepare         here: build/gpu-carry/ = wheels of cffi, pycparser and gguf for Python 3.12,
#                                      the CPU extension built here (abi3), SmolLM2's vocabulary (vocabulary only)
#   tests/run_gpu.sh [PYTEST ARGS]     there (carry build/gpu-carry); also runs here, where the GPU tests skip
# Catalogue models absent (a device machine has none): QUANTSCOPE_CATALOGUE_UNAVAILABLE=1, their tests are reported
# as skipped, and the whole-model tests use synthetic models written from the vocabulary (core/synthetic.py). With
# no vocabulary carried either, an architecture fixture's (tests/arch_fixtures.py) is written and used.
# Environment: PYTHON, QSC_ARCHS (default 90), QSC_JOBS (default 8), QUANTSCOPE_GPU_WORK (default
# /tmp/quantscope-gpu), QUANTSCOPE_GPU_TEST_TIMEOUT (seconds for pytest, default 300). $OUT, when set, gets the
# summary and the JUnit report.
set -uo pipefail
cd "$(dirname "$0")/.."
CARRY=build/gpu-carry
WORK=${QUANTSCOPE_GPU_WORK:-/tmp/quantscope-gpu}
t0=$(date +%s)

if [ "${1:-}" = "--prepare" ]; then
  PY=${PYTHON:-.venv/bin/python}
  [ -x "$PY" ] || ./dev setup || exit 1
  rm -rf "$CARRY" && mkdir -p "$CARRY/wheels" || exit 1
  pins=$("$PY" -c 'import cffi, pycparser; print(f"cffi=={cffi.__version__} pycparser=={pycparser.__version__}")')
  # shellcheck disable=SC2086
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$CARRY/wheels" $pins gguf==0.19.0 || exit 1
  cp core/native/_quantscope_native.abi3.so "$CARRY/" || exit 1
  "$PY" - "$CARRY/vocab.gguf" <<'EOF' || exit 1
import sys
from pathlib import Path

from quantscope.core import catalog
from tests.hostile_files import vocab_only

vocab_only(Path(sys.argv[1]), catalog.model_path("smollm2"))
EOF
  du -sh "$CARRY"
  echo "run_gpu: carry $CARRY with the run; there: tests/run_gpu.sh"
  exit 0
fi

mkdir -p "$WORK" || exit 1
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if .venv/bin/python -c 'import quantscope.core.native' 2>/dev/null; then PY=.venv/bin/python; else PY=python3; fi
fi
if ! "$PY" -c 'import quantscope.core.native' 2>/dev/null; then
  # a bare machine: the carried wheels and CPU extension, and this checkout as the quantscope package
  [ -d "$CARRY/wheels" ] || { echo "run_gpu: quantscope does not import and there is no $CARRY" \
    "(make it with tests/run_gpu.sh --prepare where the registry is reachable, and carry it)" >&2; exit 1; }
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$WORK/site" \
    "$CARRY"/wheels/*.whl || exit 1
  [ -f core/native/_quantscope_native.abi3.so ] || cp "$CARRY/_quantscope_native.abi3.so" core/native/ || exit 1
  mkdir -p "$WORK/path" && ln -sfn "$PWD" "$WORK/path/quantscope" || exit 1
  export PYTHONPATH="$WORK/path:$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
  "$PY" -c 'import quantscope.core.native' || exit 1
fi

export QSC_ARCHS=${QSC_ARCHS:-90} QSC_JOBS=${QSC_JOBS:-8}
csrc/cuda/build.sh --if-changed || exit 1
"$PY" -c 'from quantscope.core.engine import cuda_library as cl; print("cuda:", cl.cuda_status()); print(cl.build_info())'

have_models=1
"$PY" -c 'import sys; from quantscope.core import catalog; sys.exit(all(map(catalog.is_present, catalog.MODELS)) ^ 1)' \
  || { have_models=0; export QUANTSCOPE_CATALOGUE_UNAVAILABLE=1; echo "run_gpu: catalogue models absent here" >&2; }
if [ -z "${QUANTSCOPE_VOCAB_SOURCE:-}" ]; then
  if [ -f "$CARRY/vocab.gguf" ]; then
    export QUANTSCOPE_VOCAB_SOURCE="$PWD/$CARRY/vocab.gguf"
  elif ! "$PY" -c 'import sys; from quantscope.core import catalog; sys.exit(not catalog.is_present("smollm2"))'; then
    "$PY" -c 'import sys; from tests.arch_fixtures import write_fixture; write_fixture("llama", sys.argv[1])' \
      "$WORK/vocab.gguf" || exit 1
    export QUANTSCOPE_VOCAB_SOURCE="$WORK/vocab.gguf"
  fi
fi
echo "run_gpu: vocabulary ${QUANTSCOPE_VOCAB_SOURCE:-SmolLM2 (catalogue)}; test files under $WORK"

rm -f "$WORK/junit.xml"
timeout "${QUANTSCOPE_GPU_TEST_TIMEOUT:-300}" "$PY" -m pytest -q -p no:cacheprovider -rs --basetemp "$WORK/tmp" \
  --junitxml "$WORK/junit.xml" tests/test_cuda*.py "$@"
rc=$?
[ "$rc" = 124 ] && echo "run_gpu: pytest stopped after ${QUANTSCOPE_GPU_TEST_TIMEOUT:-300} s" >&2
if [ "$have_models" = 1 ] && [ "$rc" = 0 ]; then "$PY" tests/bench/bench_cuda.py || rc=1; fi
"$PY" tests/gpu_summary.py "$WORK/junit.xml" "$(( $(date +%s) - t0 ))" "$rc" | tee "$WORK/summary.txt"
if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then cp "$WORK/summary.txt" "$WORK/junit.xml" "$OUT/" 2>/dev/null; fi
exit $rc
