"""tests/run_gpu.sh's one table: per test file, how many tests passed, failed and were skipped, and why they were
skipped, from pytest's JUnit reports; for each file with a failure its first failing test and the kernel its message
names (the debug mode's line, QUANTSCOPE_CUDA_DEBUG=1: "k_matmul_mma<Q4_K> (grid 64x4, ...): ..."), and the same for
the file's rerun in the debug mode.

Usage: python tests/gpu_summary.py REPORT ELAPSED_SECONDS PYTEST_EXIT_CODE
REPORT: one JUnit file, or a directory of them (tests/run_gpu.sh: one per test file, NAME.xml, and NAME.debug.xml
for its rerun in the debug mode; memcheck.txt there: the compute-sanitizer pass's one line).
"""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from pathlib import Path

LIMIT_S = 360  # the device check must finish in under 6 minutes on an H100


_KERNEL = re.compile(r"\b(k_\w+(?:<[^>()]*>)?) \(grid ")  # the debug mode's fault line
_ANY_KERNEL = re.compile(r"\bk_[a-z0-9_]+(?:<[^>()]*>)?")


def kernel_named(text: str) -> str:
    """The kernel a failure's text names: the debug mode's fault line first, else any k_* name, else ""."""
    m = _KERNEL.search(text) or _ANY_KERNEL.search(text)
    return m.group(1) if m and m.re is _KERNEL else (m.group(0) if m else "")


def first_failure(junit: Path) -> tuple[str, str, str]:
    """(test name, kernel named, the message's first line) of the report's first failure; empty: none."""
    try:
        root = ET.parse(junit).getroot()
    except (OSError, ET.ParseError):
        return "", "", ""
    for case in root.iter("testcase"):
        for child in case:
            if child.tag in ("failure", "error"):
                text = f"{child.get('message') or ''}\n{child.text or ''}"
                line = next((ln.strip() for ln in (child.get("message") or "").splitlines() if ln.strip()), "")
                return case.get("name") or "?", kernel_named(text), line[:160]
    return "", "", ""


def summarize(junit: Path) -> tuple[dict[str, Counter[str]], Counter[str], list[str], float]:
    """(outcome counts per file, skip reasons with their counts, failed test names, pytest's seconds)."""
    per_file: dict[str, Counter[str]] = defaultdict(Counter)
    reasons: Counter[str] = Counter()
    failed: list[str] = []
    seconds = 0.0
    try:
        root = ET.parse(junit).getroot()
    except ET.ParseError:  # a process killed while writing it
        return per_file, reasons, failed, seconds
    for suite in root.iter("testsuite"):
        seconds += float(suite.get("time", 0.0))
        for case in suite.iter("testcase"):
            module = (case.get("classname") or "?").split(".")
            name = "/".join(module[:2]) + ".py" if len(module) >= 2 else module[0]
            outcome = "passed"
            for child in case:
                if child.tag == "skipped":
                    outcome = "skipped"
                    reasons[(child.get("message") or "").strip()[:110]] += 1
                elif child.tag in ("failure", "error"):
                    outcome = "failed"
                    failed.append(f"{name}::{case.get('name')}")
            per_file[name][outcome] += 1
    return per_file, reasons, failed, seconds


def main(argv: list[str]) -> int:
    junit, elapsed, rc = Path(argv[1]), int(argv[2]), int(argv[3])
    gpu, gpu_ok = "?", False
    try:
        from quantscope.core.engine import cuda_library as cl

        ok, why = cl.cuda_status()
        gpu, gpu_ok = (why if ok else f"no usable GPU: {why}"), ok
    except Exception as exc:  # the table is printed whatever the backend says
        gpu = f"cuda_library did not load: {exc}"
    print(f"\n=== run_gpu summary: {gpu}")
    reports = sorted(p for p in junit.glob("*.xml") if not p.name.endswith(".debug.xml")) if junit.is_dir() else \
        [junit] if junit.is_file() else []
    if junit.is_dir() and (junit / "memcheck.txt").is_file():
        print(f"compute-sanitizer memcheck: {(junit / 'memcheck.txt').read_text(encoding='utf-8').strip()}")
    if not reports:
        print(f"no test report ({junit}); pytest exit code {rc}; {elapsed} s")
        return 0
    per_file: dict[str, Counter[str]] = defaultdict(Counter)
    reasons: Counter[str] = Counter()
    failed: list[str] = []
    seconds = 0.0
    firsts: list[str] = []
    for report in reports:
        f, r, fl, sec = summarize(report)
        for name, c in f.items():
            per_file[name].update(c)
        reasons.update(r)
        failed += fl
        seconds += sec
        test, kernel, line = first_failure(report)
        if test:
            firsts.append(f"  first failure in {report.stem}: {test} (kernel: {kernel or 'not named'}) {line}")
        debug = report.with_name(report.stem + ".debug.xml")
        if junit.is_dir() and debug.is_file():
            test, kernel, line = first_failure(debug)
            firsts.append("  rerun with QUANTSCOPE_CUDA_DEBUG=1: " + (
                f"{test} (kernel: {kernel or 'not named'}) {line}" if test else "no failure"))
    print(f"{'test file':32} {'passed':>7} {'failed':>7} {'skipped':>8}")
    total: Counter[str] = Counter()
    for name in sorted(per_file):
        c = per_file[name]
        total.update(c)
        print(f"{name:32} {c['passed']:7d} {c['failed']:7d} {c['skipped']:8d}")
    print(f"{'total':32} {total['passed']:7d} {total['failed']:7d} {total['skipped']:8d}")
    for reason, n in reasons.most_common():
        print(f"  skipped {n:3d}x: {reason}")
    for name in failed:
        print(f"  FAILED: {name}")
    for line in firsts:
        print(line)
    if rc != 0 or failed:
        verdict = f"NOT ok (pytest exit code {rc})"
    elif not gpu_ok:
        verdict = "host checks only: no usable GPU, every GPU test skipped (not a device run)"
    else:
        verdict = "ok"
    print(f"{verdict}; pytest {seconds:.0f} s, whole check {elapsed} s (limit {LIMIT_S} s"
          f"{', exceeded' if elapsed >= LIMIT_S else ''})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
