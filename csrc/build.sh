#!/usr/bin/env bash
# Rebuild the native extension in place (serialised with a lock: helpers may build concurrently).
#   csrc/build.sh            optimised build into core/native/
#   csrc/build.sh --sanitize ASan+UBSan build into build/asan/ (see tests/run_sanitized.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
exec flock /tmp/quantscope-build.lock .venv/bin/python csrc/build_ffi.py "$@"
