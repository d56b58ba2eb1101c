#!/usr/bin/env bash
# The ARM64 lane (issue 45): the native library cross-built for aarch64 and its tests run under user-mode qemu, at
# each ARM64 ISA level, on an x86-64 Debian machine. No binfmt is needed: every aarch64 program runs as
# `qemu-aarch64 -L ROOT`, and ROOT/../bin/python3 is a shell wrapper doing that, so a test that starts
# `sys.executable` gets the same emulated interpreter (QEMU_CPU and QEMU_LD_PREFIX travel in the environment).
#   tests/run_arm64.sh root          build/arm64/root: Debian's arm64 CPython 3.11 (apt-get download + dpkg -x) and
#                                    pip's aarch64 wheels of the dependencies (the versions of .venv where it has
#                                    them); redone only when that list changes, downloads cached in build/arm64
#   tests/run_arm64.sh wheel         cross-build the aarch64 wheel into dist/: `pip wheel` run by the emulated
#                                    python, whose sysconfig names Debian's cross compiler aarch64-linux-gnu-gcc
#   tests/run_arm64.sh test [--cpus "max neoverse-n1 cortex-a72"] [--quick] [PYTEST ARGS]
#                                    install dist/'s aarch64 wheel (built first when missing or older than csrc/)
#                                    into build/arm64/site and run the lane's tests once per qemu CPU: cortex-a72 =
#                                    NEON, neoverse-n1 = + dotprod, max = + i8mm; a summary per CPU at the end
#                                    (counts, time, every failure with its first line); logs in build/arm64/logs.
#                                    --quick: the slim selection tests/test_arm64_lane.py runs in ./dev test.
#                                    PYTEST ARGS are added to the selection, or replace it when they name tests
#                                    (e.g. tests/test_native_kernels.py -x).
# ./dev cross aarch64 runs `root` and `wheel`; ./dev test-arm64 [ARGS] runs `test`. Needs gcc-aarch64-linux-gnu,
# qemu-user (./dev installs them when root) and the arm64 architecture in dpkg (added here when root). The catalogue
# models are the files the x86 side fetched (`quantscope models fetch`): data, the same on every architecture.
# Environment: ARM64_DIR (default build/arm64), ARM64_TIMEOUT (seconds per CPU's pytest run, default 3600).
set -uo pipefail
cd "$(dirname "$0")/.."
DIR=${ARM64_DIR:-build/arm64}
mkdir -p "$DIR" && DIR=$(cd "$DIR" && pwd) || exit 1
ROOT=$DIR/root
PYA=$DIR/bin/python3   # the emulated interpreter, as a wrapper an emulated process can also exec
HOSTPY=python3
[ -x .venv/bin/python ] && HOSTPY=.venv/bin/python

die() { echo "run_arm64: $*" >&2; exit 1; }

# Debian arm64 packages: the interpreter, its standard library's shared-library needs, the C++ runtime numpy links,
# and the headers the extension is compiled against (libpython3.11-dev). The dynamic loader comes with libc6.
DEBS=(libc6 libgcc-s1 libstdc++6 python3.11 python3.11-minimal libpython3.11-minimal libpython3.11-stdlib
      libpython3.11-dev libexpat1 zlib1g libffi8 libssl3 libbz2-1.0 liblzma5 libsqlite3-0 libncursesw6 libtinfo6
      libreadline8 libuuid1 libcrypt1 libnsl2 libtirpc3 libgssapi-krb5-2 libkrb5-3 libk5crypto3 libkrb5support0
      libcom-err2 libkeyutils1 libdb5.3 libgdbm6 libgdbm-compat4)
# What the lane imports: the project's non-GUI dependencies, the test tools, and the wheel build's requirements.
PIPS=(numpy cffi pycparser regex jinja2 markupsafe gguf pytest hypothesis pyyaml)
BUILD_PIPS=("setuptools>=77" wheel pip)
PLATFORMS=(--platform manylinux_2_36_aarch64 --platform manylinux_2_28_aarch64 --platform manylinux_2_17_aarch64
           --platform manylinux2014_aarch64 --platform linux_aarch64 --platform any)
WHEEL_TAGS=(--only-binary=:all: --python-version 3.11 --implementation cp --abi cp311 --abi abi3 --abi none
            "${PLATFORMS[@]}")

