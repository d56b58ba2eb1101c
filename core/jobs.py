"""What every long job shares: a cancel token, the cancelled exception, and a progress rate meter.

A job (conversion, quantization, statistics, a file edit or split…) takes ``progress(done, total)`` and a
``cancel`` object with a ``cancelled`` property (:class:`CancelToken`, or any :class:`CancelFlag`), checks it
between units of work with :func:`check_cancel`, and raises :class:`Cancelled` (or a subclass) when it is set,
leaving nothing behind. Front ends show :class:`RateMeter`'s rate and time left.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Protocol

Progress = Callable[[int, int], None]


class Cancelled(Exception):
    """A job stopped because its cancel token was set; whatever it was writing was removed."""


class CancelFlag(Protocol):
    """Anything with a ``cancelled`` attribute (e.g. :class:`CancelToken`)."""

    @property
    def cancelled(self) -> bool: ...


class CancelToken:
    """Thread-safe cancellation flag shared between a job and whoever may cancel it."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def cancel(self) -> None:
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the token is cancelled (at most ``timeout`` seconds); whether it was. A job never needs
        this; a test holds a worker at an exact point of its work until the front end cancels it."""
        return self._event.wait(timeout)


def check_cancel(cancel: CancelFlag | None, exc: type[Exception] = Cancelled) -> None:
    """Raise ``exc`` when ``cancel`` is set."""
    if cancel is not None and cancel.cancelled:
        raise exc("cancelled")


class RateMeter:
    """Throughput and time left of a job reporting ``(done, total)`` units, smoothed over ``window`` seconds."""

    def __init__(self, window: float = 2.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.window = window
        self.clock = clock
        self.samples: list[tuple[float, int]] = []
        self.start = clock()

    def update(self, done: int, total: int) -> tuple[float, float | None]:
        """Record progress; returns (units per second, seconds left or ``None`` while unknown)."""
        now = self.clock()
        self.samples.append((now, done))
        while len(self.samples) > 2 and now - self.samples[0][0] > self.window:
            self.samples.pop(0)
        t_a, d_a = self.samples[0]
        if len(self.samples) < 2 or now <= t_a:
            elapsed = now - self.start
            rate = done / elapsed if elapsed > 0 else 0.0
        else:
            rate = (done - d_a) / (now - t_a)
        eta = (total - done) / rate if rate > 0 and total >= done else None
        return rate, eta


def format_duration(seconds: float | None) -> str:
    """``75.2`` -> ``1:15``; ``None`` -> ``…``."""
    if seconds is None or not math.isfinite(seconds):
        return "…"
    s = round(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"
