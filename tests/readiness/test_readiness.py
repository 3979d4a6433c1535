"""Would a hang be diagnosable? ``diag/readiness.py``'s checks on given environments, and on real gloo jobs:
the one line at ``diag.init`` on rank 0, the settings recorded in the manifest, and ``diag doctor`` on the
environment and on the job's trace."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from diag import readiness
from diag.launch import run_ranks
from diag.readiness import JobFacts

JOB = Path(__file__).with_name("readiness_job.py")
SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
MULTI_NODE = JobFacts(backend="nccl", world_size=16, local_world_size=8)


def _status(checks, name: str) -> str | None:
    return next((c.status for c in checks if c.name == name), None)


def _checks(environ: dict, job: JobFacts | None = None, mounts=None):
    return readiness.check(environ, job or JobFacts(backend="nccl"), mounts=mounts or [])


# -- the checks ---------------------------------------------------------------------------------------------


def test_flight_recorder_off_is_to_change_and_its_former_name_a_note():
    assert _status(_checks({}), "flight recorder") == "change"
    assert _status(_checks({"TORCH_FR_BUFFER_SIZE": "0"}), "flight recorder") == "change"
    assert _status(_checks({"TORCH_FR_BUFFER_SIZE": "lots"}), "flight recorder") == "change"
    assert _status(_checks({"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"}), "flight recorder") == "note"
    assert _status(_checks({"TORCH_FR_BUFFER_SIZE": "2000"}), "flight recorder") == "ok"


def test_dumps_on_each_nodes_disk_are_to_change_for_a_multi_node_job_only(tmp_path):
    environ = {"TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "fr_")}
    local = [("/", "ext4")]
    assert _status(_checks(environ, MULTI_NODE, local), "dump location") == "change"
    assert _status(_checks(environ, JobFacts(world_size=8, local_world_size=8), local), "dump location") == "ok"
    shared = [("/", "ext4"), (str(tmp_path), "lustre")]
    assert _status(_checks(environ, MULTI_NODE, shared), "dump location") == "ok"
    missing = {"TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "no" / "such" / "fr_")}
    assert _status(_checks(missing, MULTI_NODE, shared), "dump location") == "change"


def test_nccl_settings_that_lose_the_dump_or_slow_the_job_are_to_change():
    assert _status(_checks({"TORCH_NCCL_DUMP_ON_TIMEOUT": "0"}), "dump on timeout") == "change"
    assert _status(_checks({"TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}), "dump on timeout") == "ok"
    assert _status(_checks({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}), "async error handling") == "change"
    assert _status(_checks({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"}), "async error handling") == "ok"
    assert _status(_checks({"TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "20"}), "watchdog monitor") == "change"
    assert _status(_checks({"TORCH_NCCL_ENABLE_MONITORING": "0"}), "watchdog monitor") == "note"
    assert _status(_checks({"NCCL_DEBUG": "TRACE"}), "NCCL log") == "change"
    assert _status(_checks({"NCCL_DEBUG": "INFO"}), "NCCL log") == "note"  # no file: lines interleave
    serialised = {"TORCH_NCCL_ENABLE_TIMING": "1", "CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    assert _status(_checks(serialised), "collective timing") == "change"
    assert _status(_checks({"TORCH_NCCL_ENABLE_TIMING": "1"}), "collective timing") == "ok"


def test_a_gloo_job_is_not_told_about_nccl_settings():
    names = {c.name for c in _checks({"NCCL_DEBUG": "TRACE"}, JobFacts(backend="gloo"))}
    assert names.isdisjoint({"dump on timeout", "watchdog monitor", "NCCL log", "async error handling"})
    assert "flight recorder" in names  # gloo keeps a Flight Recorder too


def test_the_timeout_is_judged_against_the_step_time():
    def timeout_status(timeout_s: float, step_s: float | None) -> str | None:
        job = JobFacts(backend="nccl", timeouts_s={"0": timeout_s}, median_step_s=step_s)
        return _status(_checks({}, job), "collective timeout")

    assert timeout_status(20, 8.0) == "change"  # under 5 steps: a slow step ends the job
    assert timeout_status(600, 8.0) == "ok"
    assert timeout_status(7200, 8.0) == "note"  # a hang holds every GPU for two hours
    assert timeout_status(600, None) == "ok"


def test_a_multi_node_trace_directory_on_local_disk_is_to_change(tmp_path):
    job = JobFacts(backend="nccl", world_size=16, local_world_size=8, trace_dir=str(tmp_path))
    assert _status(_checks({}, job, [("/", "xfs")]), "trace directory") == "change"
    assert _status(_checks({}, job, [("/", "xfs"), (str(tmp_path), "nfs4")]), "trace directory") == "ok"


def test_mounts_are_read_from_proc(tmp_path):
    mounts = tmp_path / "mounts"
    mounts.write_text("server:/export /mnt/shared\\040dir nfs4 rw 0 0\n/dev/vda1 / ext4 rw 0 0\nbroken\n")
    read = readiness.read_mounts(str(mounts))
    assert read == [("/mnt/shared dir", "nfs4"), ("/", "ext4")]
    assert readiness.is_shared("/mnt/shared dir/dumps", read) and not readiness.is_shared("/mnt/other", read)


# -- real jobs ------------------------------------------------------------------------------------------------


def _run_job(trace_dir: Path, settings: dict, monkeypatch) -> list:
    for name in readiness.HANG_SETTINGS:  # the job sees only the settings given (an empty value is not unset)
        monkeypatch.delenv(name, raising=False)
    results = run_ranks([str(JOB), str(trace_dir)], 2, settings, timeout_s=240)
    assert all(r.returncode == 0 for r in results), [r.stderr[-2000:] for r in results]
    return results


def _doctor(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "diag", "doctor", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


@pytest.mark.slow
def test_a_job_without_flight_recorder_is_told_once_at_init_and_by_doctor(tmp_path, monkeypatch):
    trace = tmp_path / "trace"
    results = _run_job(trace, {}, monkeypatch)
    line = "diag: a hang of this job would be hard to diagnose: TORCH_FR_BUFFER_SIZE=2000"
    assert results[0].stderr.count(line) == 1
    assert line not in results[1].stderr  # rank 0 only
    manifest = json.loads((trace / "rank00000" / "manifest.json").read_text())
    assert manifest["capture"]["hang_readiness"] == "to change: flight recorder"
    assert manifest["process_groups"]["0"]["timeout_s"] == 45.0
    doctor = _doctor(str(trace), "--format", "json")
    assert doctor.returncode == 1, doctor.stderr
    checks = {c["name"]: c for c in json.loads(doctor.stdout)["checks"]}
    assert checks["flight recorder"]["status"] == "change"
    assert checks["flight recorder"]["advice"] == "TORCH_FR_BUFFER_SIZE=2000"
    assert checks["collective timeout"]["now"] == "45 s"
    assert "NCCL log" not in checks  # a gloo job


@pytest.mark.slow
def test_a_ready_job_records_its_settings_and_doctor_passes_it(tmp_path, monkeypatch):
    trace = tmp_path / "trace"
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    settings = {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_FR_DUMP_TEMP_FILE": str(dumps / "fr_")}
    results = _run_job(trace, settings, monkeypatch)
    assert not any("hard to diagnose" in r.stderr for r in results)
    manifest = json.loads((trace / "rank00001" / "manifest.json").read_text())
    assert manifest["hang_settings"] == settings
    assert manifest["capture"]["hang_readiness"] == "ok"
    doctor = _doctor(str(trace))
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert "nothing to change" in doctor.stdout


def test_doctor_on_this_environment_names_what_to_set(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
    result = _doctor(env=env)
    assert result.returncode == 1
    assert "CHANGE flight recorder" in result.stdout and "set TORCH_FR_BUFFER_SIZE=2000" in result.stdout
    assert "CHANGE async error handling" in result.stdout
    ready = _doctor(env={**env, "TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"})
    assert ready.returncode == 0, ready.stdout


def test_a_hostile_manifest_is_read_as_settings_only(tmp_path):
    trace = tmp_path / "trace"
    shutil.copytree(SAMPLES / "straggler", trace)
    manifest_path = trace / "rank00000" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["hang_settings"] = {"TORCH_FR_BUFFER_SIZE": "\x1b]52;c;aGk=\x07", "NCCL_DEBUG": ["x"], "EVIL": "1"}
    manifest["process_groups"] = {"0": {"ranks": [0, 1, 2], "timeout_s": "soon"}}
    manifest_path.write_text(json.dumps(manifest))
    result = _doctor(str(trace))
    assert result.returncode == 1, result.stderr  # a buffer size that is no number: Flight Recorder is off
    assert "Traceback" not in result.stderr and "\x1b" not in result.stdout
    assert "EVIL" not in result.stdout


def test_doctor_reads_a_job_that_left_manifests_only(tmp_path):
    """A job that hung before its first rows were written: its settings are still there to judge."""
    trace = tmp_path / "trace"
    for rank in range(2):
        rank_dir = trace / f"rank{rank:05d}"
        rank_dir.mkdir(parents=True)
        (rank_dir / "manifest.json").write_text(
            json.dumps({"rank": rank, "world_size": 2, "hang_settings": {"TORCH_FR_BUFFER_SIZE": "2000"}})
        )
    result = _doctor(str(trace))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok     flight recorder: TORCH_FR_BUFFER_SIZE=2000" in result.stdout
    missing = _doctor(str(tmp_path / "absent"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr
