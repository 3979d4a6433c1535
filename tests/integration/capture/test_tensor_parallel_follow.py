"""Tensor parallelism issues its collectives from C++ (functional collectives), so only Flight Recorder sees
them: diag must follow the ring while the job runs whatever the parallelism, for more steps than it holds,
time the host's waits on them and describe the DeviceMesh's groups (issue 13 item 4). Real job: torch
``parallelize_module`` on gloo, 2 ranks, a 200-entry ring and 260 steps."""

import json

import diag
from diag.launch import run_ranks
from tests.conftest import JOBS

RING, STEPS = 200, 260


def test_every_tensor_parallel_step_keeps_its_collectives_beyond_the_ring(tmp_path):
    results = run_ranks(
        [str(JOBS / "tp_job.py"), str(tmp_path), str(STEPS)], 2, env={"TORCH_FR_BUFFER_SIZE": str(RING)}, timeout_s=300
    )
    for result in results:
        assert result.returncode == 0, result.stderr[-3000:]
        assert "wrapped" not in result.stderr
    trace = diag.load(tmp_path)
    for rank in (0, 1):
        rows = trace.collectives[trace.collectives["rank"] == rank]
        assert sorted(rows["step"].unique()) == list(range(STEPS))  # steps 0.. too, long overwritten in the ring
        assert rows["seq"].is_unique
        # per step, exactly what Flight Recorder itself holds for the steps its ring still covers
        fr_per_step = json.loads((tmp_path / f"fr_per_step_{rank}.json").read_text())
        assert len(fr_per_step) > 50
        for step, seqs in fr_per_step.items():
            assert sorted(rows[rows["step"] == int(step)]["seq"]) == seqs, step
        steps = trace.steps[trace.steps["rank"] == rank]
        assert (steps["comm_wait_us"] > 0).all()  # the waits on DTensor's all-reduce are timed
        manifest = json.loads((tmp_path / f"rank{rank:05d}" / "manifest.json").read_text())
        assert manifest["device_mesh"]["dim_names"] == ["tp"]
        tp_group = manifest["device_mesh"]["groups"]["tp"]
        assert manifest["process_groups"][tp_group]["ranks"] == [0, 1]
        assert manifest["process_groups"][tp_group]["mesh_dim"] == "tp"
        assert manifest["process_groups"][tp_group]["backend"] == "gloo"


def test_a_tensor_parallel_ring_overtaken_between_reads_is_warned_once(tmp_path):
    results = run_ranks(
        [str(JOBS / "tp_job.py"), str(tmp_path), "400"], 2, env={"TORCH_FR_BUFFER_SIZE": "8"}, timeout_s=300
    )
    for result in results:
        assert result.returncode == 0, result.stderr[-3000:]
        assert result.stderr.count("ring buffer wrapped") == 1
