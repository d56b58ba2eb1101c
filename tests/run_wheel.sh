#!/usr/bin/env bash
# The Linux x86-64 wheel, built and tested the way a user installs it (issue 46):
#   1. `python -m build --sdist`, then `pip wheel` of that sdist (the cffi extension compiled here, once): the
#      sdist must hold everything the build needs (MANIFEST.in);
#   2. auditwheel repairs it into a manylinux wheel (the platform tag it proves: the glibc symbols it needs);
#   3. a clean venv installs it from that file, its dependencies as binary wheels only;
#   4. tests/wheel_smoke.py runs from the installed wheel with nothing but that venv on PATH (no compiler: it
#      checks), so the smoke test and the kernel tests prove the wheel needs none.
# cibuildwheel (pyproject.toml [tool.cibuildwheel], .github/workflows/wheels.yml) does the same on every platform;
# it needs Docker for Linux, which this machine lacks, hence this script for the one wheel built here.
#   tests/run_wheel.sh [--out DIR] [--no-kernels]     default DIR: build/wheel (wheelhouse/, venv/, logs)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=build/wheel
KERNELS=--kernels
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT=$2; shift 2 ;;
    --no-kernels) KERNELS=; shift ;;
    *) echo "usage: tests/run_wheel.sh [--out DIR] [--no-kernels]" >&2; exit 2 ;;
  esac
done
HOSTPY=python3
[ -x .venv/bin/python ] && HOSTPY=.venv/bin/python
"$HOSTPY" -m auditwheel --version >/dev/null 2>&1 && "$HOSTPY" -c 'import build' 2>/dev/null || {
  echo "run_wheel: auditwheel or build is missing (pip install -e '.[test]'; ./dev setup installs them)" >&2; exit 1; }
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
rm -rf "$OUT/raw" "$OUT/wheelhouse" "$OUT/venv"
mkdir -p "$OUT/raw" "$OUT/wheelhouse"

echo "run_wheel: building the sdist, then the wheel from it (as pip does for a user without a wheel)" >&2
# a fresh copy of the tracked tree: the build never sees this checkout's in-place extension or build/ folders
SRC="$OUT/src"
rm -rf "$SRC" "$OUT/sdist" && mkdir -p "$SRC" "$OUT/sdist"
git ls-files -z --cached --others --exclude-standard | grep -zv '^tests/data/' | xargs -0 cp --parents -t "$SRC"
"$HOSTPY" -m build --sdist --outdir "$OUT/sdist" "$SRC" >"$OUT/build.log" 2>&1 || { cat "$OUT/build.log" >&2; exit 1; }
sdist=$(ls "$OUT"/sdist/quantscope-*.tar.gz)
"$HOSTPY" -m pip wheel --quiet --no-deps -w "$OUT/raw" "$sdist" >>"$OUT/build.log" 2>&1 || { cat "$OUT/build.log" >&2; exit 1; }
raw=$(ls "$OUT"/raw/quantscope-*.whl)

echo "run_wheel: auditwheel repair" >&2
PATH="$(dirname "$HOSTPY"):$PATH" "$HOSTPY" -m auditwheel repair --wheel-dir "$OUT/wheelhouse" "$raw" >"$OUT/auditwheel.log" 2>&1 || {
  cat "$OUT/auditwheel.log" >&2; exit 1; }
whl=$(ls "$OUT"/wheelhouse/quantscope-*.whl)
echo "run_wheel: $(basename "$whl")" >&2
"$HOSTPY" -m auditwheel show "$whl" | tr '\n' ' ' | sed 's/  */ /g' >&2; echo >&2

echo "run_wheel: installing into a clean venv (binary wheels only)" >&2
python3 -m venv "$OUT/venv" 2>/dev/null || "$HOSTPY" -m venv --without-pip "$OUT/venv"
VPY="$OUT/venv/bin/python"
[ -x "$OUT/venv/bin/pip" ] || "$VPY" -m ensurepip --quiet
"$VPY" -m pip install --quiet --only-binary=:all: "$whl" pytest hypothesis "gguf==0.19.0" >"$OUT/pip.log" 2>&1 || {
  cat "$OUT/pip.log" >&2; exit 1; }

echo "run_wheel: smoke test from the installed wheel, PATH=$OUT/venv/bin only" >&2
cd "$OUT"   # not the source tree: quantscope must come from the venv
env -i HOME="$HOME" PATH="$OUT/venv/bin" LANG=C.UTF-8 TMPDIR="${TMPDIR:-/tmp}" \
  XDG_CACHE_HOME="${XDG_CACHE_HOME:-$HOME/.cache}" \
  "$VPY" "$OLDPWD/tests/wheel_smoke.py" --no-compiler $KERNELS
