#!/usr/bin/env bash
# Windows CI (Git Bash): put LLVM's clang-cl on PATH for setup.py, which builds the native library with it, and
# make sure it is clang 19 or newer (setup.py's minimum: older clang-cl hides the AVX2/AVX-512 intrinsics from
# functions with target attributes), upgrading the runner's LLVM with Chocolatey when it is older.
set -euo pipefail
LLVM_BIN="/c/Program Files/LLVM/bin"
major() { "$LLVM_BIN/clang-cl.exe" --version 2>/dev/null | sed -n 's/.*clang version \([0-9][0-9]*\).*/\1/p' | head -1; }
v=$(major || true)
if [ "${v:-0}" -lt 19 ]; then
  echo "ensure_clang_cl: clang-cl ${v:-missing}; installing a current LLVM" >&2
  choco upgrade llvm -y --no-progress
  v=$(major)
fi
echo "ensure_clang_cl: clang-cl $v" >&2
echo "C:/Program Files/LLVM/bin" >> "${GITHUB_PATH:?run this in a GitHub Actions step}"
