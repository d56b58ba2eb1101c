"""The native thread pool behind every parallel kernel: each job's tasks all end before the call returns.

A worker reads the job it is woken for and then whether it takes part; on a busy machine it can be descheduled
between the two. The pool's test hook widens that window (workers pause after reading a job), so the jobs here
meet the interleavings a loaded machine makes now and then; a pool that lets a worker take part in one job twice
returns before its tasks have ended, and the caller's stack context is then used after the call (the crash of a
repack under a loaded GUI test run).
"""

from __future__ import annotations

import threading

import pytest

from quantscope.core.native import lib


@pytest.mark.parametrize(("threads", "pause_us"), [(8, 1000), (8, 100), (4, 300), (3, 1000)])
def test_every_job_ends_before_its_call_returns(threads: int, pause_us: int) -> None:
    # 500 jobs of 2..threads+1 tasks: the number of workers taking part changes from job to job
    assert lib.qs_pool_selftest(500, threads, pause_us) == 0


def test_callers_on_several_threads_share_the_pool() -> None:
    """Jobs from several Python threads (the GUI's workers, the server's scheduler) take turns on one pool."""
    results: list[int] = []

    def run() -> None:
        results.append(int(lib.qs_pool_selftest(150, 6, 200)))

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [0, 0, 0]
