"""The comparison's statistics, attribution and scaling on constructed numbers, where the right answer is known."""

from __future__ import annotations

import json

import numpy as np
import pytest

from diag.analysis import compare as C
from diag.analysis.findings import Finding
from diag.views.compare import components_series, render_compare
from tests.compare.helpers import summary


def _steps(n: int, ms: float, spread: float, seed: int) -> np.ndarray:
    return ms + spread * np.random.default_rng(seed).standard_normal(n)


def test_two_samples_of_one_distribution_read_no_change():
    base, new = _steps(200, 100.0, 5.0, 1), _steps(200, 100.0, 5.0, 2)
    change = C.bootstrap_change(base, new, C.STEADY_QUANTILE)
    low, high = change.ci_pct
    assert low < 0 < high and high - low < 6
    assert C.significant(change, C.THRESHOLD_PCT) == 0
    assert C.bootstrap_change(base, new, C.STEADY_QUANTILE) == change  # fixed seed: the same answer every time


def test_a_five_percent_slowdown_is_found_with_an_interval_around_it():
    base, new = _steps(200, 100.0, 2.0, 1), _steps(200, 105.0, 2.0, 2)
    change = C.bootstrap_change(base, new, 0.5)
    assert change.change_pct == pytest.approx(5.0, abs=1.0)
    assert 2.5 < change.ci_pct[0] < 5.0 < change.ci_pct[1] < 7.5
    assert C.significant(change, C.THRESHOLD_PCT) == 1
    assert C.significant(C.bootstrap_change(new, base, 0.5), C.THRESHOLD_PCT) == -1


def test_a_change_under_the_practical_threshold_is_no_change():
    base, new = _steps(2000, 100.0, 0.2, 1), _steps(2000, 101.0, 0.2, 2)
    change = C.bootstrap_change(base, new, C.STEADY_QUANTILE)
    assert change.ci_pct[0] > 0  # real, but 1% is under the 2% threshold
    assert C.significant(change, C.THRESHOLD_PCT) == 0
    assert C.significant(change, 0.5) == 1


def test_interference_slowing_some_steps_moves_the_median_but_not_the_verdict():
    """Other load on the host adds time to some steps; the job's fastest steps keep their time."""
    rng = np.random.default_rng(3)
    base = _steps(60, 20.0, 0.3, 1)
    new = _steps(60, 20.0, 0.3, 2)
    slowed = rng.random(60) < 0.6
    new[slowed] *= 1.3
    base_run = summary("base", {"step_rest": base})
    new_run = summary("new", {"step_rest": new})
    comparison = C.compare_runs([base_run, new_run]).comparisons[0]
    assert comparison.step_time.change_pct > 10
    assert C.significant(C.bootstrap_change(base, new, 0.5), C.THRESHOLD_PCT) == 1
    assert comparison.verdict == "no change"
    assert any("median step moved" in n for n in comparison.notes)
    assert all(a.share_pct is None for a in comparison.attribution)  # no shares of a change that is not one


def test_too_few_steps_give_no_verdict():
    comparison = C.compare_runs([summary("a", {"forward": [10.0, 11.0]}), summary("b", {"forward": [20.0, 21.0]})])
    assert comparison.comparisons[0].verdict == "unknown"


def test_attribution_rows_add_up_to_the_change_of_the_median():
    n = 40
    base = {
        "data_wait": _steps(n, 1.0, 0.05, 1),
        "forward": _steps(n, 5.0, 0.1, 2),
        "backward": _steps(n, 9.0, 0.2, 3),
        "exposed_comm:all_reduce@0": _steps(n, 2.0, 0.1, 4),
    }
    new = dict(base)
    new["data_wait"] = base["data_wait"] + 8.0  # a slow loader: +8 ms a step
    report = C.compare_runs([summary("base", base), summary("new", new)])
    c = report.comparisons[0]
    assert c.verdict == "regression"
    top = c.attribution[0]
    assert (top.component, top.label) == ("data_wait", "data wait")
    assert top.delta_ms == pytest.approx(8.0, abs=0.3)
    assert top.share_pct == pytest.approx(100.0, abs=5.0)
    change_ms = (c.step_time.new_s - c.step_time.base_s) * 1e3
    assert sum(a.delta_ms for a in c.attribution) == pytest.approx(change_ms, abs=1e-9)
    assert sum(a.share_pct for a in c.attribution) == pytest.approx(100.0)
    assert next(a for a in c.attribution if a.component == "exposed_comm:all_reduce@0").label == (
        "exposed all_reduce (group 0)"
    )
    assert [g["group"] for g in c.groups][0] == "data"
    assert c.summary.startswith("regression: ") and "data wait +8" in c.summary


