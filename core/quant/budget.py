"""Choose one option per item under a byte budget at the least total cost (docs/quantize.md, section 8).

A multiple-choice knapsack: each item (a tensor) has options ``(bytes, cost)`` (its candidate types, the cost being
the KL divergence the type adds). :func:`solve` relaxes the budget with a Lagrange multiplier λ: for a given λ every
item independently takes the option minimising ``cost + λ·bytes``, which is always a point of the item's lower
convex hull, and the total bytes fall as λ grows. λ is bisected over the hull's slopes to the smallest value whose
choice fits; that choice is optimal for its own total bytes. The bytes still left are then spent greedily, each step
the move (any option of any item, hull or not) with the best cost saved per byte added that still fits.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

Option = tuple[int, float]  # (bytes, cost)


class BudgetError(ValueError):
    """No choice fits the budget (the message gives the smallest possible total)."""


@dataclass(frozen=True)
class Solution:
    """The chosen option index per item, the total bytes and cost, and the multiplier the relaxation stopped at."""

    choice: tuple[int, ...]
    bytes: int
    cost: float
    lam: float


def lower_hull(options: Sequence[Option]) -> list[int]:
    """Indices of the options on the lower convex hull of (bytes, cost), by increasing bytes and strictly decreasing
    cost (dominated options and the points above the hull left out)."""
    order = sorted(range(len(options)), key=lambda i: (options[i][0], options[i][1], i))
    pts: list[int] = []
    for i in order:
        b, c = options[i]
        if pts and options[pts[-1]][0] == b:
            continue  # same bytes, higher (or equal) cost
        if pts and c >= options[pts[-1]][1]:
            continue  # more bytes for no less cost: dominated
        while len(pts) >= 2:
            (b1, c1), (b2, c2) = options[pts[-2]], options[pts[-1]]
            # pts[-1] is above the segment pts[-2] -> i (or on it): not a hull vertex
            if (c2 - c1) * (b - b1) >= (c - c1) * (b2 - b1):
                pts.pop()
            else:
                break
        pts.append(i)
    return pts


def _check(items: Sequence[Sequence[Option]]) -> None:
    for k, opts in enumerate(items):
        if not opts:
            raise ValueError(f"item {k} has no option")
        for b, c in opts:
            if isinstance(b, bool) or int(b) != b or b < 0:
                raise ValueError(f"item {k}: bytes must be a non-negative integer, got {b!r}")
            if not math.isfinite(c):
                raise ValueError(f"item {k}: cost must be finite, got {c!r}")


def _at(hulls: list[list[int]], items: Sequence[Sequence[Option]], lam: float) -> list[int]:
    """Each item's hull point minimising cost + lam * bytes (ties to fewer bytes)."""
    out = []
    for hull, opts in zip(hulls, items, strict=True):
        best = min(hull, key=lambda i: (opts[i][1] + lam * opts[i][0], opts[i][0]))
        out.append(best)
    return out


def solve(items: Sequence[Sequence[Option]], budget: int) -> Solution:
    """The options (one per item) of least total cost whose bytes add up to at most ``budget``; raises
    :class:`BudgetError` when even the smallest options do not fit."""
    _check(items)
    smallest = sum(min(b for b, _ in opts) for opts in items)
    if budget < smallest:
        raise BudgetError(f"the budget of {budget:,} bytes is below the smallest mix ({smallest:,} bytes)")
    hulls = [lower_hull(opts) for opts in items]
    # the slopes at which some item moves between neighbouring hull points: the only λ where the choice changes
    slopes = sorted({(items[k][h[j]][1] - items[k][h[j + 1]][1]) / (items[k][h[j + 1]][0] - items[k][h[j]][0])
                     for k, h in enumerate(hulls) for j in range(len(h) - 1)})

    def total(ch: list[int]) -> int:
        return sum(items[k][i][0] for k, i in enumerate(ch))

    # λ just above a slope leaves that step untaken; bisect for the smallest candidate λ whose choice fits
    cands = [0.0] + [math.nextafter(s, math.inf) for s in slopes]
    lo, hi = 0, len(cands) - 1  # cands[hi] picks every hull's first point (the fewest bytes): it fits
    if total(_at(hulls, items, cands[0])) <= budget:
        hi = 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if total(_at(hulls, items, cands[mid])) <= budget:
            hi = mid
        else:
            lo = mid
    lam = cands[hi]
    choice = _at(hulls, items, lam)
    used = total(choice)
    # leftover bytes: the best saving per byte among the moves that still fit, until none is left
    while True:
        best: tuple[float, int, int] | None = None
        for k, opts in enumerate(items):
            b0, c0 = opts[choice[k]]
            for i, (b, c) in enumerate(opts):
                if c >= c0 or used - b0 + b > budget:
                    continue
                gain = (c0 - c) / (b - b0) if b > b0 else math.inf
                if best is None or gain > best[0]:
                    best = (gain, k, i)
        if best is None:
            break
        _, k, i = best
        used += items[k][i][0] - items[k][choice[k]][0]
        choice[k] = i
    cost = math.fsum(items[k][i][1] for k, i in enumerate(choice))
    return Solution(tuple(choice), used, cost, lam)
