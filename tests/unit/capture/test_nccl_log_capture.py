"""NCCL's log captured per rank: the three variables set only when the user set none and NCCL has not started,
the status in the manifest, and (on a GPU) a real nccl.log that the loader parses."""

from __future__ import annotations

import json
import os

import pytest
import torch

import diag
from diag._warn import DiagWarning
from diag.capture.nccl_log import NCCL_LOG_SUBSYS, configure_nccl_log, nccl_log_path


def test_variables_set_when_the_user_set_none(tmp_path):
    environ = {"PATH": "/usr/bin"}
    status = configure_nccl_log(tmp_path / "rank00003", True, [], environ)
    assert status.startswith("on:")
    assert environ["NCCL_DEBUG"] == "INFO" and environ["NCCL_DEBUG_SUBSYS"] == NCCL_LOG_SUBSYS
    assert environ["NCCL_DEBUG_FILE"] == str((tmp_path / "rank00003" / "nccl.log").absolute())


@pytest.mark.parametrize("name", ["NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE"])
def test_what_the_user_set_is_never_changed(tmp_path, name):
    environ = {name: "WARN" if name == "NCCL_DEBUG" else "user-value"}
    before = dict(environ)
    status = configure_nccl_log(tmp_path, True, [], environ)
    assert environ == before and status.startswith(f"off: the user set {name}=")


def test_a_second_init_knows_the_variables_are_its_own(tmp_path):
    environ: dict[str, str] = {}
    configure_nccl_log(tmp_path / "first", True, [], environ)
    status = configure_nccl_log(tmp_path / "second", True, [], environ)
    assert status.startswith("off: set by an earlier diag.init of this process") and "first" in status
    assert environ["NCCL_DEBUG_FILE"].endswith("first/nccl.log")  # NCCL read it once: it stays


def test_too_late_once_nccl_started_is_said_once(tmp_path):
    environ: dict[str, str] = {}
    with pytest.warns(DiagWarning, match="NCCL already started"):
        status = configure_nccl_log(tmp_path, True, ["0", "1"], environ)
    assert environ == {} and status == "off: too late, NCCL already started (process groups 0, 1)"
    assert configure_nccl_log(tmp_path, True, ["0"], environ).startswith("off: too late")  # no second warning


def test_percent_in_the_trace_path_is_escaped_for_nccl(tmp_path):
    assert nccl_log_path(tmp_path / "run%h" / "rank00000").endswith("run%%h/rank00000/nccl.log")


def test_status_in_the_manifest_of_a_real_session(tmp_path, monkeypatch):
    """This machine's torch (CPU build) has no NCCL: nothing is set, and the manifest says why."""
    for name in ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE"):
        monkeypatch.setenv(name, "")  # recorded, so that what diag sets is undone after the test
        monkeypatch.delenv(name)
    diag.init(tmp_path, telemetry=False, watchdog=False)
    diag.finish()
    capture = json.loads((tmp_path / "rank00000" / "manifest.json").read_text())["capture"]
    if torch.distributed.is_nccl_available():
        assert capture["nccl_log"].startswith("on:") and os.environ["NCCL_DEBUG"] == "INFO"
    else:
        assert capture["nccl_log"] == "off: this torch has no NCCL" and "NCCL_DEBUG" not in os.environ


def test_nccl_log_false_leaves_nccl_alone(tmp_path, monkeypatch):
    monkeypatch.delenv("NCCL_DEBUG", raising=False)
    diag.init(tmp_path, telemetry=False, watchdog=False, nccl_log=False)
    diag.finish()
    capture = json.loads((tmp_path / "rank00000" / "manifest.json").read_text())["capture"]
    assert capture["nccl_log"] == "off" and "NCCL_DEBUG" not in os.environ


def test_nccl_log_option_must_be_a_bool(tmp_path):
    with pytest.raises(ValueError, match="nccl_log must be True or False"):
        diag.init(tmp_path, nccl_log="yes")


def test_gloo_groups_are_not_taken_for_started_nccl(tmp_path):
    """torch_private.nccl_groups_started on a real (one-rank, gloo) process group with a collective done."""
    import torch.distributed as dist

    from diag.capture import torch_private

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        dist.all_reduce(torch.ones(4))
        assert torch_private.nccl_groups_started() == []
    finally:
        dist.destroy_process_group()
