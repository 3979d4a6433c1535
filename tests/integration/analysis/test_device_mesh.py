"""Real 2-D device-mesh jobs (``init_device_mesh`` on gloo: dp=2 x tp=2, and dp=4 x tp=2;
tests/jobs/mesh_job.py): the report says which mesh dimension a slow rank holds up and where it sits, shows
communication per dimension, and triage names the dimension of the group a hung rank stalls first. Capture uses
no process group of its own (it must not deadlock on sub-meshes): the jobs finish, or hang only where the fault
is planted."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from diag.launch import run_ranks, start_ranks
from tests.analysis.helpers import cli_json
from tests.conftest import JOBS
from tests.triage.jobs import _end_all, _has_stall_dump, diag_triage_json

pytestmark = pytest.mark.slow
WORLD = 4  # dp=2 x tp=2: tp groups [0, 1] and [2, 3], dp groups [0, 2] and [1, 3]
BAD_RANK = 3  # at dp=1, tp=1
STALL_DEADLINE_S = 180  # every rank's stall dump, on a loaded box


def _run(tmp_path: Path, fault: str, world: int = WORLD, bad_rank: int = BAD_RANK) -> Path:
    results = run_ranks([str(JOBS / "mesh_job.py"), str(tmp_path), fault, str(bad_rank)], world, timeout_s=300)
    for result in results:
        assert result.returncode == 0, result.stderr[-3000:]
    return tmp_path


# (world, the slow rank, its tp group, where it sits, the mesh, groups of each dimension): dp=2 x tp=2, and
# dp=4 x tp=2 where its dp group holds four ranks
SLOW = [
    (WORLD, BAD_RANK, [2, 3], {"dp": 1, "tp": 1}, "dp=2 x tp=2", {"dp": 2, "tp": 2}),
    (8, 5, [4, 5], {"dp": 2, "tp": 1}, "dp=4 x tp=2", {"dp": 2, "tp": 4}),
]


@pytest.mark.parametrize(
    ("world", "bad_rank", "tp_group", "coords", "shape", "groups"), SLOW, ids=["4-ranks", "8-ranks"]
)
def test_slow_rank_named_with_its_coordinates_and_the_tp_group_it_stalls(
    tmp_path, world, bad_rank, tp_group, coords, shape, groups
):
    report = cli_json(_run(tmp_path, "slow", world, bad_rank))
    stragglers = [s for s in report["stragglers"] if s["persistent"]]
    assert [s["rank"] for s in stragglers] == [bad_rank], report["findings"]
    mesh = stragglers[0]["mesh"]
    assert mesh["coords"] == coords
    # its tp peer waits for it in every tensor-parallel collective; the dp groups see it only once it spread
    assert mesh["stalls_dim"] == "tp" and mesh["stalls_ranks"] == tp_group, mesh
    finding = next(f for f in report["findings"] if f["kind"] == "straggler")
    where = ", ".join(f"{dim}={coord}" for dim, coord in coords.items())
    assert finding["title"].startswith(f"Rank {bad_rank} ({where}) is a persistent straggler")
    stalled = ", ".join(map(str, tp_group))
    assert any(f"stalls its tp group (ranks {stalled})" in line for line in finding["evidence"])
    dims = {d["name"]: d for d in report["mesh"]["dims"]}
    assert report["mesh"]["shape"] == shape
    assert {name: dim["groups"] for name, dim in dims.items()} == groups
    assert dims["dp"]["collectives"] > 0 and dims["tp"]["collectives"] > 0  # DTensor's, read from Flight Recorder
    assert not [f for f in report["findings"] if f["kind"] == "slow_link"]  # a slow rank is no slow link


def test_healthy_mesh_job_names_no_straggler_and_records_the_whole_mesh(tmp_path):
    report = cli_json(_run(tmp_path, "healthy"))
    flagged = [f for f in report["findings"] if f["severity"] in ("medium", "high") and f["ranks"]]
    assert not [f for f in flagged if f["kind"] in ("straggler", "slow_link")], flagged
    assert report["mesh"]["shape"] == "dp=2 x tp=2"


# (world, the hung rank, its tp group, the mesh, where it sits): dp=2 x tp=2, and dp=4 x tp=2 where the rank's
# tp group is one of four and its dp group holds four ranks
HANGS = [
    (WORLD, BAD_RANK, "2, 3", "dp=2 x tp=2", "dp=1, tp=1"),
    (8, 5, "4, 5", "dp=4 x tp=2", "dp=2, tp=1"),
]


@pytest.mark.parametrize(("world", "bad_rank", "tp_group", "shape", "coords"), HANGS, ids=["4-ranks", "8-ranks"])
def test_hang_in_one_sub_mesh_names_the_tp_group_the_rank_stalls_first(
    tmp_path, world, bad_rank, tp_group, shape, coords
):
    trace_dir = tmp_path / "trace"
    procs = start_ranks([str(JOBS / "mesh_job.py"), str(trace_dir), "hang", str(bad_rank)], world)
    try:
        deadline = time.monotonic() + STALL_DEADLINE_S
        while time.monotonic() < deadline and not all(_has_stall_dump(trace_dir, r) for r in range(world)):
            assert all(p.poll() is None for p in procs), "a rank ended: the hang was not planted"
            time.sleep(0.5)
        assert all(_has_stall_dump(trace_dir, r) for r in range(world))
        time.sleep(1.0)
    finally:
        for proc in procs:  # what a launcher does to a job that stopped making progress
            proc.terminate()
        _end_all(procs)
    verdict = diag_triage_json(trace_dir)
    assert verdict["verdict"] == "missing_ranks" and verdict["culprit_ranks"] == [bad_rank], verdict
    evidence = "\n".join(verdict["evidence"])
    assert f"the tp group of ranks {tp_group} in the device mesh ({shape})" in evidence, evidence
    assert f"rank {bad_rank} stalls that tp group first (rank {bad_rank} at {coords})" in evidence, evidence
