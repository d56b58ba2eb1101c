#!/usr/bin/env bash
# The speed table of the device check (issue 48): ours against llama.cpp's CUDA llama-bench on the same card, decode
# at depths 0/4K/16K/32K and prefill of 512 and 4096 tokens, dense 1B and 8B and a MoE, with ratios and the decode's
# share of the HBM peak (tests/bench/bench_gpu_vs_llama.py; it prints the table). Meant to be called by
# tests/run_gpu.sh at its end (with its PYTHONPATH and QUANTSCOPE_VOCAB_SOURCE exported):
#   tests/bench/gpu_speed_table.sh --prepare   here: build/llama-src = the trimmed llama.cpp source to carry (22 MB)
#   tests/bench/gpu_speed_table.sh --prepare-bench   here, with nvcc (no GPU needed; ~1 h on 2 cores): llama-bench
#                                              built for sm_90 from build/llama-src (GGML_NATIVE=OFF, GGML_CUDA_NO_VMM=ON:
#                                              no libcuda to link against here; cuBLAS from the toolkit or from
#                                              QUANTSCOPE_CUBLAS_DIR, a pip nvidia-cublas tree) into LLAMA_CARRY_BUILD
#   tests/bench/gpu_speed_table.sh --carry-bench DIR   (tests/run_gpu.sh --prepare) DIR/llama-bench.xz = that
#                                              llama-bench (or QUANTSCOPE_LLAMA_BENCH), stripped; nothing when none
#   tests/bench/gpu_speed_table.sh [PYTHON]    there: build llama-bench for this GPU (reused while its folder
#                                              survives; the carried one when there is one), write the synthetic
#                                              models, print the table
#   tests/bench/gpu_speed_table.sh --quick [PYTHON]   there (tests/run_gpu.sh, after the tests): the dense 1B's tg128
#                                              at depth 0 and 4096 and pp512; llama.cpp's rows only with a carried
#                                              llama-bench (building one takes ~5 min), ours alone otherwise
# Environment: QUANTSCOPE_SPEED_MODELS (default 1b,8b,moe), QUANTSCOPE_SPEED_DEPTHS (default 0,4096,16384,32768),
# QUANTSCOPE_SPEED_PROMPTS (default 512,4096), QUANTSCOPE_SPEED_GEN (default 128), QUANTSCOPE_SPEED_TIMEOUT (seconds
# for the whole table, default 420), QUANTSCOPE_SPEED_TABLE=0 skips it. $OUT, when set, gets speed.txt and
# speed.json. Never fails the device check: a missing tool, source or GPU prints one line saying so (status 0);
# a table that ran out of time says that.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
SRC=build/llama-src
CARRY=build/gpu-carry
LLAMA_CARRY_BUILD=${LLAMA_CARRY_BUILD:-$HOME/.cache/quantscope/llama-bench-carry-sm90}

if [ "${1:-}" = "--prepare-bench" ]; then
  [ -f "$SRC/CMakeLists.txt" ] || "$0" --prepare || exit 1
  opts=(-DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DGGML_CUDA_NO_VMM=ON -DCMAKE_CUDA_ARCHITECTURES=90
        -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_TOOLS=ON)
  if [ -n "${QUANTSCOPE_CUBLAS_DIR:-}" ]; then
    C=$QUANTSCOPE_CUBLAS_DIR
    opts+=("-DCUDA_cublas_LIBRARY=$C/lib/libcublas.so" "-DCUDA_cublasLt_LIBRARY=$C/lib/libcublasLt.so"
           "-DCMAKE_CUDA_FLAGS=-I$C/include" "-DCMAKE_CXX_FLAGS=-I$C/include")
  fi
  cmake -S "$SRC" -B "$LLAMA_CARRY_BUILD" "${opts[@]}" >/dev/null || exit 1
  nice -n 10 cmake --build "$LLAMA_CARRY_BUILD" -j "${QSC_JOBS:-2}" --target llama-bench >/dev/null || exit 1
  ls -l "$LLAMA_CARRY_BUILD/bin/llama-bench"
  exit 0
fi

if [ "${1:-}" = "--carry-bench" ]; then
  dest=${2:?--carry-bench DIR}
  exe=${QUANTSCOPE_LLAMA_BENCH:-$LLAMA_CARRY_BUILD/bin/llama-bench}
  rm -f "$dest/llama-bench.xz"
  if [ ! -x "$exe" ]; then
    echo "gpu_speed_table: no prebuilt llama-bench ($exe): the quick table will have our rows only" \
      "(make one with $0 --prepare-bench, ~1 h here)"
    exit 0
  fi
  tmp=$(mktemp) && strip -o "$tmp" "$exe" && xz -9 -T 2 -c "$tmp" > "$dest/llama-bench.xz" && rm -f "$tmp" || exit 1
  echo "gpu_speed_table: carrying $(du -h "$dest/llama-bench.xz" | cut -f1) llama-bench.xz (from $exe)"
  exit 0
