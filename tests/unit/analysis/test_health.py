"""Training health: real DDP jobs (gloo, 3 ranks) that record their loss and gradient norm, each with one
planted fault, are named at the right rank and step; a healthy one has no health finding; and the rules on
numbers made to test them."""

from __future__ import annotations

import numpy as np
import pandas as pd

from diag.analysis.health import _cluster_of, analyze_health
from diag.trace.manifest import Manifest

WORLD, STEPS, PLANT_RANK, PLANT_STEP = 3, 30, 1, 17


def steps_frame(values: dict[int, list[float]], name: str = "loss") -> pd.DataFrame:
    rows = [
        {"rank": r, "step": s, "loss": np.nan, "grad_norm": np.nan, "param_fingerprint": np.nan, name: v}
        for r, series in values.items()
        for s, v in enumerate(series)
    ]
    return pd.DataFrame(rows)


def test_a_noisy_but_steady_loss_has_no_spike_and_a_jump_has_one():
    rng = np.random.default_rng(0)
    noisy = list(2.0 + 0.05 * rng.standard_normal(60))
    assert analyze_health(steps_frame({0: noisy}), pd.DataFrame(), {}).spikes == []
    noisy[40] = 4.0
    (spike,) = analyze_health(steps_frame({0: noisy}), pd.DataFrame(), {}).spikes
    assert (spike.step, spike.ranks) == (40, [0])


def test_a_rank_whose_gradient_norm_departs_from_its_peers_is_named():
    equal = [1.0 + 0.1 * i for i in range(20)]
    frame = steps_frame({0: equal, 1: equal, 2: [v * 1.5 for v in equal], 3: equal}, "grad_norm")
    (departure,) = analyze_health(frame, pd.DataFrame(), {}).departures
    assert (departure.rank, departure.value_name) == (2, "grad_norm")


def test_fingerprints_are_compared_within_each_replica_group_only():
    frame = steps_frame({0: [1.0] * 5, 1: [1.0] * 5, 2: [7.0] * 5, 3: [7.0] * 5}, "param_fingerprint")
    groups = {0: "a", 1: "a", 2: "b", 3: "b"}  # two tensor-parallel shards, each replicated twice
    manifests = {r: Manifest(r, replica_group=g) for r, g in groups.items()}
    report = analyze_health(frame, pd.DataFrame(), manifests)
    assert report.divergence is None and report.fingerprint_steps == 10
    assert _cluster_of(np.array([1.0, 1.0 + 1e-12, 1.5])).tolist() == [0, 0, 1]


def test_more_ranks_than_held_exactly_name_the_same_ranks_to_the_resolution(tmp_path, monkeypatch):
    """Above EXACT_VALUES_PER_STEP ranks a step's values are held to VALUE_RESOLUTION: the same spike,
    departing rank and divergence, and medians that close to the exact ones."""
    from diag.analysis import step_values
    from diag.testing import synthetic
    from diag.trace.loader import load

    synthetic.generate(tmp_path, 12, 40, 2, synthetic.Plants.with_health(12, 40), trace_format=2)
    trace = load(tmp_path)
    exact = analyze_health(trace.steps, trace.events, trace.manifests)
    monkeypatch.setattr(step_values, "EXACT_VALUES_PER_STEP", 4)
    held = analyze_health(trace.steps, trace.events, trace.manifests)
    assert exact.departures and exact.spikes and exact.divergence
    assert [(d.rank, d.value_name) for d in held.departures] == [(d.rank, d.value_name) for d in exact.departures]
    assert [s.step for s in held.spikes] == [s.step for s in exact.spikes] and held.divergence == exact.divergence
    for a, b in zip(exact.per_step, held.per_step, strict=True):
        assert abs(b["loss_median"] / a["loss_median"] - 1) <= step_values.VALUE_RESOLUTION
    assert abs(held.departures[0].peers_median / exact.departures[0].peers_median - 1) <= step_values.VALUE_RESOLUTION


def test_a_value_every_rank_shares_stays_exact_above_the_ranks_held_exactly(monkeypatch):
    """Past EXACT_VALUES_PER_STEP ranks, a step whose values all agree (a gradient norm after the all-reduce) is
    not resolved: its median is the value itself; a step of differing losses is."""
    from diag.analysis import step_values

    monkeypatch.setattr(step_values, "EXACT_VALUES_PER_STEP", 4)
    shared = 1.2345678901234567
    frame = steps_frame({r: [2.0 + 0.01 * r + 0.001 * s for s in range(10)] for r in range(6)})
    frame["grad_norm"] = shared
    (first, *_) = analyze_health(frame, pd.DataFrame(), {}).per_step
    assert first["grad_norm_median"] == shared
    assert first["loss_median"] != 2.025 and abs(first["loss_median"] / 2.025 - 1) <= step_values.VALUE_RESOLUTION


def test_steps_loaded_without_the_health_columns_read_as_nothing_recorded():
    """The dashboard's preliminary report of a many-rank trace, whose steps were loaded without them."""
    frame = pd.DataFrame({"rank": [0, 0, 1], "step": [0, 1, 0], "duration_us": [5, 6, 7]})
    report = analyze_health(frame, pd.DataFrame(), {})
    assert not report.recorded and report.note and report.per_step == []
