"""The byte-budget solver (core/quant/budget.py) against brute force on small random instances."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from quantscope.core.quant.budget import BudgetError, lower_hull, solve


def _instance(rng: random.Random, n_items: int, n_opts: int) -> list[list[tuple[int, float]]]:
    items = []
    for _ in range(n_items):
        bs = sorted(rng.sample(range(1, 200), n_opts))
        # costs mostly falling with bytes, with some noise so that dominated and non-convex options occur
        c = rng.uniform(5, 50)
        opts = []
        for b in bs:
            opts.append((b, max(0.0, c)))
            c = c * rng.uniform(0.2, 1.05)
        rng.shuffle(opts)
        items.append(opts)
    return items


def _brute(items: list[list[tuple[int, float]]], budget: int) -> float:
    best = math.inf
    for ch in itertools.product(*(range(len(o)) for o in items)):
        b = sum(items[k][i][0] for k, i in enumerate(ch))
        if b <= budget:
            best = min(best, math.fsum(items[k][i][1] for k, i in enumerate(ch)))
    return best


def _hull_totals(items: list[list[tuple[int, float]]]) -> list[int]:
    """Total bytes of the choices the relaxation can make exactly: every λ's choice."""
    segs = []
    for opts in items:
        h = lower_hull(opts)
        for j in range(len(h) - 1):
            (b0, c0), (b1, c1) = opts[h[j]], opts[h[j + 1]]
            segs.append(((c0 - c1) / (b1 - b0), b1 - b0))
    base = sum(opts[lower_hull(opts)[0]][0] for opts in items)
    totals = [base]
    for _, db in sorted(segs, reverse=True):
        totals.append(totals[-1] + db)
    return totals


def test_lower_hull_drops_dominated_and_non_convex_points() -> None:
    opts = [(10, 5.0), (20, 3.0), (30, 2.9), (40, 0.5), (25, 6.0), (20, 4.0)]
    # (30, 2.9) lies above the segment (20, 3) -> (40, 0.5); (25, 6) and (20, 4) are dominated
    assert lower_hull(opts) == [0, 1, 3]


@pytest.mark.parametrize("seed", range(40))
def test_optimal_at_every_breakpoint_and_never_over_budget(seed: int) -> None:
    rng = random.Random(seed)
    items = _instance(rng, rng.randint(2, 5), rng.randint(2, 4))
    lo = sum(min(b for b, _ in o) for o in items)
    hi = sum(max(b for b, _ in o) for o in items)
    for budget in _hull_totals(items):
        s = solve(items, budget)
        assert s.bytes <= budget
        assert s.cost == pytest.approx(_brute(items, budget), rel=1e-9, abs=1e-12)
    for budget in range(lo, hi + 1, max(1, (hi - lo) // 25)):
        s = solve(items, budget)
        assert s.bytes == sum(items[k][i][0] for k, i in enumerate(s.choice)) <= budget
        opt = _brute(items, budget)
        assert s.cost >= opt - 1e-9
        # between breakpoints the relaxation is within one hull step of the optimum (the duality gap)
        gap = max(max(c for _, c in o) - min(c for _, c in o) for o in items)
        assert s.cost <= opt + gap + 1e-9


@pytest.mark.parametrize("seed", range(20))
def test_cost_never_rises_with_the_budget(seed: int) -> None:
    rng = random.Random(1000 + seed)
    items = _instance(rng, rng.randint(2, 6), rng.randint(2, 5))
    lo = sum(min(b for b, _ in o) for o in items)
    hi = sum(max(b for b, _ in o) for o in items)
    prev = math.inf
    for budget in range(lo, hi + 2):
        s = solve(items, budget)
        assert s.cost <= prev + 1e-12, budget
        prev = s.cost


def test_budget_below_the_smallest_mix_is_refused() -> None:
    with pytest.raises(BudgetError, match="below the smallest mix"):
        solve([[(10, 1.0), (20, 0.5)], [(5, 2.0)]], 14)


def test_largest_budget_takes_the_least_cost() -> None:
    items = [[(10, 1.0), (20, 0.5), (30, 0.6)], [(5, 2.0), (9, 0.1)]]
    s = solve(items, 10**9)
    assert s.choice == (1, 1) and s.bytes == 29 and s.cost == pytest.approx(0.6)


@pytest.mark.parametrize("bad", [[[]], [[(-1, 1.0)]], [[(1.5, 1.0)]], [[(1, math.nan)]]])
def test_malformed_items_are_refused(bad: list) -> None:
    with pytest.raises(ValueError):
        solve(bad, 100)
