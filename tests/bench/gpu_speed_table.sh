#!/usr/bin/env bash
# The speed table of the device check (issue 48): ours against llama.cpp's CUDA llama-bench on the same card, decode
# at depths 0/4K/16K/32K and prefill of 512 and 4096 tokens, dense 1B and 8B and a MoE, with ratios and the decode's
# share of the HBM peak (tests/bench/bench_gpu_vs_llama.py; it prints the table). Meant to be called by
# tests/run_gpu.sh at its end (with its PYTHONPATH and QUANTSCOPE_VOCAB_SOURCE exported):
#   tests/bench/gpu_speed_table.sh --prepare   here: build/llama-src = the trimmed llama.cpp source to carry (22 MB)
#   tests/bench/gpu_speed_table.sh [PYTHON]    there: build llama-bench for this GPU (reused while its folder
#                                              survives), write the synthetic models, print the table
# Environment: QUANTSCOPE_SPEED_MODELS (default 1b,8b,moe), QUANTSCOPE_SPEED_DEPTHS (default 0,4096,16384,32768),
# QUANTSCOPE_SPEED_PROMPTS (default 512,4096), QUANTSCOPE_SPEED_GEN (default 128), QUANTSCOPE_SPEED_TIMEOUT (seconds
# for the whole table, default 420), QUANTSCOPE_SPEED_TABLE=0 skips it. $OUT, when set, gets speed.txt and
# speed.json. Never fails the device check: a missing tool, source or GPU prints one line saying so (status 0);
# a table that ran out of time says that.
set -uo pipefail
cd "$(dirname "$0")/../.."
SRC=build/llama-src

if [ "${1:-}" = "--prepare" ]; then
  PY=${PYTHON:-.venv/bin/python}
  "$PY" tests/bench/bench_gpu_vs_llama.py --prepare-source "$SRC" || exit 1
  du -sh "$SRC"
  echo "gpu_speed_table: carry $SRC with the run"
  exit 0
fi

PY=${1:-${PYTHON:-python3}}
[ "${QUANTSCOPE_SPEED_TABLE:-1}" = 0 ] && { echo "speed table: skipped (QUANTSCOPE_SPEED_TABLE=0)"; exit 0; }
if [ ! -f "$SRC/CMakeLists.txt" ]; then
  cache=$("$PY" -c 'import sys; sys.path.insert(0, "tests/bench"); import llamacpp_build as b; print(b.cache_root() / "src")')
  if [ -f "$cache/CMakeLists.txt" ]; then SRC=$cache
  else echo "speed table: not run: no llama.cpp source (make build/llama-src with $0 --prepare and carry it)"; exit 0; fi
fi
for tool in cmake nvcc; do
  command -v "$tool" >/dev/null || { echo "speed table: not run: $tool is not installed"; exit 0; }
done

work=${QUANTSCOPE_GPU_WORK:-/tmp/quantscope-gpu}
mkdir -p "$work"
timeout "${QUANTSCOPE_SPEED_TIMEOUT:-420}" "$PY" tests/bench/bench_gpu_vs_llama.py --llama-src "$SRC" \
  --models "${QUANTSCOPE_SPEED_MODELS:-1b,8b,moe}" -d "${QUANTSCOPE_SPEED_DEPTHS:-0,4096,16384,32768}" \
  -p "${QUANTSCOPE_SPEED_PROMPTS:-512,4096}" -n "${QUANTSCOPE_SPEED_GEN:-128}" --reps 1 \
  --json "$work/speed.json" 2> >(tee "$work/speed.log" >&2) | tee "$work/speed.txt"
rc=${PIPESTATUS[0]}
[ "$rc" = 124 ] && echo "speed table: stopped after ${QUANTSCOPE_SPEED_TIMEOUT:-420} s (the rows above are what finished)"
[ "$rc" != 0 ] && [ "$rc" != 124 ] && echo "speed table: bench_gpu_vs_llama.py exited with status $rc (see above)"
if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then cp "$work"/speed.txt "$work"/speed.json "$work"/speed.log "$OUT/" 2>/dev/null; fi
exit 0
