"""The native library's OS seam (csrc/qs_os.h, qs_os.c; docs/native.md "Platforms").

Read from the sources: no csrc file but the seam includes an OS header or makes an OS call (the fault guard's
signal handling and the CPU queries of qs_dispatch.c excepted), and no block from qs_aligned_alloc is released with
free() (Windows' _aligned_malloc blocks must go to _aligned_free). Run here: the seam's memory calls through the
library (2 MiB aligned zeroed maps, dropping a file mapping's pages keeps its contents), the pool in a forked child,
the seam files compiled for every target whose compiler is installed (-Wall -Werror), and the Win32 branch's pool
and clock run under Wine."""

from __future__ import annotations

import mmap
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from quantscope.core.native import ffi, lib

from .host_lanes import linux_host_only, missing_tools

CSRC = Path(__file__).resolve().parent.parent / "csrc"

#: OS headers and calls, and the files allowed to use them
OS_HEADERS = {"pthread.h", "sys/mman.h", "unistd.h", "sched.h", "signal.h", "windows.h", "process.h", "malloc.h",
              "sys/auxv.h", "sys/sysctl.h", "intrin.h", "time.h", "sys/time.h", "setjmp.h"}
OS_CALLS = {"pthread_[a-z_]+", "mmap", "munmap", "madvise", "sysconf", "clock_gettime", "usleep", "nanosleep",
            "sched_yield", "aligned_alloc", "posix_memalign", "_aligned_malloc", "_aligned_free", "VirtualAlloc",
            "VirtualFree", "VirtualUnlock", "CreateThread", "_beginthreadex", "Sleep", "SwitchToThread",
            "QueryPerformanceCounter", "GetSystemInfo", "sigaction", "sigsetjmp", "siglongjmp", "raise", "_exit",
            "getauxval", "sysctlbyname", "IsProcessorFeaturePresent", "__builtin_cpu_supports", "__get_cpuid"}
ALLOWED: dict[str, set[str] | None] = {
    "qs_os.c": None,  # the seam: anything
    "qs_os.h": {"pthread.h"},
    "qs_guard.c": {"signal.h", "unistd.h", "sigaction", "siglongjmp", "raise", "_exit"},  # its POSIX branch
    "qs_guard.h": {"setjmp.h", "sigsetjmp"},  # QS_GUARDED / QS_GUARD_TASK, POSIX only
    "qs_dispatch.c": {"sys/auxv.h", "sys/sysctl.h", "windows.h", "intrin.h", "getauxval", "sysctlbyname",
                      "IsProcessorFeaturePresent"},
}


def strip_comments(src: str) -> str:
    """C source without its comments and string literals (kept as empty quotes)."""
    pattern = r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"'
    return re.sub(pattern, lambda m: '""' if m.group(0).startswith('"') else " ", src, flags=re.S)


def os_uses(src: str) -> set[str]:
    """The OS headers included and OS calls made in C source ``src``."""
    code = strip_comments(src)
    found = {h for h in re.findall(r'#\s*include\s*<([^>]+)>', code) if h in OS_HEADERS}
    for pat in OS_CALLS:
        for m in re.finditer(rf"(?<![\w.>])({pat})\s*\(", code):
            found.add(m.group(1))
    return found


def plain_frees_of_aligned(src: str) -> list[str]:
    """Names of blocks ``src`` takes from qs_aligned_alloc and hands to free()."""
    code = strip_comments(src)
    names = set(re.findall(r"(\w+)\s*=\s*(?:\([^()]*\)\s*)?qs_aligned_alloc\s*\(", code))
    return sorted(n for n in names if re.search(rf"(?<![\w])free\s*\(\s*[\w.>\[\]-]*?\b{n}\s*\)", code))


def test_the_scanners_find_what_they_look_for():
    assert os_uses("#include <pthread.h>\nint f(void) { return sysconf(1); } /* mmap( */") == {"pthread.h", "sysconf"}
    assert os_uses("void g(void) { pthread_mutex_lock(&m); qs_mmap(1); s.mmap(2); }") == {"pthread_mutex_lock"}
    assert plain_frees_of_aligned("a->buf = (uint8_t *)qs_aligned_alloc(64, n); free(a->buf);") == ["buf"]
    assert plain_frees_of_aligned("buf = qs_aligned_alloc(64, n); qs_aligned_free(buf); free(tmp);") == []


def test_os_calls_only_in_the_seam():
    bad = []
    for f in sorted([*CSRC.glob("*.c"), *CSRC.glob("*.h")]):
        allowed = ALLOWED.get(f.name, set())
        if allowed is None:
            continue
        if extra := os_uses(f.read_text()) - allowed:
            bad.append(f"{f.name}: {', '.join(sorted(extra))}")
    assert not bad, "OS calls outside csrc/qs_os.c (docs/native.md, Platforms): " + "; ".join(bad)


