#!/usr/bin/env bash
# The one device check: build the CUDA backend for sm_90, write the test files it needs, run compute-sanitizer's
# memcheck over the single-kernel entry points and a one-layer model (when the machine has compute-sanitizer), then
# each tests/test_cuda*.py in its own pytest process (a device fault poisons the CUDA context of its process only),
# rerun a file that failed once with QUANTSCOPE_CUDA_DEBUG=1 (every launch checked: the fault names its kernel),
# print one summary table, then the quick speed table in the time left (tests/bench/gpu_speed_table.sh --quick: the
# dense 1B's decode at depth 0 and 4096 and its pp512, ours and - when a prebuilt llama-bench is carried -
# llama.cpp's, with ratios and % of HBM peak; its model is written while the tests run). Self-contained for a device
# machine that reaches nothing and receives at most 64 MiB:
# what its image lacks travels in build/gpu-carry (a few MiB), made beforehand where the registry is reachable.
#
#   tests/run_gpu.sh --prepare    here: build/gpu-carry/ = wheels of cffi, pycparser and gguf for Python 3.12, the
#                                 CPU extension rebuilt here from the current sources (abi3: cffi's limited API),
#                                 SmolLM2's vocabulary (vocabulary only)
#   tests/run_gpu.sh --rehearse   here, before EVERY device call: the device run on a bare Python 3.12 (a venv with
#                                 only numpy, pytest, hypothesis, jinja2, regex, requests, pyyaml, as on the device
#                                 machines) in a copy of what a device run receives (tracked + untracked files that
#                                 git does not ignore, and build/gpu-carry); ends "host checks only" when all is
#                                 well (no GPU here), "NOT ok" when something would fail on the card too
#   tests/run_gpu.sh [PYTEST ARGS]  there (carry build/gpu-carry); also runs here, where the GPU tests skip
#   tests/run_gpu.sh --speed-full   there, a second call: no tests, the whole speed table (gpu_speed_table.sh: tg at
#                                 0/4K/16K/32K, pp512/pp4096, 1B, 8B and the MoE; llama-bench built on the device
#                                 unless carried: ~5 min of its ~9)
# So a session does:  tests/run_gpu.sh --prepare && tests/run_gpu.sh --rehearse   then the device call:
#   run(command="tests/run_gpu.sh", carry=["build/gpu-carry"], timeout_s=420)
# and, with time left, run(command="tests/run_gpu.sh --speed-full", carry=["build/gpu-carry", "build/llama-src"],
# timeout_s=600).
#
# Time budget on an H100 (limit 6 minutes; the script stops starting work at DEADLINE_S = 345 s): the build for sm_90
# ~45 s, the memcheck pass <= 60 s (capped: MEMCHECK_S), the test files ~150-200 s (each capped at FILE_S and at
# what is left before SPEED_S), a debug rerun of a failed file <= 60 s (-x: up to its first failure), then the quick
# speed table in what is left, at least SPEED_S = 60 s (our three rows ~15 s, llama-bench's ~15 s, the 1B model
# written in the background during the tests: ~5 s on 2 cores here). None of it measured on a card yet: the
# summary prints each phase's seconds.
# Catalogue models absent (a device machine has none): QUANTSCOPE_CATALOGUE_UNAVAILABLE=1, their tests are reported
# as skipped, and the whole-model tests use synthetic models written from the vocabulary (core/synthetic.py). With
# no vocabulary carried either, an architecture fixture's (tests/arch_fixtures.py) is written and used.
# Environment: PYTHON, QSC_ARCHS (default 90), QSC_JOBS (default 8), QUANTSCOPE_GPU_WORK (default
# /tmp/quantscope-gpu), QUANTSCOPE_GPU_DEADLINE (seconds; 345, --rehearse 1500), REHEARSE_PYTHON (--rehearse's interpreter: default python3.12 on PATH or pyenv's).
# $OUT, when set, gets the summary and the JUnit reports.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
CARRY=build/gpu-carry
WORK=${QUANTSCOPE_GPU_WORK:-/tmp/quantscope-gpu}
DEADLINE_S=${QUANTSCOPE_GPU_DEADLINE:-345} MEMCHECK_S=60 FILE_S=150 RERUN_S=60 SPEED_S=60
MODE=tests
[ "${1:-}" = "--speed-full" ] && { MODE="speed-full"; shift; }
t0=$(date +%s)
left() { echo $(( DEADLINE_S - ($(date +%s) - t0) )); }

