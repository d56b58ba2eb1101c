#!/usr/bin/env bash
# Build the kernels with AddressSanitizer + UndefinedBehaviorSanitizer and run the kernel tests against that build,
# with the engine's mismatched-metadata corpus (tests/test_hostile_model.py) and the engine tests that run
# qs_block_forward on the real models, and the tokenizer tests (the native piece table and BPE).
#   tests/run_sanitized.sh [PYTEST ARGS]
set -euo pipefail
cd "$(dirname "$0")/.."
so=$(flock /tmp/quantscope-build.lock .venv/bin/python csrc/build_ffi.py --sanitize | tail -n 1)
libasan=$(gcc -print-file-name=libasan.so)
libubsan=$(gcc -print-file-name=libubsan.so)
export QUANTSCOPE_NATIVE_SO="$so"
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:detect_odr_violation=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
LD_PRELOAD="$libasan $libubsan" .venv/bin/python -m pytest -q -p no:cacheprovider \
  tests/test_native_kernels.py tests/test_native_iquants.py tests/test_native_nn.py tests/test_native_scan.py \
  tests/test_gguf_corrupt.py \
  tests/test_tokenizer_native.py tests/test_vocab_suite.py \
  tests/test_hostile_model.py tests/test_quantize_native.py tests/test_imatrix.py \
  "tests/test_engine.py::test_native_forward_matches_numpy_reference" \
  "tests/test_engine.py::test_prefill_equals_token_by_token_decode" \
  "tests/test_engine.py::test_context_full_is_reported" tests/test_server_batch.py "$@"