def test_a_faster_optimizer_reads_improvement_with_its_share():
    n = 40
    base = {"forward": _steps(n, 5.0, 0.1, 1), "optimizer": _steps(n, 6.0, 0.1, 2)}
    new = {"forward": _steps(n, 5.0, 0.1, 3), "optimizer": _steps(n, 2.0, 0.1, 4)}  # a fused optimizer
    c = C.compare_runs([summary("base", base), summary("new", new)]).comparisons[0]
    assert c.verdict == "improvement" and c.step_time.steady_change_pct == pytest.approx(-36.4, abs=3)
    top = c.attribution[0]
    assert top.component == "optimizer" and top.delta_ms == pytest.approx(-4.0, abs=0.2)
    assert top.share_pct == pytest.approx(100.0, abs=5.0)  # of a negative change: a positive share


def test_central_steps_are_those_nearest_the_median_even_when_slow_steps_skew_the_run():
    step_ms = np.array([10.0, 10.1, 10.2, 10.3, 10.4, 10.5, 10.6, 50.0, 60.0, 70.0, 80.0, 90.0])
    chosen = step_ms[C.central_steps(step_ms)]
    assert len(chosen) == C.CENTRAL_MIN_STEPS
    assert abs(chosen.mean() - np.median(step_ms)) < abs(step_ms.mean() - np.median(step_ms))
    assert 90.0 not in chosen and 10.0 not in chosen


def _scaling_runs(samples: list[float], comm_ms: list[float], compute_ms: list[float]):
    n = 30
    return [
        summary(
            f"w{world}",
            {
                "backward": _steps(n, compute, 0.01, world),
                "exposed_comm:all_reduce@0": _steps(n, comm, 0.01, 10 + world),
            },
            world=world,
            samples_per_step=s,
        )
        for world, s, comm, compute in zip([1, 2, 4], samples, comm_ms, compute_ms, strict=True)
    ]


def test_weak_scaling_efficiency_and_what_grew():
    runs = _scaling_runs([16, 32, 64], comm_ms=[0.0, 2.0, 5.0], compute_ms=[10.0, 10.0, 10.0])
    scaling = C.compare_runs(runs).scaling
    assert (scaling.kind, scaling.unit, scaling.baseline) == ("weak", "samples", "w1")
    effs = [r.efficiency_pct for r in scaling.runs]
    assert effs == pytest.approx([100.0, 100 * 10 / 12, 100 * 10 / 15], abs=0.5)
    four = scaling.runs[2]
    assert four.loss_ms == pytest.approx(5.0, abs=0.1)
    assert four.grew[0].component == "exposed_comm:all_reduce@0"
    assert four.grew[0].share_pct == pytest.approx(100.0, abs=2.0)
    assert four.summary.startswith(
        "67% efficient at 4 ranks (against 1); the loss (5.0 ms/step) is 100% exposed all_reduce"
    )
    assert four.speedup == pytest.approx(4 * 10 / 15, rel=0.01)


def test_strong_scaling_efficiency_against_the_ideal_step():
    runs = _scaling_runs([64, 64, 64], comm_ms=[0.0, 2.0, 2.0], compute_ms=[40.0, 20.0, 10.0])
    scaling = C.compare_runs(runs).scaling
    assert scaling.kind == "strong"
    two, four = scaling.runs[1], scaling.runs[2]
    assert two.efficiency_pct == pytest.approx(100 * 40 / 22 / 2, abs=0.5)
    assert four.ideal_step_s == pytest.approx(0.010, rel=0.01)
    assert four.loss_ms == pytest.approx(2.0, abs=0.1)
    assert four.grew[0].component == "exposed_comm:all_reduce@0" and four.grew[0].ms == pytest.approx(2.0, abs=0.1)


