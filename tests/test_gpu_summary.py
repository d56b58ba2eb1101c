"""tests/gpu_summary.py: the device check's one table, from a JUnit report."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" time="12.5">
<testcase classname="tests.test_cuda" name="test_a" time="0.1"/>
<testcase classname="tests.test_cuda" name="test_b" time="0.1"><skipped message="no usable CUDA GPU: none"/></testcase>
<testcase classname="tests.test_cuda" name="test_c" time="0.1"><skipped message="no usable CUDA GPU: none"/></testcase>
<testcase classname="tests.test_cuda_moe" name="test_d[q8_0]" time="0.1"><failure message="boom"/></testcase>
<testcase classname="tests.test_cuda_moe" name="test_e" time="0.1"/>
<testcase classname="tests.test_cuda_fit" name="test_f" time="0.1"><error message="fixture"/></testcase>
</testsuite></testsuites>
"""


def run(tmp_path: Path, junit: str | None, rc: int, elapsed: int = 100) -> str:
    path = tmp_path / "junit.xml"
    if junit is not None:
        path.write_text(junit)
    env = {**os.environ, "QUANTSCOPE_CUDA_LIB": str(tmp_path / "none.so")}  # no GPU backend, on any machine
    out = subprocess.run([sys.executable, str(ROOT / "tests" / "gpu_summary.py"), str(path), str(elapsed), str(rc)],
                         capture_output=True, text=True, check=True, cwd=ROOT, env=env)
    return out.stdout


def test_table_counts_each_file_and_names_failures_and_skip_reasons(tmp_path):
    text = run(tmp_path, JUNIT, 1)
    rows = {line.split()[0]: line.split()[1:] for line in text.splitlines() if line.startswith(("tests/", "total"))}
    assert rows["tests/test_cuda.py"] == ["1", "0", "2"]
    assert rows["tests/test_cuda_moe.py"] == ["1", "1", "0"]
    assert rows["tests/test_cuda_fit.py"] == ["0", "1", "0"]
    assert rows["total"] == ["2", "2", "2"]
    assert "skipped   2x: no usable CUDA GPU: none" in text
    assert "FAILED: tests/test_cuda_moe.py::test_d[q8_0]" in text and "FAILED: tests/test_cuda_fit.py::test_f" in text
    assert "NOT ok (pytest exit code 1)" in text and "whole check 100 s (limit 360 s)" in text


def test_a_run_without_a_gpu_is_never_called_ok(tmp_path):
    """Without a usable GPU every GPU test skips: the verdict says so instead of ok; over 6 minutes is flagged."""
    text = run(tmp_path, JUNIT.replace('<failure message="boom"/>', "").replace('<error message="fixture"/>', ""),
               0, elapsed=400)
    last = text.strip().splitlines()[-1]
    assert last.startswith("host checks only: no usable GPU") and "limit 360 s, exceeded" in last


def test_no_report_is_said_not_hidden(tmp_path):
    text = run(tmp_path, None, 124)
    assert "no test report" in text and "pytest exit code 124" in text


def test_one_report_per_file_names_the_first_failure_and_its_kernel(tmp_path):
    """tests/run_gpu.sh's directory of reports (one pytest process per file, NAME.debug.xml: the file's rerun in the
    debug mode): the table adds them up; each failing file's first failure is named with the kernel its message
    names (the debug mode's fault line), the rerun's too; the memcheck pass's line is shown."""
    fault = ("CudaError: forward: k_matmul_mma&lt;Q4_K&gt; (grid 64x4, 128 threads; rows 4096, k 4096, cols 65): "
             "an illegal memory access was encountered")
    (tmp_path / "test_cuda.xml").write_text(JUNIT.replace("tests.test_cuda_moe", "tests.test_cuda"))
    (tmp_path / "test_cuda_mma.xml").write_text(
        '<testsuites><testsuite time="3"><testcase classname="tests.test_cuda_mma" name="test_x"/>'
        f'<testcase classname="tests.test_cuda_mma" name="test_y[Q4_K]"><failure message="{fault}"/></testcase>'
        "</testsuite></testsuites>")
    (tmp_path / "test_cuda_mma.debug.xml").write_text(
        '<testsuites><testsuite time="1"><testcase classname="tests.test_cuda_mma" name="test_y[Q4_K]">'
        f'<failure message="{fault}"/></testcase></testsuite></testsuites>')
    (tmp_path / "memcheck.txt").write_text("0 errors (tests/test_cuda.py kernels, one-layer model; 41 s)\n")
    env = {**os.environ, "QUANTSCOPE_CUDA_LIB": str(tmp_path / "none.so")}
    text = subprocess.run([sys.executable, str(ROOT / "tests" / "gpu_summary.py"), str(tmp_path), "200", "1"],
                          capture_output=True, text=True, check=True, cwd=ROOT, env=env).stdout
    rows = {line.split()[0]: line.split()[1:] for line in text.splitlines() if line.startswith(("tests/", "total"))}
    assert rows["tests/test_cuda.py"] == ["2", "1", "2"] and rows["tests/test_cuda_mma.py"] == ["1", "1", "0"]
    assert rows["total"] == ["3", "3", "2"]
    assert "compute-sanitizer memcheck: 0 errors (tests/test_cuda.py kernels" in text
    assert "first failure in test_cuda_mma: test_y[Q4_K] (kernel: k_matmul_mma<Q4_K>)" in text
    assert "rerun with QUANTSCOPE_CUDA_DEBUG=1: test_y[Q4_K] (kernel: k_matmul_mma<Q4_K>)" in text
    assert "first failure in test_cuda: test_d[q8_0] (kernel: not named) boom" in text
