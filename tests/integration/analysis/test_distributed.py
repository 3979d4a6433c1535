"""`diag analyze --scheduler ADDRESS` on a real Dask cluster that the test starts: a `dask scheduler` and two
`dask worker` processes on 127.0.0.1, reading the trace directory themselves (the shared filesystem is this
machine's). The JSON report equals the single-machine run's; `diag --help` and `diag analyze` without
--scheduler never import dask."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.analysis.golden import differences
from tests.analysis.helpers import REPO, analyze_in_subprocess, make_trace, synthetic

pytest.importorskip("distributed")

WORKERS = 2
START_TIMEOUT_S = 60


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO)}  # the workers import this checkout's diag


def _dask(*args: str, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", *args], stdout=log.open("w"), stderr=subprocess.STDOUT, env=_env(), cwd=REPO
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A scheduler and WORKERS single-threaded worker processes, started as a user would; stopped afterwards."""
    root = tmp_path_factory.mktemp("dask")
    scheduler_file = root / "scheduler.json"
    procs = [
        _dask(
            "distributed.cli.dask_scheduler",
            "--host", "127.0.0.1", "--port", "0", "--no-dashboard", "--scheduler-file", str(scheduler_file),
            log=root / "scheduler.log",
        )
    ]  # fmt: skip
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not scheduler_file.exists():
            assert time.monotonic() < deadline, (root / "scheduler.log").read_text()
            time.sleep(0.2)
        for i in range(WORKERS):
            procs.append(
                _dask(
                    "distributed.cli.dask_worker",
                    "--scheduler-file", str(scheduler_file), "--nthreads", "1", "--nworkers", "1",
                    "--no-dashboard", "--host", "127.0.0.1", "--local-directory", str(root / f"worker{i}"),
                    log=root / f"worker{i}.log",
                )
            )  # fmt: skip
        address = json.loads(scheduler_file.read_text())["address"]
        _wait_for_workers(address, deadline)
        yield address
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()


def _wait_for_workers(address: str, deadline: float) -> None:
    from distributed import Client

    with Client(address, timeout=START_TIMEOUT_S) as client:
        while len(client.scheduler_info()["workers"]) < WORKERS:
            assert time.monotonic() < deadline, "the dask workers did not join"
            time.sleep(0.2)


def _report(trace_dir: Path, *args: str) -> dict:
    return json.loads(analyze_in_subprocess(trace_dir, *args))


@pytest.mark.slow
def test_cluster_report_equals_the_single_machine_report(cluster, tmp_path):
    """Health too: both its stages on the workers, each rank's values kept there between them."""
    plants = make_trace(tmp_path, ranks=24, steps=80, plants=synthetic.Plants.with_health(24, 80))
    local = _report(tmp_path, "--in-memory")
    on_cluster = _report(tmp_path, "--scheduler", cluster)
    assert differences(local, on_cluster) == []
    persistent = {s["rank"] for s in on_cluster["stragglers"] if s["persistent"]}
    assert persistent == {plants.compute_straggler, plants.data_straggler, plants.throttled}
    health = on_cluster["health"]
    assert [d["rank"] for d in health["departures"]] == [plants.grad_departs]
    assert health["divergence"]["ranks"] == [plants.diverged[0]]


@pytest.mark.slow
def test_both_workers_did_the_partitions(cluster, tmp_path):
    """The ranks are read by the workers, not the client: each worker ran some of the batches of ranks, and
    loaded some of the shares of the per-step tables."""
    from distributed import Client

    make_trace(tmp_path, ranks=16, steps=40)
    from diag.analysis.partitioned import analyze_partitioned

    with Client(cluster) as client:
        analyze_partitioned(tmp_path, client=client)
        ran = client.run(_tasks_run_here, "_first_batch")
        loaded = client.run(_tasks_run_here, "_read_share_task")
    assert len(ran) == WORKERS and all(count > 0 for count in ran.values()), ran
    assert len(loaded) == WORKERS and all(count > 0 for count in loaded.values()), loaded