def test_scaling_without_samples_assumes_each_rank_does_the_same_work():
    runs = _scaling_runs([None, None, None], comm_ms=[0.0, 2.0, 5.0], compute_ms=[10.0, 10.0, 10.0])
    scaling = C.compare_runs(runs).scaling
    assert (scaling.kind, scaling.unit) == ("weak", "rank-steps")
    assert scaling.notes and [round(r.efficiency_pct) for r in scaling.runs] == [100, 83, 67]


def test_no_scaling_section_when_world_sizes_agree():
    a, b = summary("a", {"forward": _steps(20, 5, 0.1, 1)}), summary("b", {"forward": _steps(20, 5, 0.1, 2)})
    assert C.compare_runs([a, b]).scaling is None


def test_configuration_differences_are_listed_model_first():
    a = summary(
        "a", {"forward": _steps(20, 5, 0.1, 1)}, config={"flops_per_step": 1e9, "dtype": "float32", "device": "x"}
    )
    b = summary(
        "b", {"forward": _steps(20, 5, 0.1, 2)}, config={"flops_per_step": 4e9, "dtype": "bfloat16", "device": "x"}
    )
    diffs = C.compare_runs([a, b]).comparisons[0].config_differences
    assert diffs == [
        {"key": "flops_per_step", "base": 1e9, "new": 4e9},
        {"key": "dtype", "base": "float32", "new": "bfloat16"},
    ]


def _finding(kind: str, ranks: list[int]) -> Finding:
    return Finding(kind, "high", f"{kind} on {ranks}", ranks, 1.0, 0.01)


def test_findings_that_appeared_and_disappeared():
    a = summary("a", {"forward": _steps(20, 5, 0.1, 1)}, findings=[_finding("straggler", [1]), _finding("low_mfu", [])])
    b = summary("b", {"forward": _steps(20, 5, 0.1, 2)}, findings=[_finding("straggler", [3]), _finding("low_mfu", [])])
    c = C.compare_runs([a, b]).comparisons[0]
    assert [(f["kind"], f["ranks"]) for f in c.findings_added] == [("straggler", [3])]
    assert [(f["kind"], f["ranks"]) for f in c.findings_removed] == [("straggler", [1])]


def test_json_contract_and_every_view():
    runs = _scaling_runs([16, 32, 64], comm_ms=[0.0, 2.0, 5.0], compute_ms=[10.0, 10.0, 10.0])
    report = C.compare_runs(runs)
    data = json.loads(render_compare(report, "json"))
    for key in ("verdict", "step_time", "attribution", "scaling", "memory", "findings_added", "findings_removed"):
        assert key in data
    assert set(data["step_time"]) >= {"base_s", "new_s", "change_pct", "ci_pct"}
    assert set(data["attribution"][0]) >= {"component", "base_ms", "new_ms", "delta_ms"}
    assert data["verdict"] == data["comparisons"][0]["verdict"] and len(data["comparisons"]) == 2
    assert [r["world_size"] for r in data["runs"]] == [1, 2, 4] and data["scaling"]["kind"] == "weak"
    text = render_compare(report, "text")
    assert "Scaling" in text and "67% efficient at 4 ranks" in text and "Where the time went: w1 -> w4" in text
    assert "## Verdict: w1 -> w2" in render_compare(report, "markdown")
    page = render_compare(report, "html")
    assert page.count("plotly-graph-div") == 3 and '<script src="http' not in page
    labels, series = components_series(report)
    assert labels == ["w1", "w2", "w4"] and series["exposed all_reduce (group 0)"][0] == pytest.approx(0.0, abs=0.05)


def test_bootstrap_of_a_long_run_is_done_in_chunks(monkeypatch):
    monkeypatch.setattr(C, "MAX_BOOTSTRAP_CELLS", 100_000)
    base, new = _steps(20_000, 100.0, 3.0, 1), _steps(20_000, 103.0, 3.0, 2)
    change = C.bootstrap_change(base, new, 0.5, resamples=30)
    assert change.ci_pct[0] > 2.5 and change.change_pct == pytest.approx(3.0, abs=0.2)


