"""diag compare on real gloo DDP jobs (tests/compare/compare_job.py, CPU): the same job run twice (four pairs),
one knob turned at a time (a slow data loader, a larger model, tiny DDP buckets), and 1, 2 and 4 ranks.

This machine has 2 cores shared with other work, and its load moves a job's step time by up to 30% from one
run to the next, the fastest steps too (benchmarks/bench_compare_noise.py; docs/compare.md, "Noise"). A
comparison of two runs can only tell that from a change in the job beyond the run-to-run noise measured for such
runs and what the runs vary by within themselves (the verdict's noise floor), so each pair compared here runs at the same time, sharing the machine's conditions,
as an A/B comparison on a shared machine should, with rank r of both jobs pinned to the same core (at a load
average of 16, unpinned pairs of the same job still read a 12% change once; pinned, four pairs moved their
medians by 3% at most). The 1-, 2- and 4-rank runs run one after the other (running them together would
change the efficiency being measured)."""

from __future__ import annotations

import re

import pytest

from diag.analysis.compare import RUN_NOISE_PCT
from tests.compare.helpers import compare_json, group, row, run_job, run_together

pytestmark = pytest.mark.slow

BASE = ("--steps", "60", "--width", "128", "--depth", "8", "--batch", "64")
PAIRS = 4  # two started base first, two new first: the order's bias cancels


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("compare-runs")


def _pair(root, name: str, *args: str, variant_first: bool = False):
    """The base job and a variant, run together; their trace directories. ``variant_first``: the variant's
    ranks are started first."""
    base, variant = root / f"{name}-base", root / name
    jobs = [(base, 2, BASE), (variant, 2, args)]
    run_together(*(reversed(jobs) if variant_first else jobs))
    return base, variant


@pytest.fixture(scope="module")
def same_job_pairs(root):
    """Four pairs, in alternating start order: the job started second also ends second, its last steps run
    with the machine to itself, and its steady (lower-decile) step time is the faster for it. A bias the same
    in every pair reads as a change of the job in the pairs' interval (three pairs all started base first once
    read -2.4% [-4.0%, -0.8%], an "improvement")."""
    return [_pair(root, f"again{i}", *BASE, variant_first=i % 2 == 1) for i in range(PAIRS)]


def test_the_same_job_run_twice_reads_no_change(same_job_pairs):
    """At the default threshold and run-to-run noise (measured for CPU runs, RUN_NOISE_PCT): what differs
    between two runs of the same job that is not the job stays under the noise floor (pinned and run together,
    one pair in twelve read a 12% change with only the runs' own drift in the floor: one job's ranks kept in step
    with each other better than the other's)."""
    floors = []
    for base, again in same_job_pairs:
        data = compare_json(base, again)
        st = data["step_time"]
        floors.append((round(st["steady_change_pct"], 1), round(st["noise_floor_pct"] or 0.0, 1)))
        assert data["verdict"] == "no change", data["summary"]
        # 60 steps at the default calibrate_every: one calibration interval a run, so the steps are scaled by it
        # and the floor is the uncalibrated one (the intervals' levels need at least MIN_LEVELS intervals)
        assert st["threshold_pct"] == 2.0 and st["run_noise_pct"] == RUN_NOISE_PCT["cpu"]
        assert st["machine"] is not None and st["machine"]["statistic"] == "steady step time"
        assert data["config_differences"] == []
        assert all(a["share_pct"] is None for a in data["attribution"])
    print("same-job steady change and noise floor (%):", floors)


def test_the_same_job_as_interleaved_repeats_reads_no_change(same_job_pairs):
    """The pairs as BASE NEW BASE NEW ... --interleaved: the verdict from the pairs' own spread, a change only
    when their whole interval lies beyond the threshold (with the interval alone, three pairs of the same job
    read a change in 2 of 18 runs of this test, a +3.3% [+1.2%, +5.5%] "regression" in CI once).

    At 5%, not the default 2%: the two jobs of a pair, run side by side and pinned alike, are not quite alike,
    and the difference holds for a whole session of this test, whichever job starts first (once -3.0%, -3.7%,
    -2.6% and -3.7% in its four pairs). That is the harness's, not the job's, and no spread of the pairs shows
    it; a user's repeats, made one after the other, do not share it."""
    data = compare_json(
        *[path for pair in same_job_pairs for path in pair], extra=("--interleaved", "--threshold-pct", "5")
    )
    repeats = data["step_time"]["repeats"]
    assert data["verdict"] == "no change", data["summary"]
    assert repeats["pairs"] == PAIRS and len(repeats["changes_pct"]) == PAIRS
    print("same job, interleaved: per pair", [round(c, 1) for c in repeats["changes_pct"]], repeats["ci_pct"])