need_tools() {
  local t missing=()
  for t in qemu-aarch64 aarch64-linux-gnu-gcc dpkg apt-get; do command -v "$t" >/dev/null 2>&1 || missing+=("$t"); done
  [ ${#missing[@]} -eq 0 ] || die "missing ${missing[*]} (Debian: apt-get install qemu-user gcc-aarch64-linux-gnu)"
}

# The versions .venv has, so both lanes test the same libraries (unpinned where .venv lacks a package).
pins() {
  "$HOSTPY" - "$@" <<'EOF'
import sys
from importlib import metadata
for name in sys.argv[1:]:
    try:
        print(f"{name}=={metadata.version(name)}")
    except metadata.PackageNotFoundError:
        print(name)
EOF
}

make_root() {
  need_tools
  local want reqs
  reqs=$(pins "${PIPS[@]}") || die "cannot read the package versions from $HOSTPY"
  want=$(echo "v1 ${DEBS[*]} $reqs ${BUILD_PIPS[*]} ${PLATFORMS[*]}" | sha256sum | cut -c1-16)
  if [ -f "$ROOT/.stamp" ] && [ "$(cat "$ROOT/.stamp")" = "$want" ] && [ -x "$PYA" ]; then return 0; fi
  echo "run_arm64: building $ROOT (Debian arm64 python3.11 + aarch64 wheels)" >&2
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    [ "$(id -u)" = 0 ] || die "dpkg lacks the arm64 architecture: sudo dpkg --add-architecture arm64 && sudo apt-get update"
    dpkg --add-architecture arm64 && apt-get update -q >/dev/null || die "could not add the arm64 architecture"
  fi
  local debs=() p
  for p in "${DEBS[@]}"; do debs+=("$p:arm64"); done
  mkdir -p "$DIR/debs" "$DIR/wheels" || exit 1
  # apt-get download writes the current version's file; an unchanged one is already there (cached, offline)
  (cd "$DIR/debs" && apt-get download -q "${debs[@]}" >/dev/null 2>&1) \
    || (apt-get update -q >/dev/null 2>&1; cd "$DIR/debs" && apt-get download -q "${debs[@]}" >/dev/null) \
    || die "apt-get download of the arm64 packages failed"
  rm -rf "$ROOT.new" && mkdir -p "$ROOT.new" || exit 1
  for p in "${DEBS[@]}"; do   # the newest cached file of each package
    local deb
    deb=$(ls -t "$DIR/debs/${p}_"*_arm64.deb 2>/dev/null | head -n 1)
    [ -n "$deb" ] || die "no arm64 package file for $p in $DIR/debs"
    dpkg -x "$deb" "$ROOT.new" || die "dpkg -x $deb failed"
  done
  # the emulated python looks in /usr/local/lib/python3.11/dist-packages; through -L, a folder missing in ROOT
  # would be the host's (x86 packages): an empty one hides it
  mkdir -p "$ROOT.new/usr/local/lib/python3.11/dist-packages"
  local site=$ROOT.new/usr/lib/python3/dist-packages
  # shellcheck disable=SC2086
  "$HOSTPY" -m pip download -q "${WHEEL_TAGS[@]}" -d "$DIR/wheels" $reqs "${BUILD_PIPS[@]}" 2>&1 \
    | grep -v "^WARNING: Location" >&2
  # shellcheck disable=SC2086
  "$HOSTPY" -m pip install -q --no-index --find-links "$DIR/wheels" "${WHEEL_TAGS[@]}" --no-compile \
    --target "$site" $reqs "${BUILD_PIPS[@]}" 2>&1 | grep -v "^WARNING: Location" >&2
  [ "${PIPESTATUS[0]}" = 0 ] || die "installing the aarch64 wheels into $site failed"
  rm -rf "$ROOT" && mv "$ROOT.new" "$ROOT" || exit 1
  mkdir -p "$DIR/bin" || exit 1
  cat > "$PYA" <<EOF
#!/bin/sh
# Debian's arm64 CPython under qemu (made by tests/run_arm64.sh). QEMU_CPU picks the CPU; -0 makes sys.executable
# this wrapper, so the interpreter's own subprocesses run emulated too.
export QEMU_LD_PREFIX="$ROOT"
exec qemu-aarch64 -0 "\$0" "$ROOT/usr/bin/python3.11" "\$@"
EOF
  chmod +x "$PYA" || exit 1
  QEMU_CPU=cortex-a72 "$PYA" -c 'import platform, numpy, cffi, pytest, gguf; assert platform.machine() == "aarch64"' \
    || die "the aarch64 python in $ROOT does not start or lacks a dependency"
  echo "$want" > "$ROOT/.stamp"
}

# The newest aarch64 wheel in dist/, if any.
wheel_path() { ls -t dist/quantscope-*-linux_aarch64.whl dist/quantscope-*aarch64*.whl 2>/dev/null | head -n 1; }

build_wheel() {
  make_root || exit 1
  local t0=$SECONDS out whl so
  # fresh build folders: setuptools would skip the compile when its .so is newer than the .c files (headers are
  # not tracked); the x86 build's folders are others and stay as they are
  rm -rf build/lib.linux-aarch64-cpython-311 build/temp.linux-aarch64-cpython-311 build/bdist.linux-aarch64
  mkdir -p dist
  # setuptools' PEP 517 hook called in the emulated process (pip would start the hook as a subprocess of the
  # interpreter's own path, which an emulated process cannot exec). setuptools gives the compiler the include folder
  # sysconfig names, /usr/include/python3.11, which the x86 compiler reads on the host: ROOT's headers come first
  # (and ROOT/usr/include for the multiarch aarch64-linux-gnu/python3.11/pyconfig.h)
  out=$(QEMU_CPU=max QEMU_LD_PREFIX="$ROOT" CFLAGS="-I$ROOT/usr/include/python3.11 -I$ROOT/usr/include" \
        qemu-aarch64 "$ROOT/usr/bin/python3.11" \
        -c 'from setuptools import build_meta; print(build_meta.build_wheel("dist"))' 2>&1) \
    || { echo "$out" >&2; die "the aarch64 wheel build failed"; }
  grep -E ": warning:" <<< "$out" >&2   # the compiler's warnings (the build itself does not stop on them)
  whl=$(wheel_path)
  [ -n "$whl" ] || die "the build wrote no aarch64 wheel to dist/"
  so=$(unzip -Z1 "$whl" | grep '_quantscope_native.*\.so$') || die "$whl has no native library"
  unzip -p "$whl" "$so" > "$DIR/native.so" || exit 1
  file -b "$DIR/native.so" | grep -q "ARM aarch64" || die "$so in $whl is not an aarch64 ELF: $(file -b "$DIR/native.so")"
  echo "run_arm64: $whl ($so: $(file -b "$DIR/native.so" | cut -d, -f1-2)) in $((SECONDS - t0)) s" >&2
}

# The lane: every native kernel at every level against the scalar reference, the quantizers' bytes, the engine's
# fidelity on the architecture fixtures and on the catalogue models. GUI tests (Qt) and those that need a local
# llama.cpp build are not part of it; tests that only read llama.cpp's stored outputs (tests/data) are.
LANE=(tests/test_native_kernels.py tests/test_native_iquants.py tests/test_native_nn.py tests/test_native_scan.py
      tests/test_native_pool.py tests/test_repack.py tests/test_dequant.py tests/test_iquants.py
      tests/test_quantize_native.py tests/test_quantize_file.py tests/test_imatrix.py tests/test_arch_fidelity.py
      tests/test_qwen35.py tests/test_engine.py tests/test_hostile_model.py tests/test_hostile_change.py
      tests/test_tokenizer_native.py -k "not gui")
# The slim part ./dev test runs (tests/test_arm64_lane.py, about a minute per CPU): the kernels' own tests at every
# level, but not on the real tensors, the quantizers' bytes, one architecture fixture through the whole engine.
QUICK_K="test_detects_an_isa or test_isa_names or test_dequantize_bit_exact or test_simd_activation_quantizers"
QUICK_K+=" or test_vec_dot_matches_scheme or test_simd_matches_scalar or test_gemm_row_decoders or test_rmsnorm"
QUICK_K+=" or test_same_bytes_as_ggml or (test_logits_match_llama_cpp and llama-Q8_0 and file-layout)"
QUICK=(tests/test_native_kernels.py tests/test_native_nn.py tests/test_quantize_native.py tests/test_arch_fidelity.py
       -k "$QUICK_K")

run_tests() {
  local cpus="max neoverse-n1 cortex-a72" quick=0
  while [ $# -gt 0 ]; do
    case "$1" in
      --cpus) cpus=$2; shift 2 ;;
      --quick) quick=1; shift ;;
      *) break ;;
    esac
  done
  make_root || exit 1
  local whl
  whl=$(wheel_path)
  if [ -z "$whl" ] || [ -n "$(find csrc setup.py pyproject.toml -newer "$whl" -type f -print -quit)" ]; then
    build_wheel || exit 1
    whl=$(wheel_path)
  fi
  local stamp
  stamp="$whl $(stat -c %Y "$whl")"
  if [ "$(cat "$DIR/site/.wheel" 2>/dev/null)" != "$stamp" ]; then
    rm -rf "$DIR/site" && "$HOSTPY" -m pip install -q --no-deps --no-index "${WHEEL_TAGS[@]}" --no-compile \
      --target "$DIR/site" "$whl" 2>&1 | grep -v "^WARNING: Location" >&2
    [ -d "$DIR/site/quantscope" ] || die "installing $whl into $DIR/site failed"
    echo "$stamp" > "$DIR/site/.wheel"
  fi
  # the console script beside sys.executable, as pip would install it (tests start it from there)
  printf '#!/bin/sh\nexec "$(dirname "$0")/python3" -m quantscope.cli "$@"\n' > "$DIR/bin/quantscope"
  chmod +x "$DIR/bin/quantscope" || exit 1
  local sel=("${LANE[@]}")
  [ "$quick" = 1 ] && sel=("${QUICK[@]}")
  local a
  for a in "$@"; do case "$a" in tests/*|./tests/*) sel=(); break ;; esac; done   # test paths replace the selection
  sel+=("$@")
  mkdir -p "$DIR/logs" "$DIR/tmp" || exit 1   # (pytest makes --basetemp itself, but not its parent)
  # the installed wheel, not the checkout (whose core/native holds the x86 build), is the quantscope package
  export PYTHONPATH="$DIR/site" QUANTSCOPE_ARM64_LANE=1
  unset QUANTSCOPE_NATIVE_SO
  local cpu rc=0 r t0 t summary=()
  for cpu in $cpus; do
    local log=$DIR/logs/$cpu.log
    t0=$(date +%s)
    QEMU_CPU=$cpu "$PYA" -c '
import platform, sys
from quantscope.core.native import _quantscope_native as m, kernels as K, lib
assert platform.machine() == "aarch64", platform.machine()
assert m.__file__.startswith(sys.argv[1]), m.__file__
n = lib.qs_isa_detected()
name = K.ISA_NAMES[n] if n < len(K.ISA_NAMES) else "?"
print(f"run_arm64: {sys.argv[2]}: {platform.machine()}, ISA level {n} ({name}), {m.__file__}")
' "$DIR/site" "$cpu" >&2 || { rc=1; summary+=("$cpu: the library does not load"); continue; }
    COLUMNS=240 QEMU_CPU=$cpu timeout "${ARM64_TIMEOUT:-3600}" "$PYA" -m pytest -q -rfE -p no:cacheprovider -W ignore::pytest.PytestConfigWarning \
      --basetemp "$DIR/tmp/$cpu" "${sel[@]}" 2>&1 | tee "$log"
    r=${PIPESTATUS[0]}
    t=$(( $(date +%s) - t0 ))
    [ "$r" = 0 ] || rc=1
    [ "$r" = 124 ] && echo "run_arm64: $cpu: pytest stopped after ${ARM64_TIMEOUT:-3600} s" >> "$log"
    summary+=("$cpu: $(grep -E '^=*.*(passed|failed|error|skipped|deselected|no tests ran).* in [0-9.]+s' "$log" \
      | tail -n 1 | tr -d '=' | sed 's/^ *//;s/ *$//') (exit $r, ${t} s wall)")
  done
  echo "run_arm64: summary ($(basename "$whl"))"
  for s in "${summary[@]}"; do echo "  $s"; done
  for cpu in $cpus; do
    grep -E '^(FAILED|ERROR) ' "$DIR/logs/$cpu.log" 2>/dev/null | sed "s/^/  $cpu: /"
  done
  return $rc
}

case "${1:-}" in
  root) make_root ;;
  wheel) build_wheel ;;
  test) shift; run_tests "$@" ;;
  *) echo "usage: tests/run_arm64.sh root | wheel | test [--cpus LIST] [--quick] [PYTEST ARGS]" >&2; exit 2 ;;
esac