def test_a_run_that_drifts_within_itself_has_a_noise_floor_a_steady_run_has_little():
    steady = _steps(60, 20.0, 0.2, 1)
    drifting = _steps(60, 20.0, 0.2, 2) * np.repeat([1.0, 1.15, 1.0, 1.15, 1.0, 1.15], 10)  # load comes and goes
    assert C.drift_pct(steady) < 1.5
    # windows alternate between two levels 15% apart: each 7.5% from their median, x 1.4826 (robust sd)
    assert C.drift_pct(drifting) == pytest.approx(100 * C.MAD_TO_SIGMA * 0.075, rel=0.2)
    stalled = steady.copy()
    stalled[20:30] *= 1.6  # one stretch of the run stalled: the floor does not follow it
    assert C.drift_pct(stalled) < 2 * C.drift_pct(steady) + 1.0
    assert C.noise_floor_pct(steady, drifting) == pytest.approx(
        C.NOISE_Z * np.hypot(C.drift_pct(steady), C.drift_pct(drifting))
    )
    assert C.drift_pct(steady[:10]) is None  # fewer than 3 windows of 5 steps: no estimate


def test_a_change_within_the_runs_own_drift_is_no_change_and_one_beyond_it_is_a_regression():
    """The second run's machine was 10% slower throughout: beyond its interval, but the runs themselves move
    their steady level by about 8% from one part to another, so it could be the machine."""
    shape = np.repeat([1.0, 1.08, 1.0, 1.08, 1.0, 1.08], 10)
    base = _steps(60, 20.0, 0.1, 1) * shape
    new = _steps(60, 22.0, 0.1, 2) * shape
    c = C.compare_runs([summary("base", {"step_rest": base}), summary("new", {"step_rest": new})]).comparisons[0]
    assert c.step_time.steady_ci_pct[0] > 2.0  # the interval alone would call it a regression
    assert c.step_time.noise_floor_pct > c.step_time.steady_change_pct
    assert c.verdict == "no change"
    assert c.step_time.within_noise and c.summary.startswith("no change (within noise)")
    assert any(n.startswith("within noise") for n in c.notes)
    slower = _steps(60, 30.0, 0.1, 3) * shape  # +50%: far beyond the floor
    c = C.compare_runs([summary("base", {"step_rest": base}), summary("new", {"step_rest": slower})]).comparisons[0]
    assert c.verdict == "regression"


def _cpu_run(label: str, ms: float, seed: int, n: int = 60, **components) -> object:
    """A run on a CPU (the kind of machine whose run-to-run noise was measured), steady within itself."""
    return summary(label, {"step_rest": _steps(n, ms, 0.1, seed), **components}, config={"device": "cpu"})


def test_a_whole_run_shifted_by_load_is_within_the_measured_run_to_run_noise():
    """The second run is 10% slower in every window (load that stayed for the whole run): no drift shows it, so
    only the run-to-run noise measured for CPU runs (RUN_NOISE_PCT) tells it from a change of the job."""
    base, new = _cpu_run("base", 20.0, 1), _cpu_run("new", 22.0, 2)
    c = C.compare_runs([base, new]).comparisons[0]
    s = c.step_time
    assert max(s.drift_pct) < 1.0 and s.steady_ci_pct[0] > 8  # the steps alone say +10%, sharply
    assert s.run_noise_pct == C.RUN_NOISE_PCT["cpu"] and s.run_noise_source == "measured default for cpu runs"
    assert s.noise_floor_pct == pytest.approx(C.NOISE_Z * np.sqrt(2) * C.RUN_NOISE_PCT["cpu"])
    assert (c.verdict, s.within_noise) == ("no change", True)
    assert all(a.share_pct is None for a in c.attribution)
    # on a machine known to be quiet the user says so, and the same runs read a regression
    quiet = C.compare_runs([base, new], run_noise_pct=1.0).comparisons[0]
    assert (quiet.verdict, quiet.step_time.run_noise_source, quiet.step_time.within_noise) == (
        "regression",
        "--run-noise-pct",
        False,
    )
    # a change beyond the floor is one whatever the machine
    assert C.compare_runs([base, _cpu_run("slow", 30.0, 3)]).comparisons[0].verdict == "regression"


def test_no_run_to_run_noise_is_assumed_where_none_was_measured():
    base = summary("base", {"step_rest": _steps(60, 20.0, 0.1, 1)}, config={"device": "NVIDIA H100 80GB HBM3"})
    new = summary("new", {"step_rest": _steps(60, 22.0, 0.1, 2)}, config={"device": "NVIDIA H100 80GB HBM3"})
    s = C.compare_runs([base, new]).comparisons[0].step_time
    assert (s.run_noise_pct, s.run_noise_source) == (0.0, "none measured for this kind of machine")
    assert C.compare_runs([base, new]).comparisons[0].verdict == "regression"
    mixed = C.default_run_noise_pct({"device": "cpu"}, {"device": "NVIDIA H100 80GB HBM3"})
    assert mixed == (0.0, "none measured for this kind of machine")