def test_a_slow_data_loader_reads_a_regression_in_data_wait(root):
    data = compare_json(*_pair(root, "data", *BASE, "--data-sleep-ms", "8"))
    assert data["verdict"] == "regression", data["summary"]
    top = data["attribution"][0]
    assert top["component"] == "data_wait"
    assert top["delta_ms"] == pytest.approx(8.0, abs=2.5)  # the loader sleeps 8 ms a batch
    assert top["share_pct"] > 25  # of a median that the machine's load moves too
    assert "data_loading" in [f["kind"] for f in data["findings_added"]]
    assert data["config_differences"] == []


def test_a_larger_model_reads_a_regression_in_compute(root):
    # 16x the parameters: 16x the compute and 16x the gradients to all-reduce. Which grows more depends on the
    # batch (compute per byte of gradient): at 64 samples the all_reduce of 8 MiB on gloo sometimes outgrew the
    # compute on this loaded machine; at 256 the compute grows 5-8x as much
    base, wide = root / "large-base", root / "large"
    batch = ("--steps", "40", "--depth", "8", "--batch", "256")
    run_together((base, 2, (*batch, "--width", "128")), (wide, 2, (*batch, "--width", "512")))
    data = compare_json(base, wide)
    assert data["verdict"] == "regression", data["summary"]
    assert data["config_differences"][0]["key"] == "flops_per_step"
    assert data["config_differences"][0]["new"] > 10 * data["config_differences"][0]["base"]
    assert data["groups"][0]["group"] == "compute"
    assert group(data, "compute")["delta_ms"] > 2 * group(data, "communication")["delta_ms"]
    assert row(data, "backward")["delta_ms"] > 0 and row(data, "forward")["delta_ms"] > 0


def test_tiny_ddp_buckets_read_a_regression_in_exposed_all_reduce(root):
    data = compare_json(*_pair(root, "tiny-buckets", *BASE, "--bucket-cap-mb", "0.0001"))
    assert data["verdict"] == "regression", data["summary"]
    # latency-bound buckets finish after the backward pass: the exposed all_reduce grows most (the backward,
    # sharing 2 cores with gloo's threads while they run, grows too)
    assert data["groups"][0]["group"] == "communication"
    assert row(data, "exposed_comm:all_reduce@0")["delta_ms"] > 1.0  # ms per step
    calls = {key: sum(r[f"{key}_count"] for r in data["busbw"] if r["op"] == "all_reduce") for key in ("base", "new")}
    assert calls["new"] >= 5 * calls["base"]  # one bucket a step became one per gradient tensor


def test_one_two_and_four_ranks_give_scaling_efficiency_and_what_grew(root):
    runs = [root / f"ranks{world}" for world in (1, 2, 4)]
    for path, world in zip(runs, (1, 2, 4), strict=True):
        run_job(path, world, *BASE)
    data = compare_json(*runs)
    scaling = data["scaling"]
    assert (scaling["kind"], scaling["unit"], scaling["baseline"]) == ("weak", "samples", "ranks1")
    by_world = {r["world_size"]: r for r in scaling["runs"]}
    assert by_world[1]["efficiency_pct"] == pytest.approx(100.0)
    assert 10 < by_world[4]["efficiency_pct"] < 100  # about 55% here; 2 ranks about 75%, but the load on this
    assert 10 < by_world[2]["efficiency_pct"] < 115  # machine moves the 1-rank reference by 10-15% too
    for world in (2, 4):
        run = by_world[world]
        assert run["speedup"] == pytest.approx(world * run["efficiency_pct"] / 100, rel=1e-6)
        assert run["loss_ms"] == pytest.approx(run["step_s"] * 1e3 * (1 - run["efficiency_pct"] / 100), rel=1e-6)
    # with more ranks, what grows is communication and waiting for the slowest rank, not the model's compute
    grew = {g["component"]: g["ms"] for g in by_world[4]["grew"]}
    scale_bound = grew.get("exposed_comm:all_reduce@0", 0) + grew.get("straggler", 0)
    compute = sum(grew.get(k, 0) for k in ("forward", "backward", "optimizer"))
    assert scale_bound > 0.5 * by_world[4]["loss_ms"] and scale_bound > compute
    assert re.fullmatch(
        r"\d+% efficient at 4 ranks \(against 1\); the loss \(\d+\.\d ms/step\) is \d+% .+", by_world[4]["summary"]
    )
    assert [d["key"] for d in data["comparisons"][1]["config_differences"]][:2] == ["world_size", "parallel"]
    print("scaling:", [r["summary"] for r in scaling["runs"] if r["summary"]])
