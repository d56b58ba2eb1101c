"""The lanes that cross-build on the Linux development host (Debian's aarch64 and MinGW-w64 compilers, qemu-user,
Wine, actionlint): where they run, and what a missing tool means.

On a Linux host under CI (`.ci/run`, GitHub's Linux jobs) a missing tool fails the test: those jobs install them.
Elsewhere (a developer's machine, GitHub's macOS and Windows jobs, which set CI too but build natively and have no
such tools) the test is skipped, naming the packages."""

from __future__ import annotations

import os
import sys
from typing import NoReturn

import pytest

LINUX_HOST = sys.platform.startswith("linux")

#: a test module or test that only makes sense on the Linux development host
linux_host_only = pytest.mark.skipif(
    not LINUX_HOST, reason="a lane of the Linux development host; the macOS and Windows CI jobs build natively")


def missing_tools(msg: str) -> NoReturn:
    """Fail (Linux host under CI) or skip (anywhere else) because of ``msg``, which names the missing tools."""
    if os.environ.get("CI") and LINUX_HOST:
        pytest.fail(msg, pytrace=False)
    pytest.skip(msg)
