"""The analysis engine (diag.analysis.engine): any batching and any order of the ranks combine to the result of
all of them mapped at once, through both stages of a staged analysis (health), and the runner's reads of the
ranks' files give the loaded trace's result.

Floats are compared to 1e-9 relative (tests/analysis/golden.differences): pandas averages a lone rank's
readings with another summation than a group of ranks', which differs in the last digit."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from diag.analysis import engine
from diag.analysis.health import HealthAnalysis
from diag.analysis.memory import DeviceTotals, MemoryAnalysis
from diag.analysis.report import telemetry_bounds
from diag.analysis.section import json_safe
from diag.analysis.telemetry import TelemetryAnalysis
from diag.analysis.window import choose_window, select
from diag.testing import synthetic
from diag.trace.loader import load
from tests.analysis.golden import differences
from tests.analysis.helpers import engine_read_equals_loaded

RANKS = 8
CPU_RANKS = (5, 6)  # ranks without allocator readings: a shard of only them follows the RSS instead


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """A small run with a planted leak and throttled GPU, two of its ranks without CUDA allocator readings, and
    its loss, gradient norms and fingerprints with a spike, a departing rank and a diverged replica."""
    path = tmp_path_factory.mktemp("engine")
    synthetic.generate(path, RANKS, 30, 2, synthetic.Plants.with_health(RANKS, 30), trace_format=2)
    trace = load(path)
    cpu = trace.memory["rank"].isin(CPU_RANKS)
    trace.memory.loc[cpu, "allocated_bytes"] = None
    window = choose_window(trace.steps, None, set())
    bounds = telemetry_bounds(select(trace.steps, window))
    analyses = (
        TelemetryAnalysis({r: f"host{r // 4}" for r in range(RANKS)}),
        MemoryAnalysis(window),
        DeviceTotals(),
        HealthAnalysis.of(trace.events, trace.manifests),
    )
    whole = _whole(trace, bounds, analyses)
    health = whole[3]
    assert health["spikes"] and health["departures"] and health["divergence"]  # every stage-2 path is taken
    return path, trace, window, bounds, analyses, whole


def _shard(trace, bounds, ranks) -> engine.Shard:
    tables = {
        name: frame[frame["rank"].isin(ranks)]
        for name, frame in (("memory", trace.memory), ("telemetry", trace.telemetry), ("steps", trace.steps))
    }
    return engine.Shard(tables, engine.window_us_of(bounds[bounds.index.isin(ranks)]))


def _whole(trace, bounds, analyses) -> list:
    return json_safe(engine.run_loaded(analyses, _shard(trace, bounds, list(range(RANKS)))))


@st.composite
def batchings(draw):
    """The ranks in any order, cut into batches anywhere, and the batches' partials combined in any tree; for
    stage 2, the ranks in another order and its partials combined in another tree."""
    order = draw(st.permutations(list(range(RANKS))))
    cuts = sorted(draw(st.sets(st.integers(1, RANKS - 1), max_size=RANKS - 1)))
    batches = [order[a:b] for a, b in zip([0, *cuts], [*cuts, RANKS])]
    merges = draw(st.lists(st.integers(0, RANKS), min_size=RANKS, max_size=RANKS))
    second_order = draw(st.permutations(list(range(RANKS))))
    return batches, merges, second_order


def _any_tree(partials: list, merges: list[int], combine):
    """The partials combined two neighbours at a time, chosen by the draw: every tree shape is reachable."""
    while len(partials) > 1:
        i = merges[len(partials) - 1] % (len(partials) - 1)
        partials[i : i + 2] = [combine(partials[i], partials[i + 1])]
    return partials[0]


def _batched(trace, bounds, analyses, batching) -> list:
    """The Plan's result with the ranks mapped in the drawn batches, combined in the drawn tree, and stage 2 run
    over them in another order and combined in another tree."""
    batches, merges, second_order = batching
    plan = engine.Plan(analyses)
    kept, partials = {}, []
    for batch in batches:
        batch_kept, partial = plan.map(_shard(trace, bounds, batch))
        kept.update(batch_kept)
        partials.append((partial, engine.ReadNotes()))
    state, broadcasts = plan.between(_any_tree(partials, merges, plan.combine))
    seconds = [plan.second(kept[rank], broadcasts) for rank in second_order if rank in kept]
    results, _ = plan.finish(state, _any_tree(seconds, merges[::-1], plan.combine2))
    return json_safe(results)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batchings())
def test_any_batching_and_order_of_ranks_combine_to_the_same_result(loaded, batching):
    _, trace, _, bounds, analyses, whole = loaded
    assert differences(whole, _batched(trace, bounds, analyses, batching)) == []


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batchings())
def test_steps_held_to_a_resolution_combine_alike_in_any_batching(loaded, monkeypatch, batching):
    """Above EXACT_VALUES_PER_STEP ranks a step's values are held to a resolution: which steps, and how, does not
    depend on how the ranks were batched (here above 3 ranks: every step)."""
    from diag.analysis import step_values

    _, trace, _, bounds, analyses, _ = loaded
    monkeypatch.setattr(step_values, "EXACT_VALUES_PER_STEP", 3)
    whole = _whole(trace, bounds, analyses)
    assert whole[3]["departures"] and whole[3]["divergence"]
    assert differences(whole, _batched(trace, bounds, analyses, batching)) == []


def test_a_shard_of_ranks_without_allocator_readings_takes_the_runs_metric(loaded):
    """Mapped alone, the CPU ranks would follow their RSS; combined with the others, the run's metric is the
    allocated bytes and their growth figures are those of a rank without such readings."""
    _, trace, _, bounds, analyses, _ = loaded
    memory = engine.run_loaded([analyses[1]], _shard(trace, bounds, list(range(RANKS))))[0]
    cpu = [r for r in memory.per_rank if r.rank in CPU_RANKS]
    assert cpu and all(r.metric == "allocated_bytes" and r.growth_bytes_per_step is None for r in cpu)
    alone = engine.run_loaded([analyses[1]], _shard(trace, bounds, list(CPU_RANKS)))[0]
    assert {r.metric for r in alone.per_rank} == {"rss_bytes"}


@pytest.mark.parametrize("batch_ranks", [1, 3, 64])
def test_ranks_read_from_their_files_give_the_loaded_result(tmp_path, monkeypatch, batch_ranks):
    """The runner reads each rank with the loader's per-rank read, a few ranks at a time: the result is the
    loaded trace's (in worker processes: tests/integration/analysis/test_engine_workers.py)."""
    engine_read_equals_loaded(tmp_path, monkeypatch, batch_ranks, workers=1)
