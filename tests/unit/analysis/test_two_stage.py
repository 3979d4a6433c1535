"""The engine's two-stage runner (``engine.run_two_stage``): any batching and order of the ranks, and any budget
for the states held between the stages, give the same result; beyond the budget a rank is read again. A small
exact analysis (integers: no float order to tolerate) shows the runner's contract; the collectives
(``collective_waits.Collectives``) on a small synthetic trace show the same of the real analysis."""

from __future__ import annotations

from collections import Counter

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from diag.analysis import engine
from diag.analysis.collective_waits import Collectives
from diag.analysis.partitioned import load_without_collectives
from diag.analysis.window import choose_window
from diag.testing import synthetic
from tests.analysis.two_stage import SpreadAnalysis, comparable, expected_spread, sources_of


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(st.integers(0, 500), unique=True, max_size=40),
    st.integers(1, 9),
    st.integers(0, 400),
)
def test_any_batching_order_and_budget_give_the_same_result(monkeypatch, ranks, batch, budget):
    monkeypatch.setattr(engine, "BATCH_RANKS", batch)
    monkeypatch.setattr(engine, "HELD_BYTES_MAX", budget)
    reads, ticks = Counter(), []
    result = engine.run_two_stage(SpreadAnalysis(reads), sources_of(ranks), progress=ticks.append)
    assert result == expected_spread(ranks)  # stage 2 in the sources' order
    held, fits = 0, set()
    for r in ranks:  # the runner holds the states in order while they fit, reads the others again
        if held + 10 + r <= budget:
            held += 10 + r
            fits.add(r)
    assert reads == Counter({r: 1 if r in fits else 2 for r in ranks})
    assert sum(ticks) == 2 * len(ranks)


@pytest.fixture(scope="module")
def collectives(tmp_path_factory):
    path = tmp_path_factory.mktemp("two_stage")
    synthetic.generate(path, 8, 30, 4, trace_format=2)
    trace = load_without_collectives(path)
    return Collectives(choose_window(trace.steps, None, set())), engine.rank_sources(trace)


@st.composite
def trees(draw, leaves: int):
    """Which neighbours a left-to-right reduction of ``leaves`` partials combines at each step."""
    return draw(st.lists(st.integers(0, leaves), min_size=leaves, max_size=leaves))


def _reduce(combine, partials: list, merges: list[int]):
    partials = list(partials)
    while len(partials) > 1:
        i = merges[len(partials) - 1] % (len(partials) - 1)
        partials[i : i + 2] = [combine(partials[i], partials[i + 1])]
    return partials[0]


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.permutations(list(range(8))), st.integers(1, 8), trees(8), trees(8))
def test_the_collectives_in_any_batches_order_and_tree_equal_the_inline_run(collectives, order, size, tree1, tree2):
    """Stage 1 on batches of the ranks in any order, the partials combined in any tree; stage 2 rank by rank,
    combined in any tree: the inline runner's result (float sums to 1e-6 us, the instances exactly)."""
    analysis, sources = collectives
    inline = comparable(engine.run_two_stage(analysis, sources))
    shuffled = [sources[i] for i in order]
    batches = [shuffled[i : i + size] for i in range(0, len(shuffled), size)]
    firsts = [analysis.first(batch) for batch in batches]
    state, match = analysis.between(_reduce(analysis.combine, [p for _, p in firsts], tree1))
    seconds = [analysis.second(part, match) for kept, _ in firsts for part in kept]
    got = comparable(analysis.finish(state, _reduce(analysis.combine2, seconds, tree2)))
    pd.testing.assert_frame_equal(inline[0], got[0])
    assert inline[1:] == got[1:]
