"""tests/run_gpu.sh's one table: per test file, how many tests passed, failed and were skipped, and why they were
skipped, from pytest's JUnit report.

Usage: python tests/gpu_summary.py JUNIT.xml ELAPSED_SECONDS PYTEST_EXIT_CODE
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from pathlib import Path

LIMIT_S = 360  # the device check must finish in under 6 minutes on an H100


def summarize(junit: Path) -> tuple[dict[str, Counter[str]], Counter[str], list[str], float]:
    """(outcome counts per file, skip reasons with their counts, failed test names, pytest's seconds)."""
    per_file: dict[str, Counter[str]] = defaultdict(Counter)
    reasons: Counter[str] = Counter()
    failed: list[str] = []
    seconds = 0.0
    root = ET.parse(junit).getroot()
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
    if not junit.is_file():
        print(f"no test report ({junit}); pytest exit code {rc}; {elapsed} s")
        return 0
    per_file, reasons, failed, seconds = summarize(junit)
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
