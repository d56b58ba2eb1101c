"""Regular expressions a user typed (``--tensor-type``, rule files, ``--tensor`` filters, the diff filter), matched
with a bound on time.

Python's ``re`` backtracks without limit: a nested pattern such as ``^([a-z0-9_.]+)+X`` takes tens of seconds on
a model's tensor names. :class:`UserPattern` compiles with the ``regex`` package (the same syntax for the patterns
llama-quantize takes; it avoids much of that backtracking) and gives all of a pattern's searches one time budget
(:data:`BUDGET_S`), passed as ``regex``'s ``timeout=``; running past it raises :class:`RegexTimeout`, a
``ValueError`` whose message is one line naming the pattern. The budget covers matching, not compiling: ``regex``
unrolls fixed repetitions (``a{100000000}`` compiles into tens of GB), so a pattern is refused before it is compiled
when it is longer than :data:`MAX_PATTERN_CHARS`, repeats anything more than :data:`MAX_REPEAT` times or would
unroll to more than :data:`MAX_UNROLLED` parts (:func:`check_size`).
"""

from __future__ import annotations

import re
import time

import regex

#: seconds all searches of one pattern may take together
BUDGET_S = 1.0
#: the longest pattern, the largest repetition count and the most parts a pattern may unroll to (an estimate
#: from above: each repeated part counted as often as its count says)
MAX_PATTERN_CHARS = 4096
MAX_REPEAT = 1000
MAX_UNROLLED = 100_000
_COUNT = re.compile(r"\{(\d*)(,?)(\d*)\}")


def check_size(pattern: str, what: str = "pattern") -> None:
    """:class:`PatternTooLarge` (one line naming ``pattern``) when it would compile into too much (see the module's
    docstring); a scan of the text, so an estimate: it errs towards counting more."""
    who = f"{what} " if what else ""
    shown = repr(pattern if len(pattern) <= 60 else pattern[:57] + "...")
    if len(pattern) > MAX_PATTERN_CHARS:
        raise PatternTooLarge(f"{who}{shown}: longer than {MAX_PATTERN_CHARS:,} characters")
    groups = [[0, 0]]  # per open group: [parts so far, parts of the last item]
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        size = 1
        if c == "\\":
            i += 2
            if i < n and pattern[i] == "{" and pattern[i - 1] in "pPNxgk":  # \p{L}, \x{263a}, \N{name}: one item
                end = pattern.find("}", i)
                i = n if end < 0 else end + 1
        elif c == "[":  # a set: one item (a ] first is a member)
            j = i + 1 + (pattern.startswith("^", i + 1))
            j += pattern.startswith("]", j)
            while j < n and pattern[j] != "]":
                j += 2 if pattern[j] == "\\" else 1
            i = j + 1
        elif c == "(":
            groups.append([0, 0])
            i += 1
            continue
        elif c == ")" and len(groups) > 1:
            size = groups.pop()[0]
            i += 1
        elif c == "{" and (m := _COUNT.match(pattern, i)) and (m.group(1) or m.group(3)):
            lo, comma, hi = m.groups()
            if len(lo) > 6 or len(hi) > 6 or max(int(lo or 0), int(hi or 0)) > MAX_REPEAT:
                raise PatternTooLarge(f"{who}{shown}: a repetition count over {MAX_REPEAT:,} (regular expressions "
                                 "unroll them: it would take too much memory)")
            times = max(int(lo or 0), int(hi or 0)) if comma else int(lo)
            last = groups[-1][1]
            groups[-1][0] += last * (times - 1)
            groups[-1][1] = last * times
            if groups[-1][0] > MAX_UNROLLED:
                raise PatternTooLarge(f"{who}{shown}: nested repetitions unroll to over {MAX_UNROLLED:,} parts (too "
                                 "much memory)")
            i = m.end()
            continue
        elif c in "*+?|^$":
            i += 1
            continue
        else:
            i += 1
        groups[-1][0] += size
        groups[-1][1] = size


class RegexTimeout(ValueError):
    """A user's regular expression ran past its time budget (catastrophic backtracking)."""


class PatternTooLarge(ValueError):
    """A user's regular expression would compile into too much memory (:func:`check_size`)."""


class UserPattern:
    """A user's regular expression: ``search`` like ``re.Pattern.search``, within one shared time budget.
    ``what`` names the option in messages (``--tensor-type``); a bad pattern is a ``ValueError``."""

    def __init__(self, pattern: str, what: str = "pattern", budget_s: float | None = None) -> None:
        self.pattern = pattern
        self.what = what
        self._left = BUDGET_S if budget_s is None else budget_s
        check_size(pattern, what)
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