@pytest.mark.slow
def test_the_load_on_the_cluster_equals_the_load_here(cluster, tmp_path):
    """The per-step tables read in shares on the workers: the Trace this process reads, frame for frame, its
    notes in the same order (a rank's unreadable steps file among them)."""
    from distributed import Client

    from diag.analysis.partitioned import RANK_TABLES, load_without_collectives

    make_trace(tmp_path, ranks=20, steps=30)
    (tmp_path / "rank00007" / "steps.csv").write_bytes(b"\x89PNG not a trace\x00")
    here = load_without_collectives(tmp_path, analysed_columns_only=True, without=RANK_TABLES)
    with Client(cluster) as client:
        there = load_without_collectives(tmp_path, analysed_columns_only=True, without=RANK_TABLES, client=client)
    assert here.steps.equals(there.steps) and len(there.steps)
    assert here.steps.dtypes.equals(there.steps.dtypes)
    assert here.events.equals(there.events) and here.manifests == there.manifests
    assert here.skipped == there.skipped and any("rank00007" in str(note) for note in there.skipped)


@pytest.mark.slow
def test_the_two_stages_on_the_cluster_equal_the_inline_run(cluster, tmp_path):
    """The collectives (engine.run_two_stage) on the cluster, the parts kept on the workers between the stages
    and the partials combined in trees: the inline run's result (float sums to 1e-6 us)."""
    from distributed import Client

    from diag.analysis import engine
    from diag.analysis.collective_waits import Collectives
    from diag.analysis.partitioned import load_without_collectives
    from diag.analysis.window import choose_window
    from tests.analysis.two_stage import comparable

    make_trace(tmp_path, ranks=20, steps=30)
    trace = load_without_collectives(tmp_path)
    analysis, sources = Collectives(choose_window(trace.steps, None, set())), engine.rank_sources(trace)
    inline = comparable(engine.run_two_stage(analysis, sources))
    with Client(cluster) as client:
        on_cluster = comparable(engine.run_two_stage(analysis, sources, client=client))
    assert inline[0].equals(on_cluster[0]) and inline[1:] == on_cluster[1:]


def _tasks_run_here(function: str, dask_worker) -> int:
    """Tasks of ``function`` this worker took to memory (its transition log names every task it handled)."""
    log = dask_worker.state.log
    done = {str(entry[0]) for entry in log if function in str(entry[0]) and "memory" in entry}
    return len(done)


@pytest.mark.slow
def test_sample_pipeline_run_on_the_cluster_equals_its_golden_report(cluster):
    """Send/recv rows matched with no other rank, several process groups: same report on the cluster."""
    trace_dir = REPO / "sample_traces" / "pipeline"
    assert differences(_report(trace_dir, "--in-memory"), _report(trace_dir, "--scheduler", cluster)) == []


@pytest.mark.slow
def test_unreachable_scheduler_is_a_clear_error(tmp_path):
    make_trace(tmp_path, ranks=4, steps=10)
    out = subprocess.run(
        [sys.executable, "-m", "diag", "analyze", str(tmp_path), "--scheduler", "tcp://127.0.0.1:9", "--no-cache"],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=REPO,
        timeout=120,
    )
    assert out.returncode != 0
    assert "cannot reach the Dask scheduler at tcp://127.0.0.1:9" in out.stderr
    assert "Traceback" not in out.stderr


def test_help_and_analyze_without_scheduler_never_import_dask(tmp_path):
    make_trace(tmp_path, ranks=4, steps=10)
    code = (
        "import sys; from click.testing import CliRunner; from diag.cli import main; "
        "assert CliRunner().invoke(main, ['--help']).exit_code == 0; "
        f"r = CliRunner().invoke(main, ['analyze', {str(tmp_path)!r}, '--format', 'json', '--no-cache', '--partitioned', '--fail-on', 'never']); "
        "assert r.exit_code == 0, r.output; "
        "print(sorted(m for m in ('dask', 'distributed', 'torch', 'dash') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=_env())
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