def test_repeats_read_a_change_only_when_their_whole_interval_is_beyond_the_threshold():
    """CI's three same-job pairs, run at the same time: +3.3% [+1.2%, +5.5%] is no change at the 2% threshold;
    the same interval moved past it is."""
    assert C.beyond_threshold(C.Change(20.0, 20.7, 3.3, [1.2, 5.5]), 2.0) == 0
    assert C.beyond_threshold(C.Change(20.0, 20.9, 4.5, [2.1, 7.0]), 2.0) == 1
    assert C.beyond_threshold(C.Change(20.0, 19.1, -4.7, [-8.2, -1.1]), 2.0) == 0
    assert C.beyond_threshold(C.Change(20.0, 18.9, -5.5, [-9.0, -2.1]), 2.0) == -1
    assert C.beyond_threshold(C.Change(20.0, None, None, None), 2.0) == 0


def test_interleaved_repeats_measure_the_noise_from_the_pairs():
    """BASE NEW BASE NEW ...: each pair's runs share their time's load; the pairs' spread is the noise."""
    load = [1.0, 1.12, 0.95, 1.08]  # the machine's load moves every pair's level alike
    same = [_cpu_run(f"{side}{i}", 20.0 * f, 2 * i + j) for i, f in enumerate(load) for j, side in enumerate("ab")]
    c = C.compare_runs(same, interleaved=True).comparisons[0]
    r = c.step_time.repeats
    assert r.pairs == 4 and r.ci_pct[0] < 0 < r.ci_pct[1] and abs(r.change_pct) < 1
    assert c.verdict == "no change" and c.step_time.noise_floor_pct is None
    assert c.step_time.run_noise_source == "measured by 4 pairs of repeats"
    assert (c.base, c.new) == ("a0 (+3 repeats)", "b0 (+3 repeats)") and c.step_time.steps_base == 4 * 60
    # a 25% slower new job, in every pair, although the load moved the pairs' levels by 17%
    slow = [_cpu_run(f"{side}{i}", 20.0 * f * (1.25 if side == "b" else 1.0), 2 * i + j)
            for i, f in enumerate(load) for j, side in enumerate("ab")]  # fmt: skip
    c = C.compare_runs(slow, interleaved=True).comparisons[0]
    assert c.verdict == "regression" and c.step_time.repeats.change_pct == pytest.approx(25.0, abs=1.0)
    assert c.step_time.repeats.ci_pct[0] > 20 and "over 4 pairs of repeats" in c.summary
    with pytest.raises(ValueError, match="pairs of runs"):
        C.compare_runs(slow[:3], interleaved=True)
    # a pair whose run has too few steps is left out; with fewer than 2 pairs left, no verdict
    short = [*slow[:2], _cpu_run("a9", 20.0, 9, n=2), _cpu_run("b9", 25.0, 10)]
    c = C.compare_runs(short, interleaved=True).comparisons[0]
    assert c.verdict == "unknown" and c.step_time.repeats is None and "fewer than 2 pairs" in c.notes[0]
    json.dumps(C.compare_runs(short, interleaved=True).to_dict(), allow_nan=False)
    assert C.compare_runs([*slow, *short[2:]], interleaved=True).comparisons[0].step_time.repeats.pairs == 4


def test_pooled_repeats_keep_every_step_and_fill_a_component_one_repeat_lacks():
    a = summary("a", {"step_rest": [10.0] * 5, "exposed_comm:all_reduce@0": [1.0] * 5})
    b = summary("b", {"step_rest": [12.0] * 4})
    pooled = C.pool_runs([a, b])
    assert pooled.step_ms == [11.0] * 5 + [12.0] * 4
    assert pooled.components_ms == {
        "step_rest": [10.0] * 5 + [12.0] * 4,
        "exposed_comm:all_reduce@0": [1.0] * 5 + [0.0] * 4,
    }