fi

QUICK=0
[ "${1:-}" = "--quick" ] && { QUICK=1; shift; }

if [ "${1:-}" = "--prepare" ]; then
  PY=${PYTHON:-.venv/bin/python}
  "$PY" tests/bench/bench_gpu_vs_llama.py --prepare-source "$SRC" || exit 1
  du -sh "$SRC"
  echo "gpu_speed_table: carry $SRC with the run"
  exit 0
fi

PY=${1:-${PYTHON:-python3}}
[ "${QUANTSCOPE_SPEED_TABLE:-1}" = 0 ] && { echo "speed table: skipped (QUANTSCOPE_SPEED_TABLE=0)"; exit 0; }
work=${QUANTSCOPE_GPU_WORK:-/tmp/quantscope-gpu}
mkdir -p "$work"
bench=()
if [ -f "$CARRY/llama-bench.xz" ]; then # the carried build (stdlib lzma: no xz tool needed there)
  "$PY" -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
    "$CARRY/llama-bench.xz" "$work/llama-bench" && chmod +x "$work/llama-bench" && bench=(--llama-bench "$work/llama-bench")
fi
if [ "$QUICK" = 1 ]; then
  if [ ${#bench[@]} = 0 ]; then
    bench=(--llama-bench none)
    echo "speed table: llama.cpp's rows are not in this call (no prebuilt llama-bench carried): tests/run_gpu.sh --speed-full"
  fi
  timeout "${QUANTSCOPE_SPEED_TIMEOUT:-60}" "$PY" tests/bench/bench_gpu_vs_llama.py "${bench[@]}" --models 1b \
    -d 0,4096 -p 512 -n 128 --reps 1 --timeout 60 --json "$work/speed.json" 2> "$work/speed.log" | tee "$work/speed.txt"
  rc=${PIPESTATUS[0]}
  [ "$rc" = 124 ] && echo "speed table: stopped after ${QUANTSCOPE_SPEED_TIMEOUT:-60} s (the rows above are what finished)"
  [ "$rc" != 0 ] && [ "$rc" != 124 ] && echo "speed table: exited with status $rc: $(tail -n 1 "$work/speed.log")"
  if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then cp "$work"/speed.txt "$work"/speed.json "$work"/speed.log "$OUT/" 2>/dev/null; fi
  exit 0
fi
if [ ${#bench[@]} = 0 ] && [ ! -f "$SRC/CMakeLists.txt" ]; then
  cache=$("$PY" -c 'import sys; sys.path.insert(0, "tests/bench"); import llamacpp_build as b; print(b.cache_root() / "src")')
  if [ -f "$cache/CMakeLists.txt" ]; then SRC=$cache
  else echo "speed table: not run: no llama.cpp source (make build/llama-src with $0 --prepare and carry it)"; exit 0; fi
fi
if [ ${#bench[@]} = 0 ]; then
  for tool in cmake nvcc; do
    command -v "$tool" >/dev/null || { echo "speed table: not run: $tool is not installed"; exit 0; }
  done
fi
timeout "${QUANTSCOPE_SPEED_TIMEOUT:-420}" "$PY" tests/bench/bench_gpu_vs_llama.py --llama-src "$SRC" "${bench[@]}" \
  --models "${QUANTSCOPE_SPEED_MODELS:-1b,8b,moe}" -d "${QUANTSCOPE_SPEED_DEPTHS:-0,4096,16384,32768}" \
  -p "${QUANTSCOPE_SPEED_PROMPTS:-512,4096}" -n "${QUANTSCOPE_SPEED_GEN:-128}" --reps 1 \
  --json "$work/speed.json" 2> >(tee "$work/speed.log" >&2) | tee "$work/speed.txt"
rc=${PIPESTATUS[0]}
[ "$rc" = 124 ] && echo "speed table: stopped after ${QUANTSCOPE_SPEED_TIMEOUT:-420} s (the rows above are what finished)"
[ "$rc" != 0 ] && [ "$rc" != 124 ] && echo "speed table: bench_gpu_vs_llama.py exited with status $rc (see above)"
if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then cp "$work"/speed.txt "$work"/speed.json "$work"/speed.log "$OUT/" 2>/dev/null; fi
exit 0
