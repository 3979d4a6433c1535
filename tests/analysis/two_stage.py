"""A small exact two-stage analysis and a comparable form of the collectives' result, for the tests of
``engine.run_two_stage`` inline (tests/unit/analysis/test_two_stage.py), in worker processes and on Dask."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from diag.analysis import engine


@dataclass
class Kept:
    rank: int
    nbytes: int


@dataclass
class SpreadAnalysis:
    """Stage 1: each rank's value (rank * 7 % 11) summed and counted, the rank's state kept; between: the total
    and count broadcast; stage 2: each rank's squared distance from the mean, times the count (an integer)."""

    reads: Counter

    def first(self, sources):
        self.reads.update(s.rank for s in sources)
        return [Kept(s.rank, 10 + s.rank) for s in sources], (sum(s.rank * 7 % 11 for s in sources), len(sources))

    def combine(self, *partials):
        return sum(p[0] for p in partials), sum(p[1] for p in partials)

    def between(self, partial):
        return partial, partial

    def second(self, kept, broadcast):
        total, count = broadcast
        return [(kept.rank, (count * (kept.rank * 7 % 11) - total) ** 2)]

    def combine2(self, *partials):
        return [row for p in partials for row in p]

    def finish(self, state, rows):
        return state, rows


def sources_of(ranks) -> list[engine.RankSource]:
    return [engine.RankSource("", r, "", None) for r in ranks]


def expected_spread(ranks: list[int]):
    total, count = sum(r * 7 % 11 for r in ranks), len(ranks)
    return (total, count), [(r, (count * (r * 7 % 11) - total) ** 2) for r in ranks]


def comparable(result) -> tuple:
    sums, inst, notes = result
    inst = inst.sort_values(["pg", "seq"]).reset_index(drop=True)
    cells = {rank: (steps.tolist(), np.round(waits, 6).tolist()) for rank, steps, waits in sums.step_cells}
    groups = {
        k: (g.count, g.rows, round(g.wait_sum_us, 6), g.durations.values.tolist(), g.durations.counts.tolist())
        for k, g in sums.groups.items()
    }
    skipped = sorted(notes.skipped, key=lambda note: note[0])
    return inst, cells, sums.arrivals, sums.members, groups, (skipped, notes.dropped, notes.rows_read)
