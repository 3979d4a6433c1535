"""DDP's buckets on diag's default gloo path come from Flight Recorder, read while the job runs: runs longer
than Flight Recorder's ring keep every bucket, and a ring overtaken between two reads is said, not hidden."""

import diag
from diag.launch import run_ranks
from tests.conftest import JOBS

RING = 256  # filled in about a second at this job's pace: read several times


def run(trace_dir, steps: int, sleep_ms: float, ring: int = RING):
    results = run_ranks(
        [str(JOBS / "ddp_ring_job.py"), str(trace_dir), str(steps), str(sleep_ms)],
        2,
        env={"TORCH_FR_BUFFER_SIZE": str(ring)},
        timeout_s=180,
    )
    for result in results:
        assert result.returncode == 0, result.stderr[-3000:]
    return diag.load(trace_dir), results


def test_every_bucket_of_a_run_longer_than_the_ring_is_recorded(tmp_path):
    steps = 150
    trace, results = run(tmp_path, steps, sleep_ms=20)
    param_bytes = int(results[0].stdout.strip().splitlines()[-1])
    for rank in (0, 1):
        ddp = trace.collectives[(trace.collectives["rank"] == rank) & (trace.collectives["source"] == "ddp")]
        assert len(ddp) > RING  # more than the ring holds at the end: read while running
        per_step = ddp.groupby("step")["bytes"].sum()
        assert per_step.index.tolist() == list(range(steps))
        assert (per_step == param_bytes).all()
        assert ddp["seq"].is_unique and ddp["seq"].is_monotonic_increasing
    assert "wrapped" not in results[0].stderr


def test_a_ring_overtaken_between_reads_is_reported(tmp_path):
    trace, results = run(tmp_path, 200, sleep_ms=0, ring=16)
    assert all("ring buffer wrapped" in result.stderr for result in results)
    ddp = trace.collectives[trace.collectives["source"] == "ddp"]
    assert 0 < len(ddp) < 2 * 200 * 3  # some buckets were lost, and the run still finished with a trace
