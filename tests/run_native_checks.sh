#!/usr/bin/env bash
# Build checks of the native library (issue 46): compile every csrc/*.c and the C self-test
# (csrc/selftest/qs_selftest.c) with each toolchain at -Wall -Werror, and run the self-test where it runs here.
#
#   tests/run_native_checks.sh [LANE...] [--quick] [--keep] [--require]
#   LANE: native   gcc, x86-64 (or the host's CPU family), run directly
#         clang    clang, the same
#         aarch64  aarch64-linux-gnu-gcc -static, run under qemu-aarch64 -cpu cortex-a72, neoverse-n1 and max
#         aarch64-clang  clang --target=aarch64-linux-gnu, linked with the cross gcc, run under qemu max
#         windows  x86_64-w64-mingw32-gcc -static, run under wine64 (WINEPREFIX in build/native-checks/)
#         zig-aarch64    zig's clang (PyPI ziglang; a clang new enough to build the dotprod and i8mm levels,
#                  which Debian's clang 14 builds empty), aarch64-linux-musl -static, run under qemu at the 3 CPUs
#         macos    zig's clang for aarch64-macos and x86_64-macos: built and linked (Mach-O), not run (no macOS)
#         windows-arm64  zig's clang for aarch64-windows-gnu: built and linked (PE32+ ARM64), not run
#         all      every lane (the default)
#   --quick    pass --quick to the self-test (fewer sizes and pool jobs)
#   --keep     keep build/native-checks/<lane>/ (default: remove the objects, keep the executables)
#   --require  a lane whose toolchain is missing fails instead of being skipped (also when CI is set, e.g. CI=1)
# Prints one summary line per lane run ("lane <name>: ok|FAIL|SKIP ..."); exit status 1 when any lane failed.
# The self-test's own lines go to build/native-checks/<lane>/selftest*.log (and to stdout with -v).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
OUT=$ROOT/build/native-checks
CFLAGS=(-std=gnu11 -O2 -Wall -Werror -Wno-unused-function -fno-strict-aliasing -Icsrc)
JOBS=2

lanes=() quick=() keep=0 require=0 show=0
case ${CI:-} in "" | 0 | false) ;; *) require=1 ;; esac
for a in "$@"; do
    case $a in
    native | clang | aarch64 | aarch64-clang | windows | zig-aarch64 | macos | windows-arm64) lanes+=("$a") ;;
    all) lanes+=(native clang aarch64 aarch64-clang windows zig-aarch64 macos windows-arm64) ;;
    --quick) quick=(--quick) ;;
    --keep) keep=1 ;;
    --require) require=1 ;;
    -v) show=1 ;;
    *) echo "usage: $0 [native|clang|aarch64|aarch64-clang|windows|zig-aarch64|macos|windows-arm64|all]..." \
            "[--quick] [--keep] [--require] [-v]" >&2
       exit 2 ;;
    esac
