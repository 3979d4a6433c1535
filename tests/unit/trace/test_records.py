"""The watchdog's JSON records (heartbeat.json, hang_dump_NNN.json) as dataclasses: what the watchdog writes
reads back the same, files written before the classes existed (the bundled hang run) still read, and a damaged
file keeps what is usable without raising."""

from __future__ import annotations

import json

from diag.trace.records import CollectiveMark, ExitRecord, GroupProgress, HangDump, Heartbeat, PendingOp, Stall
from diag.trace.schema import GPU_KERNELS, hang_dump_name
from tests.conftest import REPO

HANG = REPO / "sample_traces" / "hang"


def test_heartbeat_reads_back_what_was_written():
    heartbeat = Heartbeat(
        rank=3,
        pid=77,
        time_us=1_795_000_000_000_123,
        step=41,
        last_step=40,
        phase="backward",
        step_started_us=1_795_000_000_000_000,
        state="stalled",
        interval_s=5.0,
        threshold_s=120.0,
        pending=(PendingOp(pg="0", seq=812, op="all_reduce", bytes=4096, start_us=1_794_999_000_000_000, step=41),),
        pending_count=1,
        stall=Stall(pg="0", seq=812, op="all_reduce", since_us=1_794_999_000_000_000, seconds=1000.0, reason="x"),
        last_seq={"0": 811},
        dumps_written=2,
        exit=ExitRecord(how="terminated", signal="SIGTERM", time_us=1_795_000_000_000_200),
    )
    written = json.loads(json.dumps(heartbeat.to_json()))
    assert written["pending"][0]["op"] == "all_reduce" and written["exit"]["how"] == "terminated"
    assert isinstance(written["time_us"], int)  # microsecond instants stay integers on disk
    assert Heartbeat.from_json(written) == heartbeat


def test_the_bundled_hang_run_reads_as_records():
    for rank_dir in sorted(HANG.glob("rank*")):
        heartbeat = Heartbeat.from_json(json.loads((rank_dir / "heartbeat.json").read_text()))
        assert heartbeat is not None and heartbeat.rank == int(rank_dir.name[4:]) and heartbeat.interval_s == 0.5
        assert heartbeat.exit is not None and heartbeat.exit.how
    dump = HangDump.from_json(json.loads((HANG / "rank00000" / hang_dump_name(1)).read_text()))
    assert dump is not None and dump.reason and dump.main_frames()
    assert all({"file", "line"} <= set(frame) for frame in dump.main_frames())


def test_a_damaged_heartbeat_keeps_what_is_usable():
    heartbeat = Heartbeat.from_json(
        {
            "rank": 2,
            "time_us": "soon",
            "interval_s": float("nan"),
            "last_step": 7.0,
            "pending": [{"pg": "0", "seq": 3, "start_us": [1]}, "junk", 5],
            "stall": {"seconds": "long"},
            "last_seq": {"0": 9, "1": "x"},
            "exit": ["terminated"],
        }
    )
    assert heartbeat.rank == 2 and heartbeat.time_us is None and heartbeat.interval_s is None
    assert heartbeat.last_step == 7 and heartbeat.stall is None and heartbeat.exit is None
    assert heartbeat.pending == (PendingOp(pg="0", seq=3),) and heartbeat.last_seq == {"0": 9}
    assert Heartbeat.from_json(["not", "a", "heartbeat"]) is None


def test_a_torch_profiler_import_gives_the_declared_gpu_kernels_columns(tmp_path, gpu_fixtures):
    from diag.trace.kineto import load_kineto

    (tmp_path / "k").mkdir()
    (tmp_path / "k" / "t.pt.trace.json.gz").write_bytes(
        (gpu_fixtures / "kineto_h100_ddp_bf16_rank0.pt.trace.json.gz").read_bytes()
    )
    kernels = load_kineto(tmp_path / "k").gpu_kernels
    assert list(kernels.columns) == ["rank", *GPU_KERNELS.column_names] and len(kernels) > 100
    assert {str(kernels[c].dtype) for c in ("ts_us", "end_us", "launch_us")} == {"float64"}


def test_heartbeat_groups_read_back_and_old_or_damaged_ones_read_as_unknown():
    done = CollectiveMark(
        seq=811, op="all_reduce", bytes=4096, dtype="float32", step=40, start_us=1_794_999_000_000_000
    )
    issued = CollectiveMark(
        seq=812, op="all_gather", bytes=64, dtype="bfloat16", step=41, start_us=1_795_000_000_000_000
    )
    heartbeat = Heartbeat(rank=1, state="stalled", groups={"0": GroupProgress(issued, done), "7": GroupProgress()})
    written = json.loads(json.dumps(heartbeat.to_json()))
    assert written["groups"]["0"]["completed"]["seq"] == 811
    assert Heartbeat.from_json(written) == heartbeat
    assert Heartbeat.from_json({"rank": 1}).groups is None  # written before heartbeats carried groups
    assert Heartbeat.from_json({"rank": 1, "groups": {}}).groups == {}  # no collective issued yet
    damaged = Heartbeat.from_json(
        {"groups": {"0": {"issued": {"seq": "x"}, "completed": {"seq": 5.0, "bytes": "many"}}, "1": [3], "2": None}}
    )
    assert damaged.groups == {"0": GroupProgress(None, CollectiveMark(seq=5))}
    assert Heartbeat.from_json({"groups": [1, 2]}).groups is None


def test_a_damaged_hang_dump_keeps_the_frames_that_are_frames():
    raw = json.loads((HANG / "rank00000" / hang_dump_name(1)).read_text())
    frames = raw["threads"][0]["frames"]
    raw["threads"][0]["frames"] = ["\x1b[2J", 10**30, *frames, None]
    raw["threads"].append("not a thread")
    dump = HangDump.from_json(raw)
    assert dump.main_frames() == frames  # the frames that are frames, in their order
    assert all(isinstance(thread, dict) for thread in dump.threads)
    raw["threads"][0]["frames"] = {"file": "x"}
    assert HangDump.from_json(raw).main_frames() == []
