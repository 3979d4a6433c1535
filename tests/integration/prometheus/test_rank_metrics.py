"""diag.init(prometheus_port=...) in a real 2-rank gloo DDP job: each rank's /metrics, scraped over HTTP while
the job still runs, against what the job did and what it wrote to its trace."""

import json
import socket
import warnings
from pathlib import Path

import pytest

import diag
from diag._warn import DiagWarning
from diag.launch import start_ranks
from tests.prometheus.helpers import free_ports, samples, scrape, value, values, wait_until

STEPS = 5
WORLD = 2
JOB = str(Path(__file__).resolve().parents[2] / "prometheus" / "prometheus_job.py")


@pytest.fixture(scope="module")
def live_job(tmp_path_factory):
    """Runs the job until its steps are done, scrapes every rank, then lets it finish."""
    trace_dir, control = tmp_path_factory.mktemp("trace"), tmp_path_factory.mktemp("control")
    port = free_ports(WORLD)
    procs = start_ranks([JOB, str(trace_dir), str(control), str(STEPS), str(port)], WORLD)
    try:

        def all_ready():
            for proc in procs:
                if proc.poll() is not None:
                    raise AssertionError(f"rank exited early: {proc.communicate()[1][-3000:]}")
            return all((control / f"ready_rank{r}").exists() for r in range(WORLD))

        wait_until(all_ready, 120, "the ranks to finish their steps")
        scraped = {r: scrape(int((control / f"ready_rank{r}").read_text())) for r in range(WORLD)}
    finally:
        (control / "done").write_text("")
        outcomes = [proc.communicate(timeout=60) for proc in procs]
    for proc, (_, stderr) in zip(procs, outcomes):
        assert proc.returncode == 0, stderr[-3000:]
    truths = {r: json.loads((control / f"truth_rank{r}.json").read_text()) for r in range(WORLD)}
    return scraped, truths, diag.load(trace_dir), port


@pytest.mark.slow
def test_each_rank_serves_on_base_port_plus_local_rank(live_job):
    scraped, truths, _, port = live_job
    for rank in range(WORLD):
        assert truths[rank]["status"] == f"on: http://127.0.0.1:{port + rank}/metrics"
        assert values(scraped[rank], "diag_steps_total") == [STEPS]  # one rank per endpoint


@pytest.mark.slow
def test_labels_name_run_rank_and_host(live_job):
    scraped, _, trace, _ = live_job
    for rank in range(WORLD):
        (info,) = [s for s in samples(scraped[rank]) if s.name == "diag_rank_info"]
        assert info.labels == {
            "run": trace.run_id,
            "rank": str(rank),
            "local_rank": str(rank),
            "host": socket.gethostname(),
            "world_size": str(WORLD),
            "backend": "gloo",
            "device": "cpu",
        }
        assert trace.run_id  # agreed by the ranks at init: the same run label on both
        for sample in samples(scraped[rank]):
            assert sample.labels["rank"] == str(rank) and sample.labels["run"] == trace.run_id


@pytest.mark.slow
def test_step_metrics_match_the_steps_the_job_ran(live_job):
    scraped, _, trace, _ = live_job
    for rank in range(WORLD):
        text = scraped[rank]
        steps = trace.steps[trace.steps["rank"] == rank]
        assert value(text, "diag_step_duration_seconds_count") == STEPS
        assert value(text, "diag_step_duration_seconds_sum") == pytest.approx(steps["duration_us"].sum() / 1e6)
        assert value(text, "diag_step_duration_seconds_bucket", le="+Inf") == STEPS
        assert value(text, "diag_last_step_index") == STEPS - 1
        assert value(text, "diag_samples_total") == 8 * STEPS and value(text, "diag_tokens_total") == 8 * 32 * STEPS
        assert value(text, "diag_phases_total", phase="compute") == STEPS
        assert value(text, "diag_step_breakdown_seconds_total", part="forward") == pytest.approx(
            steps["forward_us"].sum() / 1e6
        )
        assert value(text, "diag_step_breakdown_seconds_total", part="comm_wait") > 0  # blocking all_reduce/broadcast
        assert value(text, "diag_model_flops_total") == 2e6 * STEPS
        assert value(text, "diag_device_peak_flops") == 0.5e12
        assert 0 < value(text, "diag_mfu_ratio") < 1
        assert value(text, "diag_memory_rss_bytes") > 10 * 2**20


