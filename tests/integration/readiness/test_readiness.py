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

JOB = Path(__file__).resolve().parents[2] / "readiness" / "readiness_job.py"
SAMPLES = Path(__file__).resolve().parents[3] / "sample_traces"


# -- the checks ---------------------------------------------------------------------------------------------


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