done
[ ${#lanes[@]} -eq 0 ] && lanes=(native clang aarch64 aarch64-clang windows zig-aarch64 macos windows-arm64)

failed=0
summary=()
say() { summary+=("$*"); echo "$*"; }

# compile SOURCES with CC (an array) into DIR, at most $JOBS at a time; link with LINK (an array) into DIR/EXE
build() {
    local dir=$1 exe=$2
    shift 2
    mkdir -p "$dir"
    local srcs=(csrc/*.c csrc/selftest/qs_selftest.c) objs=() pids=() rc=0 s o
    for s in "${srcs[@]}"; do
        o=$dir/$(basename "${s%.c}").o
        objs+=("$o")
        "${CC[@]}" "${CFLAGS[@]}" -c "$s" -o "$o" 2>"$o.err" &
        pids+=($!)
        if [ ${#pids[@]} -ge $JOBS ]; then
            wait "${pids[0]}" || rc=1
            pids=("${pids[@]:1}")
        fi
    done
    for p in "${pids[@]}"; do wait "$p" || rc=1; done
    for o in "${objs[@]}"; do
        if [ -s "$o.err" ]; then cat "$o.err" >&2; fi
        rm -f "$o.err"
    done
    [ $rc -eq 0 ] || { echo "compile failed (${CC[*]})" >&2; return 1; }
    "${LINK[@]}" "${objs[@]}" -o "$dir/$exe" "${LIBS[@]}" || { echo "link failed (${LINK[*]})" >&2; return 1; }
    [ $keep -eq 1 ] || rm -f "${objs[@]}"
}

# run the self-test: NAME, LOG, then the command; prints its summary line, returns its status
selftest() {
    local name=$1 log=$2 t0 t1 rc
    shift 2
    t0=$(date +%s)
    "$@" "${quick[@]}" >"$log" 2>&1
    rc=$?
    t1=$(date +%s)
    [ $show -eq 1 ] && cat "$log"
    grep -E '^FAIL' "$log" | head -20
    local line
    line=$(grep -E '^selftest: [0-9]+ checks' "$log" | tail -1)
    [ -n "$line" ] || { line="no summary (exit $rc)"; tail -5 "$log"; }
    [ $rc -eq 0 ] || rc=1
    say "lane $name: $([ $rc -eq 0 ] && echo ok || echo FAIL) ($((t1 - t0)) s) $line"
    return $rc
}

missing() { # LANE TOOL APT-PACKAGE, or LANE TOOL "" HINT
    local hint="apt-get install $3"
    [ -n "$3" ] || hint=$4
    if [ $require -eq 1 ]; then
        say "lane $1: FAIL: no $2 ($hint)"
        failed=1
    else
        say "lane $1: SKIP: no $2 ($hint)"
    fi
}

# zig's clang (PyPI's ziglang): a current clang with the C library headers of every target, macOS and Windows on
# ARM64 included, so csrc builds here for systems this machine has no SDK for
zig_cc() {
    if [ -n "${ZIG:-}" ]; then ZIGCC=("$ZIG" cc); return 0; fi
    local py zig
    for py in "$ROOT/.venv/bin/python" python3; do
        zig=$("$py" -c 'import os, ziglang; print(os.path.join(os.path.dirname(ziglang.__file__), "zig"))' 2>/dev/null)
        if [ -n "$zig" ] && [ -x "$zig" ]; then ZIGCC=("$zig" cc); return 0; fi
    done
    return 1
}
# describe a built executable in a few words (file(1) where installed)
kind() { if command -v file >/dev/null; then file -b "$1" | cut -d, -f1; else echo "$(wc -c <"$1") bytes"; fi; }

for lane in "${lanes[@]}"; do
    dir=$OUT/$lane
    LIBS=(-lm)
    case $lane in
    native | clang)
        cc=gcc apt=gcc
        [ "$lane" = clang ] && cc=clang apt=clang
        command -v $cc >/dev/null || { missing "$lane" $cc $apt; continue; }
        CC=("$cc" -pthread) LINK=("$cc" -pthread)
        build "$dir" qs_selftest || { say "lane $lane: FAIL: build"; failed=1; continue; }
        selftest "$lane" "$dir/selftest.log" "$dir/qs_selftest" || failed=1
        ;;
    aarch64 | aarch64-clang)
        command -v aarch64-linux-gnu-gcc >/dev/null || { missing "$lane" aarch64-linux-gnu-gcc gcc-aarch64-linux-gnu; continue; }
        command -v qemu-aarch64 >/dev/null || { missing "$lane" qemu-aarch64 qemu-user; continue; }
        if [ "$lane" = aarch64 ]; then
            CC=(aarch64-linux-gnu-gcc -pthread)
            cpus=(cortex-a72 neoverse-n1 max)
        else
            command -v clang >/dev/null || { missing "$lane" clang clang; continue; }
            CC=(clang --target=aarch64-linux-gnu -pthread)
            cpus=(max)
        fi
        LINK=(aarch64-linux-gnu-gcc -static -pthread)
        build "$dir" qs_selftest || { say "lane $lane: FAIL: build"; failed=1; continue; }
        for cpu in "${cpus[@]}"; do
            selftest "$lane/$cpu" "$dir/selftest-$cpu.log" qemu-aarch64 -cpu "$cpu" "$dir/qs_selftest" || failed=1
        done
        ;;
    windows)
        command -v x86_64-w64-mingw32-gcc >/dev/null || { missing "$lane" x86_64-w64-mingw32-gcc gcc-mingw-w64-x86-64; continue; }
        wine=$(command -v wine64 || command -v wine || true)
        [ -n "$wine" ] || { missing "$lane" wine64 wine64; continue; }
        CC=(x86_64-w64-mingw32-gcc)
        LINK=(x86_64-w64-mingw32-gcc -static)
        LIBS=()
        build "$dir" qs_selftest.exe || { say "lane $lane: FAIL: build"; failed=1; continue; }
        mkdir -p "$OUT/wineprefix"
        WINEPREFIX=$OUT/wineprefix WINEDEBUG=-all WINEDLLOVERRIDES="mscoree,mshtml=" \
            selftest "$lane" "$dir/selftest.log" "$wine" "$dir/qs_selftest.exe" || failed=1
        ;;
    zig-aarch64)
        zig_cc || { missing "$lane" zig "" "pip install ziglang"; continue; }
        command -v qemu-aarch64 >/dev/null || { missing "$lane" qemu-aarch64 qemu-user; continue; }
        CC=("${ZIGCC[@]}" -target aarch64-linux-musl)
        LINK=("${ZIGCC[@]}" -target aarch64-linux-musl -static)
        build "$dir" qs_selftest || { say "lane $lane: FAIL: build"; failed=1; continue; }
        for cpu in cortex-a72 neoverse-n1 max; do
            selftest "$lane/$cpu" "$dir/selftest-$cpu.log" qemu-aarch64 -cpu "$cpu" "$dir/qs_selftest" || failed=1
        done
        ;;
    macos | windows-arm64)
        zig_cc || { missing "$lane" zig "" "pip install ziglang"; continue; }
        if [ "$lane" = macos ]; then targets=(aarch64-macos x86_64-macos); else targets=(aarch64-windows-gnu); fi
        for t in "${targets[@]}"; do
            exe=qs_selftest
            case $t in *windows*) exe=qs_selftest.exe; LIBS=() ;; esac
            CC=("${ZIGCC[@]}" -target "$t") LINK=("${ZIGCC[@]}" -target "$t")
            t0=$(date +%s)
            if build "$dir/$t" "$exe"; then
                say "lane $lane/$t: ok ($(( $(date +%s) - t0 )) s) built and linked, not run here: $(kind "$dir/$t/$exe")"
            else
                say "lane $lane/$t: FAIL: build"; failed=1
            fi
        done
        ;;
    esac
done

echo "native checks:"
printf '  %s\n' "${summary[@]}"
exit $failed