if [ "${1:-}" = "--prepare" ]; then
  PY=${PYTHON:-.venv/bin/python}
  [ -x "$PY" ] || ./dev setup || exit 1
  rm -rf "$CARRY" && mkdir -p "$CARRY/wheels" || exit 1
  pins=$("$PY" -c 'import cffi, pycparser; print(f"cffi=={cffi.__version__} pycparser=={pycparser.__version__}")')
  # shellcheck disable=SC2086
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$CARRY/wheels" $pins gguf==0.19.0 || exit 1
  # a prebuilt CUDA llama-bench for the quick speed table, when one was built here (gpu_speed_table.sh --prepare-bench)
  tests/bench/gpu_speed_table.sh --carry-bench "$CARRY" || exit 1
  # the CPU extension from the current sources: cffi builds it on the limited API, so this build loads on 3.12 too
  so=$("$PY" csrc/build_ffi.py | tail -n 1) || exit 1
  grep -q qs_block_plan "$so" || { echo "run_gpu: $so lacks qs_block_plan (stale build?)" >&2; exit 1; }
  cp "$so" "$CARRY/_quantscope_native.abi3.so" || exit 1
  "$PY" - "$CARRY/vocab.gguf" <<'EOF' || exit 1
import sys
from pathlib import Path

from quantscope.core import catalog
from tests.hostile_files import vocab_only

vocab_only(Path(sys.argv[1]), catalog.model_path("smollm2"))
EOF
  du -sh "$CARRY"
  echo "run_gpu: carry $CARRY with the run; here first: tests/run_gpu.sh --rehearse; there: tests/run_gpu.sh"
  exit 0
fi

if [ "${1:-}" = "--rehearse" ]; then
  shift
  [ -d "$CARRY/wheels" ] || { echo "run_gpu: no $CARRY: run tests/run_gpu.sh --prepare first" >&2; exit 1; }
  RP=
  for c in ${REHEARSE_PYTHON:-} python3.12 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12; do
    "$c" -c 'import sys, venv; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null && { RP=$c; break; }
  done
  if [ -z "$RP" ]; then
    RP=python3.11
    echo "run_gpu: no Python 3.12 here: rehearsing with $RP (the device machines have 3.12)" >&2
  fi
  R=${QUANTSCOPE_REHEARSE:-/tmp/quantscope-rehearse}
  want="numpy pytest hypothesis jinja2 regex requests pyyaml"
  if [ ! -x "$R/venv/bin/python" ] || [ "$(cat "$R/venv/.made-from" 2>/dev/null)" != "$RP $want" ]; then
    # shellcheck disable=SC2086
    rm -rf "$R/venv" && "$RP" -m venv "$R/venv" && "$R/venv/bin/python" -m pip install -q $want || exit 1
    echo "$RP $want" > "$R/venv/.made-from"
  fi
  # what a device run receives: tracked and untracked-not-ignored files, and the carry
  # (the previous rehearsal's CUDA build is kept: build.sh --if-changed rebuilds it when a source changed)
  rm -rf "$R/cuda-build" && { [ ! -d "$R/tree/build/cuda" ] || mv "$R/tree/build/cuda" "$R/cuda-build"; }
  rm -rf "$R/tree" && mkdir -p "$R/tree/build" || exit 1
  [ ! -d "$R/cuda-build" ] || mv "$R/cuda-build" "$R/tree/build/cuda"
  git ls-files -z -co --exclude-standard | tar -c --null --ignore-failed-read -T - 2>/dev/null \
    | tar -x -C "$R/tree" || exit 1
  cp -r "$CARRY" "$R/tree/$CARRY" || exit 1
  echo "run_gpu: rehearsal with $("$R/venv/bin/python" --version) (bare venv: $want) in $R/tree"
  # this machine is slower than a device machine (a 2-core build): its own deadline; the verdict is what counts
  cd "$R/tree" && env -u PYTHONPATH -u VIRTUAL_ENV PYTHON="$R/venv/bin/python" QUANTSCOPE_GPU_WORK="$R/work" \
    QUANTSCOPE_GPU_DEADLINE="${QUANTSCOPE_GPU_DEADLINE:-1500}" tests/run_gpu.sh "$@"
  exit $?
