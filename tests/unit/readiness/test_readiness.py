"""Would a hang be diagnosable? ``diag/readiness.py``'s checks on given environments, and on real gloo jobs:
the one line at ``diag.init`` on rank 0, the settings recorded in the manifest, and ``diag doctor`` on the
environment and on the job's trace."""

from __future__ import annotations

from diag import readiness
from diag.readiness import JobFacts

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


def test_stacks_in_the_dump_are_a_note_until_switched_off():
    """Collecting Python stacks during a dump takes the GIL and can hang the dump itself: said, not required."""
    (default,) = [c for c in _checks({}) if c.name == "stacks in the dump"]
    assert (default.status, default.advice) == ("note", "TORCH_INCLUDE_STACK_TRACE=0 if dumps do not arrive")
    assert "GIL" in default.why
    assert _status(_checks({"TORCH_INCLUDE_STACK_TRACE": "0"}), "stacks in the dump") == "ok"


def test_an_nccl_log_written_to_a_file_is_ok():
    logged = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_FILE": "/shared/nccl.%h.%p"}
    assert _status(_checks(logged), "NCCL log") == "ok"
    assert _status(_checks({}), "NCCL log") == "ok"  # unset: diag.init has NCCL log into the trace directory


def test_every_setting_the_readiness_check_covers_says_what_to_use_and_why(tmp_path):
    """An environment wrong in every way: each check that is not ok names the setting to use and why."""
    environ = {
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "0",
        "TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "no" / "such" / "fr_"),
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "0",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "10",
        "NCCL_DEBUG": "TRACE",
        "TORCH_NCCL_ENABLE_TIMING": "1",
        "CUDA_DEVICE_MAX_CONNECTIONS": "1",
    }
    job = JobFacts(
        backend="nccl",
        world_size=16,
        local_world_size=8,
        trace_dir=str(tmp_path),
        timeouts_s={"0": 10.0},
        median_step_s=8.0,
    )
    checks = {c.name: c for c in readiness.check(environ, job, mounts=[("/", "ext4")])}
    assert set(checks) == {
        "flight recorder",
        "dump location",
        "dump on timeout",
        "async error handling",
        "watchdog monitor",
        "NCCL log",
        "collective timing",
        "stacks in the dump",
        "collective timeout",
        "trace directory",
    }
    assert {c.status for c in checks.values()} <= {"change", "note"}
    for check in checks.values():
        assert check.advice and check.why and check.now, check
    assert readiness.worst(checks.values()) == "change"


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