def test_the_html_view_plots_both_runs_loss_when_they_recorded_it():
    from diag.views.compare import loss_figure

    runs = [summary(name, {"step_rest": _steps(20, 10.0, 0.1, i)}) for i, name in enumerate(("base", "new"))]
    assert loss_figure(C.compare_runs(runs)) is None  # no loss recorded: no stability section, no figure
    curves = {"base": {s: 2.0 / (s + 1) for s in range(20)}, "new": {s: 2.5 / (s + 1) for s in range(20) if s != 7}}
    for run in runs:
        run.report.health.per_step = [
            {"step": s, "loss_median": v, "grad_norm_median": None} for s, v in curves[run.label].items()
        ]
    report = C.compare_runs(runs)
    assert report.comparisons[0].stability is not None
    fig = loss_figure(report)
    assert [t.name for t in fig.data] == ["base", "new"]
    for trace in fig.data:
        assert list(trace.x) == sorted(curves[trace.name]) and list(trace.y) == [curves[trace.name][s] for s in trace.x]
    assert json.loads(render_compare(report, "json"))["runs"][1]["loss_steps"] == sorted(curves["new"])
    assert "Loss per step" in render_compare(report, "html")


def _collective(op: str, pg: str, bucket: str, min_bytes: int, count: int, timed: int, busbw: float | None):
    from diag.analysis.comms import CollectiveStats

    return CollectiveStats(
        op, pg, bucket, min_bytes, 2, count, 2 * count, min_bytes * count, min_bytes, timed,
        None, None, None, None, None, busbw, 0.0, "durations", None,
    )  # fmt: skip


def test_bus_bandwidth_is_compared_per_op_and_size_class_weighted_by_timed_calls_over_groups():
    """One 4 MiB all_reduce a step became many 64 KiB ones (tiny DDP buckets): each size class is a row, with
    each run's bandwidth (timed-call weighted over process groups) and call count."""
    base = summary("base", {"step_rest": [10.0] * 5})
    new = summary("new", {"step_rest": [12.0] * 5})
    base.report.comms.collectives = [
        _collective("all_reduce", "0", "4-8 MiB", 4 << 20, 100, 100, 2.0),
        _collective("all_reduce", "1", "4-8 MiB", 4 << 20, 100, 50, 4.0),  # a second group, half of it timed
    ]
    new.report.comms.collectives = [
        _collective("all_reduce", "0", "4-8 MiB", 4 << 20, 10, 10, 1.5),
        _collective("all_reduce", "0", "64-128 KiB", 64 << 10, 6400, 6400, 0.2),
        _collective("broadcast", "0", "64-128 KiB", 64 << 10, 1, 0, None),  # never timed: a count, no bandwidth
    ]
    rows = {(r["op"], r["size_class"]): r for r in C.compare_runs([base, new]).comparisons[0].busbw}
    big = rows[("all_reduce", "4-8 MiB")]
    assert big["base_gbps"] == pytest.approx((2.0 * 100 + 4.0 * 50) / 150) and big["new_gbps"] == 1.5
    assert (big["base_count"], big["new_count"]) == (200, 10)
    assert big["change_pct"] == pytest.approx(100 * (1.5 - 8 / 3) / (8 / 3))
    small = rows[("all_reduce", "64-128 KiB")]
    assert (small["base_gbps"], small["new_gbps"], small["base_count"], small["new_count"]) == (None, 0.2, 0, 6400)
    assert rows[("broadcast", "64-128 KiB")]["new_gbps"] is None
    # ordered by op, then size class
    assert list(rows) == [("all_reduce", "64-128 KiB"), ("all_reduce", "4-8 MiB"), ("broadcast", "64-128 KiB")]


def test_the_scaling_line_names_a_component_that_grew_beyond_the_whole_loss_without_a_share_over_100():
    row = C.ScalingRun("r2", 2, 0.0102, None, None, None, 98.0, 0.01, 0.2)
    row.grew = [C.ScalingGrowth("straggler", C.LABELS["straggler"], 0.46, 230.0)]
    line = C._scaling_line(row, 1)
    assert line == (
        "98% efficient at 2 ranks (against 1); the loss (0.2 ms/step) is straggler loss (waiting for the slowest "
        "rank), which grew 0.5 ms/step while other parts shrank"
    )
    row.grew[0].share_pct = 70.0
    assert C._scaling_line(row, 1).endswith(
        "the loss (0.2 ms/step) is 70% straggler loss (waiting for the slowest rank)"
    )