fi

rm -rf "$WORK/reports" "$WORK/tmp" && mkdir -p "$WORK/reports" "$WORK/tmp" || exit 1
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
  cp -f "$CARRY/_quantscope_native.abi3.so" core/native/ || exit 1 # the carried build: current sources
  mkdir -p "$WORK/path" && ln -sfn "$PWD" "$WORK/path/quantscope" || exit 1
  export PYTHONPATH="$WORK/path:$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
  "$PY" -c 'import quantscope.core.native' || exit 1
fi

export QSC_ARCHS=${QSC_ARCHS:-90} QSC_JOBS=${QSC_JOBS:-8}
csrc/cuda/build.sh --if-changed || exit 1
echo "run_gpu: built in $(( $(date +%s) - t0 )) s"
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
gpu_ok=0
"$PY" -c 'import sys; from quantscope.core.engine import cuda_library as cl; sys.exit(not cl.cuda_status()[0])' && gpu_ok=1
export PYTHONPATH PYTHON="$PY" QUANTSCOPE_GPU_WORK="$WORK"
if [ "$MODE" = speed-full ]; then # the second call: the whole table, no tests
  [ "$gpu_ok" = 1 ] || { echo "speed table: not run (no usable GPU)"; exit 0; }
  QUANTSCOPE_SPEED_TIMEOUT=${QUANTSCOPE_SPEED_TIMEOUT:-540} tests/bench/gpu_speed_table.sh "$PY"
  exit $?
fi
speed=0 # the quick table's model (dense 1B, Q4_K_M), written now on the CPU while the GPU runs the tests
if [ "$gpu_ok" = 1 ] && [ "${QUANTSCOPE_SPEED_TABLE:-1}" != 0 ]; then
  speed=1
  nice -n 5 "$PY" -c 'import sys; from quantscope.core import synthetic
synthetic.ensure_synthetic("1b", vocab_source=sys.argv[1] or None)' "${QUANTSCOPE_VOCAB_SOURCE:-}" \
    > "$WORK/speed-model.log" 2>&1 &
fi
TESTS_S=$(( DEADLINE_S - SPEED_S * speed )) # the tests stop starting work here; the table has the rest
tleft() { echo $(( TESTS_S - ($(date +%s) - t0) )); }
tcap() { local l; l=$(tleft); [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }

pytest_in() { # REPORT-NAME SECONDS [PYTEST ARGS]: one pytest process, its JUnit report in $WORK/reports
  local name=$1 secs=$2
  shift 2
  timeout "$secs" "$PY" -m pytest -q -p no:cacheprovider -rs --basetemp "$WORK/tmp/$name" \
    --junitxml "$WORK/reports/$name.xml" "$@"
}

# 1. compute-sanitizer's memcheck over the single-kernel entry points and a one-layer model, before anything else
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -n 1)
if [ -z "$SAN" ]; then
  echo "not available (no compute-sanitizer on this machine)" > "$WORK/reports/memcheck.txt"
elif [ "$gpu_ok" = 0 ]; then
  echo "not run (no usable GPU)" > "$WORK/reports/memcheck.txt"
