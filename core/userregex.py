"""Regular expressions a user typed (``--tensor-type``, rule files, ``--tensor`` filters, the diff filter), matched
with a bound on time.

Python's ``re`` backtracks without limit: a nested pattern such as ``^([a-z0-9_.]+)+X`` takes tens of seconds on
a model's tensor names. :class:`UserPattern` compiles with the ``regex`` package (the same syntax for the patterns
llama-quantize takes; it avoids much of that backtracking) and gives all of a pattern's searches one time budget
(:data:`BUDGET_S`), passed as ``regex``'s ``timeout=``; running past it raises :class:`RegexTimeout`, a
``ValueError`` whose message is one line naming the pattern.
"""

from __future__ import annotations

import time

import regex

#: seconds all searches of one pattern may take together
BUDGET_S = 1.0


class RegexTimeout(ValueError):
    """A user's regular expression ran past its time budget (catastrophic backtracking)."""


class UserPattern:
    """A user's regular expression: ``search`` like ``re.Pattern.search``, within one shared time budget.
    ``what`` names the option in messages (``--tensor-type``); a bad pattern is a ``ValueError``."""

    def __init__(self, pattern: str, what: str = "pattern", budget_s: float | None = None) -> None:
        self.pattern = pattern
        self.what = what
        self._left = BUDGET_S if budget_s is None else budget_s
        try:
            self._rx = regex.compile(pattern, regex.VERSION0)
        except (regex.error, OverflowError, RecursionError) as exc:
            raise ValueError(f"{what + ' ' if what else ''}{pattern!r} is not a regular expression: {exc}") from None

    def search(self, text: str) -> regex.Match[str] | None:
        if self._left <= 0:
            raise self._timeout()
        t0 = time.perf_counter()
        try:
            return self._rx.search(text, timeout=self._left)
        except TimeoutError:
            self._left = 0.0
            raise self._timeout() from None
        finally:
            self._left -= time.perf_counter() - t0

    def _timeout(self) -> RegexTimeout:
        who = f"{self.what} " if self.what else ""
        return RegexTimeout(f"{who}{self.pattern!r}: the regular expression takes too long (over "
                            f"{BUDGET_S:g} s on the tensor names; nested repetition such as (a+)+ backtracks "
                            "exponentially); simplify it")