@pytest.mark.slow
def test_collective_metrics_match_the_job_and_its_trace(live_job):
    scraped, truths, trace, _ = live_job
    for rank in range(WORLD):
        text = scraped[rank]
        colls = trace.collectives[trace.collectives["rank"] == rank]
        # the metrics fold every source: the Python wrappers', DDP's buckets and what only Flight Recorder saw
        # (DDP's constructor broadcasts its parameters from C++); the job read Flight Recorder before the scrape
        from_fr = colls[colls["source"] == "fr"]
        fr_broadcasts = int((from_fr["op"] == "broadcast").sum())
        assert fr_broadcasts > 0  # DDP's constructor
        explicit = truths[rank]["explicit"]["broadcast"]
        assert value(text, "diag_collectives_total", op="broadcast", pg="0") == explicit + fr_broadcasts
        explicit_bytes = colls[(colls["source"] == "py") & (colls["op"] == "broadcast")]["bytes"].sum()
        assert explicit_bytes == 80 * STEPS  # 10 float64s a step
        by_op = colls.groupby(colls["op"].astype(str), observed=True)
        for op, group in by_op:
            assert value(text, "diag_collectives_total", op=op, pg="0") == len(group)
            assert value(text, "diag_collective_bytes_total", op=op, pg="0") == group["bytes"].sum()
            blocking = group[group["blocking"] == 1]["duration_us"].sum() / 1e6
            assert value(text, "diag_collective_wait_seconds_total", op=op, pg="0") == pytest.approx(blocking)
        # DDP's gradient buckets (asynchronous) and the explicit all-reduce (blocking), every step
        assert value(text, "diag_collectives_total", op="all_reduce", pg="0") >= 2 * STEPS
        series = {s.labels["op"]: s.value for s in samples(text) if s.name == "diag_collectives_total"}
        assert series == by_op.size().to_dict()  # one series per op, none the trace lacks


@pytest.mark.slow
def test_cpu_rank_exports_no_gpu_metrics(live_job):
    scraped, _, _, _ = live_job
    for text in scraped.values():
        assert not [s for s in samples(text) if s.name.startswith("diag_gpu_")]
        assert not values(text, "diag_memory_reserved_bytes")  # CUDA allocator gauges: absent, not zero


def test_port_in_use_is_one_warning_and_capture_goes_on(tmp_path):
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            session = diag.init(
                tmp_path, telemetry=False, watchdog=False, prometheus_port=port, prometheus_addr="127.0.0.1"
            )
            for _ in range(3):
                with diag.step():
                    pass
            diag.finish()
    messages = [str(w.message) for w in caught if issubclass(w.category, DiagWarning)]
    assert len(messages) == 1 and f"127.0.0.1:{port}" in messages[0] and "capture goes on" in messages[0]
    trace = diag.load(tmp_path)
    assert trace.steps["step"].tolist() == [0, 1, 2]
    assert trace.manifest(0).capture["prometheus"].startswith("off: cannot serve")
    assert session.capture_status["prometheus"].startswith("off")


def test_port_is_freed_at_finish(tmp_path):
    port = free_ports(1)
    diag.init(tmp_path / "a", telemetry=False, watchdog=False, prometheus_port=port, prometheus_addr="127.0.0.1")
    assert "diag_rank_info" in scrape(port)
    diag.finish()
    with pytest.raises(OSError):
        scrape(port, timeout_s=1)
    # a second session in the same process gets the port again
    session = diag.init(
        tmp_path / "b", telemetry=False, watchdog=False, prometheus_port=port, prometheus_addr="127.0.0.1"
    )
    assert session.capture_status["prometheus"].startswith("on")
    diag.finish()