else
  s0=$(date +%s)
  timeout "$(tcap $MEMCHECK_S)" "$SAN" --tool memcheck --error-exitcode 99 --print-limit 20 \
    "$PY" -m pytest -q -x -p no:cacheprovider --basetemp "$WORK/tmp/memcheck" \
    tests/test_cuda.py -k "one_layer_model or gpu_activation_quantizers or gpu_matmat_matches_cpu or gpu_get_rows \
      or gpu_rmsnorm or gpu_rope or gpu_gated_activations or gpu_attention_gqa" \
    > "$WORK/memcheck.log" 2>&1
  src=$?
  first=$(grep -m 1 -E "Invalid|Program hit|Malloc|Leaked|error" "$WORK/memcheck.log" | cut -c1-160)
  where=$(grep -m 1 -E "^=+ +at .*k_[a-z0-9_]+" "$WORK/memcheck.log" | sed 's/^=* *//' | cut -c1-120)
  summ=$(grep -m 1 "ERROR SUMMARY" "$WORK/memcheck.log" | sed 's/^=* *//')
  case $src in
    0) echo "${summ:-0 errors} (single kernels and a one-layer model; $(( $(date +%s) - s0 )) s)" ;;
    124) echo "stopped after $MEMCHECK_S s, ${summ:-no errors reported so far} (partial)" ;;
    *) echo "FAILED (exit $src): ${summ:-?}; first: ${first:-?}${where:+ at $where} ($WORK/memcheck.log)" ;;
  esac > "$WORK/reports/memcheck.txt"
  cat "$WORK/reports/memcheck.txt"
fi

# 2. each test file in its own process; a file that failed is rerun once in the debug mode, up to its first failure
rc=0
for f in tests/test_cuda*.py; do
  name=$(basename "$f" .py)
  if [ "$(tleft)" -lt 10 ]; then echo "run_gpu: no time left for $f" >&2; rc=1; continue; fi
  echo "run_gpu: $f ($(tleft) s left)"
  # (-m "not slow": test_library_builds_static_runtime would build the library a second time; the host runs it)
  pytest_in "$name" "$(tcap $FILE_S)" -m "not slow" "$f" "$@"
  frc=$?
  [ "$frc" = 124 ] && echo "run_gpu: $f stopped at its time limit" >&2
  if [ "$frc" != 0 ] && [ "$frc" != 5 ]; then # 5: nothing collected (a -k elsewhere)
    rc=1
    if [ "$gpu_ok" = 1 ] && [ "$(tleft)" -ge 20 ]; then
      echo "run_gpu: $f failed: rerun with QUANTSCOPE_CUDA_DEBUG=1"
      QUANTSCOPE_CUDA_DEBUG=1 pytest_in "$name.debug" "$(tcap $RERUN_S)" -x -m "not slow" "$f" "$@" \
        > "$WORK/$name.debug.log" 2>&1
      tail -n 3 "$WORK/$name.debug.log"
    fi
  fi
done
if [ "$have_models" = 1 ] && [ "$rc" = 0 ] && [ "$(tleft)" -ge 30 ]; then
  timeout "$(tcap 120)" "$PY" tests/bench/bench_cuda.py || rc=1
fi
"$PY" tests/gpu_summary.py "$WORK/reports" "$(( $(date +%s) - t0 ))" "$rc" | tee "$WORK/summary.txt"
# 3. the quick speed table in the time left (never fails the check; a table cut short says so)
if [ "$speed" = 1 ]; then
  wait # the 1B model
  if [ "$(left)" -lt 20 ]; then
    echo "speed table: no time left ($(left) s); tests/run_gpu.sh --speed-full as a second call" | tee -a "$WORK/summary.txt"
  else
    echo "run_gpu: quick speed table ($(left) s left)"
    QUANTSCOPE_SPEED_TIMEOUT=$(left) tests/bench/gpu_speed_table.sh --quick "$PY" | tee -a "$WORK/summary.txt"
  fi
elif [ "$gpu_ok" = 0 ]; then
  echo "speed table: not run (no usable GPU)" | tee -a "$WORK/summary.txt"
fi
echo "run_gpu: done in $(( $(date +%s) - t0 )) s" | tee -a "$WORK/summary.txt"
if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then
  cp "$WORK/summary.txt" "$OUT/" 2>/dev/null
  cp -r "$WORK/reports" "$OUT/" 2>/dev/null
  cp "$WORK"/memcheck.log "$WORK"/*.debug.log "$OUT/" 2>/dev/null
fi
exit $rc