def test_aligned_blocks_go_back_to_qs_aligned_free():
    bad = {f.name: names for f in sorted(CSRC.glob("*.c")) if (names := plain_frees_of_aligned(f.read_text()))}
    assert not bad, f"free() of qs_aligned_alloc blocks (use qs_aligned_free): {bad}"


def test_huge_map_is_aligned_zeroed_and_writable():
    n = 5_000_003
    p = lib.qs_alloc_huge(n)
    assert p != ffi.NULL
    try:
        if sys.platform.startswith("linux"):
            assert int(ffi.cast("uintptr_t", p)) % (2 << 20) == 0
        a = np.frombuffer(ffi.buffer(ffi.cast("uint8_t *", p), n), dtype=np.uint8)
        assert not a.any()
        a[:] = 7
        assert int(a[-1]) == 7 and int(a.sum()) == 7 * n
    finally:
        lib.qs_free_huge(p, n)
    assert lib.qs_alloc_huge(0) == ffi.NULL and lib.qs_alloc_huge(-1) == ffi.NULL


def test_dropping_a_file_mappings_pages_keeps_its_contents(tmp_path):
    data = np.random.default_rng(1).integers(0, 256, 3 * 65536 + 123, dtype=np.uint8)
    path = tmp_path / "w.bin"
    path.write_bytes(data.tobytes())
    with path.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        view = np.frombuffer(mm, dtype=np.uint8)
        assert int(view.sum()) == int(data.sum())  # touch every page
        ptr = ffi.cast("uint8_t *", ffi.from_buffer(view))
        assert lib.qs_drop_pages(ptr, view.size) == 0
        assert lib.qs_drop_pages(ptr + 1, 10) == 0  # no whole page inside: nothing to do
        assert np.array_equal(view, data)
        del view, ptr
    assert lib.qs_drop_pages(ffi.NULL, 100) == -1


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork() on this system")
def test_pool_starts_over_in_a_forked_child():
    assert lib.qs_pool_selftest(20, 4, 0) == 0  # the parent's workers exist
    pid = os.fork()
    if pid == 0:  # the child: none of the parent's workers, the at-fork handler resets the pool
        os._exit(0 if lib.qs_pool_selftest(50, 4, 0) == 0 else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_clock_and_cpu_count_through_the_library():
    assert 1 <= lib.qs_threads_default() <= 64
    ns = lib.qs_pool_op_ns(2, 50)  # timed with qs_now_ns
    assert 0 < ns < 1e9


SEAM_FILES = ["qs_os.c", "qs_pool.c", "qs_guard.c", "qs_dispatch.c", "qs_bench.c", "qs_gemm.c", "qs_repack.c"]
TARGETS = {
    "gcc": ["gcc"],
    "clang": ["clang"],
    "aarch64-gcc": ["aarch64-linux-gnu-gcc"],
    "aarch64-clang": ["clang", "--target=aarch64-linux-gnu", "-isystem", "/usr/aarch64-linux-gnu/include"],
    "mingw-w64": ["x86_64-w64-mingw32-gcc"],
    "clang-mingw-w64": ["clang", "--target=x86_64-w64-mingw32"],
    "clang-windows-arm64": ["clang", "--target=aarch64-w64-mingw32", "-isystem", "/usr/x86_64-w64-mingw32/include"],
}


def _toolchain_works(cc: list[str], tmp: Path) -> bool:
    if shutil.which(cc[0]) is None:
        return False
    probe = tmp / "probe.c"
    probe.write_text("#include <stdlib.h>\nint f(void) { return abs(-1); }\n")
    return subprocess.run([*cc, "-c", str(probe), "-o", str(tmp / "probe.o")], capture_output=True).returncode == 0


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_seam_files_compile_for_every_target(target, tmp_path):
    cc = TARGETS[target]
    if not _toolchain_works(cc, tmp_path):
        pytest.skip(f"no working {' '.join(cc)} here")
    flags = ["-Wall", "-Werror", "-Wno-unused-function", "-std=gnu11", "-O2", "-c", "-I", str(CSRC)]
    for name in SEAM_FILES:
        r = subprocess.run([*cc, *flags, str(CSRC / name), "-o", str(tmp_path / (name + ".o"))],
                           capture_output=True, text=True)
        assert r.returncode == 0, f"{target}: {name}\n{r.stderr[-3000:]}"


WINE_MAIN = r"""
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <windows.h>
#include "qs.h"
#include "qs_os.h"

/* a view of a file: its pages dropped keep their contents; the file cannot be truncated under the view (why the
 * fault guard is not needed on Windows: ERROR_USER_MAPPED_FILE) */
static int file_view(const char *path) {
    static unsigned char buf[200000];
    for (int i = 0; i < (int)sizeof buf; ++i) buf[i] = (unsigned char)(i * 7);
    HANDLE f = CreateFileA(path, GENERIC_READ | GENERIC_WRITE, 0, NULL, CREATE_ALWAYS, 0, NULL);
    DWORD w = 0;
    if (f == INVALID_HANDLE_VALUE || !WriteFile(f, buf, sizeof buf, &w, NULL)) return 0;
    HANDLE m = CreateFileMappingA(f, NULL, PAGE_READONLY, 0, 0, NULL);
    const unsigned char *v = m ? (const unsigned char *)MapViewOfFile(m, FILE_MAP_READ, 0, 0, 0) : NULL;
    if (!v) return 0;
    int ok = memcmp(v, buf, sizeof buf) == 0 && qs_page_drop(v, sizeof buf) == 0 && memcmp(v, buf, sizeof buf) == 0;
    LARGE_INTEGER end;
    end.QuadPart = 1000;
    ok = ok && SetFilePointerEx(f, end, NULL, FILE_BEGIN) && !SetEndOfFile(f);
    ok = ok && GetLastError() == ERROR_USER_MAPPED_FILE;
    UnmapViewOfFile(v), CloseHandle(m), CloseHandle(f);
    return ok;
}

static atomic_long sum, count;
static void task(void *ctx, int64_t t) { (void)ctx; atomic_fetch_add(&sum, (long)t); atomic_fetch_add(&count, 1); }

int main(void) {
    int bad = 0;
    for (int rep = 0; rep < 20; ++rep) {
        atomic_store(&sum, 0), atomic_store(&count, 0);
        qs_parallel_for(1000, task, NULL, 4);
        bad += atomic_load(&count) != 1000 || atomic_load(&sum) != 999L * 1000 / 2;
    }
    long long st = qs_pool_selftest(200, 4, 0), st2 = qs_pool_selftest(30, 4, 300);
    int64_t t0 = qs_now_ns();
    qs_sleep_us(20000);
    int64_t dt = qs_now_ns() - t0;
    size_t n = 3000001;
    unsigned char *h = (unsigned char *)qs_map_anon(n, 1);
    int mem = h != NULL;
    for (size_t i = 0; mem && i < n; i += 4096) mem = h[i] == 0;
    if (h) memset(h, 7, n), mem = mem && qs_page_drop(h, n) == 0 && h[n - 1] == 7, qs_unmap_anon(h, n);
    void *a = qs_aligned_alloc(64, 1000);
    mem = mem && a && ((uintptr_t)a & 63) == 0;
    qs_aligned_free(a);
    volatile float x = 1.0f + 0x1p-12f, y = -1.0f - 0x1p-11f;
    float f = fmaf(x, x, y);
    int view = file_view("view.bin");
    printf("pool %d selftest %lld %lld sleep %lld us memory %d file view %d cpus %d fmaf %a\n", bad, st, st2,
           (long long)(dt / 1000), mem, view, qs_cpu_count(), f);
    return !(bad == 0 && st == 0 && st2 == 0 && dt >= 20000000 && mem && view && qs_cpu_count() >= 1 &&
             f == 0x1p-24f);
}
"""


@pytest.mark.slow
@linux_host_only
def test_win32_branch_runs_under_wine(tmp_path):
    """The Win32 threads, once, SRW lock, condition variable, clock, sleep and memory calls, and MinGW's fmaf
    replaced by the seam's (a pool of 4 threads over 1000 tasks, the pool's own race test); a file view's pages
    dropped keep their contents, and the file cannot be truncated while the view is open."""
    cc, wine = shutil.which("x86_64-w64-mingw32-gcc"), shutil.which("wine64") or shutil.which("wine")
    if not (cc and wine):
        msg = "needs x86_64-w64-mingw32-gcc and wine (apt-get install gcc-mingw-w64-x86-64 wine64)"
        missing_tools(msg)
    main = tmp_path / "main.c"
    main.write_text(WINE_MAIN)
    exe = tmp_path / "seam.exe"
    srcs = [str(main), *(str(CSRC / f) for f in ("qs_os.c", "qs_pool.c", "qs_guard.c"))]
    subprocess.run([cc, "-std=gnu11", "-O2", "-Wall", "-Werror", "-Wno-unused-function", "-I", str(CSRC), *srcs,
                    "-o", str(exe)], check=True)
    env = {**os.environ, "WINEDEBUG": "-all"}
    r = subprocess.run([wine, str(exe)], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    assert "pool 0 selftest 0 0" in r.stdout
