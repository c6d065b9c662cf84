"""The balanced cut of an op sequence into pipeline stages: the positions that minimize the most
expensive stage, where a stage pays for its ops and for what it sends to the next one.

Bisection on the bottleneck T: a greedy pass that ends each stage at the farthest allowed cut
keeping it within T decides whether T is reachable (ending a stage later never hurts the stages
after it). The pipeline_split pass cuts with it, and the planner prices thousands of plans with
it (up to thousands of stages on a graph of ten thousand ops), so the greedy pass has two forms
with the same arithmetic: stage by stage in Python for a few stages, and for many every start at
once in numpy, chained by doubling (log2(stages) array steps instead of a Python step per stage).

The greedy pass packs each stage to the bottleneck and leaves the last ones what remains; the cut
returned instead shares the slack out (each stage ending near an even share of what is left, where
what the cut sends is small), so the ranks of an interleaved schedule, each holding every pp-th
stage, get even sums too.
"""

from __future__ import annotations

import bisect

import numpy as np

_VECTOR_FROM = 48  # stages from which the numpy feasibility test is faster than the Python one
_EVEN_UP_TO = 512  # stages up to which the slack is shared out (`_Ends.even`: a pass over the rest per stage)


class _Ends:
    """The allowed stage ends of one sequence and what ending a stage at each costs."""

    def __init__(self, costs: np.ndarray, comm: np.ndarray, valid: np.ndarray) -> None:
        n = len(costs)
        prefix = np.concatenate([[0.0], np.cumsum(costs)])
        self.ends = np.array([k for k in range(1, n) if valid[k]] + [n], dtype=np.int64)
        self.at_end = prefix[self.ends]  # the sum of costs before each end
        cut_cost = np.where(self.ends < n, np.asarray(comm, dtype=np.float64)[np.minimum(self.ends, n - 1)], 0.0)
        # a stage from `start` may end at j when at_end[j] + cut_cost[j] <= start + T; the farthest such
        # j is the farthest j whose suffix minimum of that sum is within (the sum itself is not monotone)
        self.reach = np.minimum.accumulate((self.at_end + cut_cost)[::-1])[::-1]
        self.cost = self.at_end + cut_cost
        self.total = float(prefix[n])
        self.max_cut = float(cut_cost.max()) if len(cut_cost) else 0.0
        self._reach_list = self.reach.tolist()
        self._at_end_list = self.at_end.tolist()
        self._cost_list = self.cost.tolist()
        # where a stage starting after end i-1 begins its sum (0 for the first stage)
        self.base = np.concatenate([[0.0], self.at_end])

    def farthest(self, i: int, left: int, limit: float) -> int | None:
        """The farthest end a stage may take within `limit` when it starts after end i - 1 and `left` stages
        (itself among them) remain, leaving one end for each later stage; None when there is none."""
        start = self._at_end_list[i - 1] if i else 0.0
        cap = len(self._at_end_list) - left
        x = start + limit
        j = bisect.bisect_right(self._reach_list, x) - 1
        if j > cap:
            j = cap
            while j >= i and self._cost_list[j] > x:
                j -= 1
        return j if j >= i else None

    def greedy(self, stages: int, limit: float, i: int = 0) -> list[int] | None:
        """The farthest-reaching cut within `limit`, stage by stage; None when it cannot be reached.
        `i`: the first end the first stage may take (an earlier stage ended at end i - 1)."""
        cuts: list[int] = []
        for s in range(stages - 1):
            j = self.farthest(i, stages - s, limit)
            if j is None:
                return None
            cuts.append(int(self.ends[j]))
            i = j + 1
        return cuts if self.total <= (self._at_end_list[i - 1] if i else 0.0) + limit else None

    def even(self, stages: int, limit: float) -> list[int]:
        """Cuts within `limit` (a bottleneck `reachable` found) that share out its slack: each stage ends
        where the distance from an even share of what is left, plus what the cut sends, is least, among
        the ends within the limit from which the later stages still finish within it (else the farthest
        end, from which they always do). The bottleneck is the greedy's; the stages are as even as the ends
        allow, so a rank holding several stages (an interleaved schedule) holds its share, not full stages
        first and the remainder last, and a cut moves to where little is live when that is as even."""
        if stages > _EVEN_UP_TO:  # each choice is checked by a greedy pass over the stages after it
            found = self.greedy(stages, limit)
            assert found is not None, "a bottleneck found reachable is reachable"
            return found
        count = len(self._at_end_list)
        sends = self.cost - self.at_end
        cuts: list[int] = []
        i = 0
        for s in range(stages - 1):
            left = stages - s
            start = self._at_end_list[i - 1] if i else 0.0
            share = (self.total - start) / left
            target, slack = start + share, max(limit - share, 0.0)
            lo = max(i, bisect.bisect_left(self._at_end_list, target - slack))
            hi = min(count - left, bisect.bisect_right(self._at_end_list, target + slack) - 1)
            chosen = None
            if lo <= hi:
                window = slice(lo, hi + 1)
                score = np.where(self.cost[window] <= start + limit,
                                 np.abs(self.at_end[window] - target) + sends[window], np.inf)
                j = lo + int(np.argmin(score))
                if np.isfinite(score[j - lo]) and self.greedy(left - 1, limit, j + 1) is not None:
                    chosen = j
            if chosen is None:
                chosen = self.farthest(i, left, limit)
                assert chosen is not None, "a bottleneck found reachable is reachable"
            cuts.append(int(self.ends[chosen]))
            i = chosen + 1
        return cuts

    def reachable(self, stages: int, limit: float) -> bool:
        """Whether `greedy(stages, limit)` succeeds, every start at once: step[i] is where the stage after
        one starting at end i starts; its powers (doubling) walk the stages while they stay clear of the
        cap; where the cap binds, the stages after it hold one end each."""
        count = len(self.at_end)
        j = np.searchsorted(self.reach, self.base[:count] + limit, side="right") - 1
        beyond = count + 1  # no end within the limit, or past the last one: every later step stays there
        step = np.empty(count + 2, dtype=np.int64)
        step[:count] = np.where(j >= np.arange(count), j + 1, beyond)
        step[count] = step[beyond] = beyond
        powers = [step]
        while 2 ** len(powers) <= stages - 1:
            powers.append(powers[-1][powers[-1]])
        # the most stages the uncapped walk takes with every cut before the cap: position p after s stages
        # keeps p - s <= count - stages (p - s never decreases, so the first stage past it is found by halving)
        position, taken = 0, 0
        for k in range(len(powers) - 1, -1, -1):
            if taken + 2**k <= stages - 1:
                nxt = int(powers[k][position])
                if nxt - (taken + 2**k) <= count - stages:
                    position, taken = nxt, taken + 2**k
        if taken == stages - 1:
            return self.total <= float(self.base[position]) + limit
        if int(step[position]) == beyond and j[position] < position:
            return False  # stuck: no end within the limit from here
        cap = count - (stages - taken)
        x = float(self.base[position]) + limit
        end = cap
        while end >= position and self._cost_list[end] > x:
            end -= 1
        if end < position:
            return False
        if end < cap:  # rare: the cap binds and the cut lands before it; settle it stage by stage
            return self.greedy(stages, limit) is not None
        # from the cap on every stage holds one end: stage ending at end e starts after end e - 1
        rest = np.arange(cap + 1, count)
        return bool(np.all(self.cost[rest[:-1]] <= self.at_end[rest[:-1] - 1] + limit)) and \
            self.total <= float(self.at_end[count - 2]) + limit


def balanced_cuts(costs: np.ndarray, comm: np.ndarray, valid: np.ndarray, stages: int) -> list[int]:
    """Cut positions minimizing the most expensive stage, the slack below it shared out (`_Ends.even`).

    costs[i]: cost of node i; comm[k]: cost of sending across cut k; valid[k]: whether cut k is
    allowed (k in 1..n-1). Returns `stages - 1` positions."""
    ends = _Ends(np.asarray(costs, dtype=np.float64), comm, valid)
    feasible = ends.reachable if stages >= _VECTOR_FROM else (lambda s, t: ends.greedy(s, t) is not None)
    lo, hi = 0.0, ends.total + ends.max_cut
    for _ in range(100):
        mid = (lo + hi) / 2
        if feasible(stages, mid):
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-12 * max(hi, 1.0):
            break
    return ends.even(stages, hi)
