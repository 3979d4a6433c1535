"""The restricted Flight Recorder loader: real NCCL and gloo dumps load, hostile or broken files are rejected."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest

from diag.triage.flight_recorder import DumpRejected, load_dump, read_dump_file, restricted_loads
from diag.triage.sources import read_fr_dir

NCCL_PICKLE = "flight_recorder_h100_nccl_rank0.pkl"
NCCL_JSON = "flight_recorder_h100_nccl_rank0.json"


class RunsShell:
    """Unpickling this with plain pickle.loads runs a shell command."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_hostile_file_is_listed_as_skipped_and_the_other_ranks_are_analysed(tmp_path, gpu_fixtures):
    marker = tmp_path / "pwned"
    (tmp_path / "trace_0").write_bytes((gpu_fixtures / NCCL_PICKLE).read_bytes())
    (tmp_path / "trace_1").write_bytes(pickle.dumps({"entries": [RunsShell(marker)]}))
    (tmp_path / "trace_2").write_bytes(b"\x80\x05\x95 truncated")
    data = read_fr_dir(tmp_path)
    assert not marker.exists()
    reasons = {Path(s.path).name: s.reason for s in data.skipped}
    assert reasons["trace_1"].startswith("rejected pickle: refused to load posix.system")
    assert reasons["trace_2"].startswith("corrupt pickle")
    assert sorted(r for r, info in data.ranks.items() if info.has_data) == [0]


def test_restricted_unpickler_still_builds_plain_data():
    value = {"a": [1, 2.5, None, True], "b": ("x", b"y"), "c": {1, 2}, "d": frozenset({3})}
    # protocol 4 and 5 (what torch writes) have opcodes for all of these; older ones reach sets and bytes
    # through builtins.set and _codecs.encode, which the unpickler refuses like any other lookup
    for protocol in (4, 5):
        assert restricted_loads(pickle.dumps(value, protocol=protocol)) == value
    with pytest.raises(pickle.UnpicklingError, match="refused to load builtins.set"):
        restricted_loads(pickle.dumps({1}, protocol=3))


def test_real_nccl_dump_loads_from_pickle_and_json(gpu_fixtures):
    dump = load_dump(gpu_fixtures / NCCL_PICKLE)
    assert dump.rank == 0 and dump.version == "2.10"
    assert len(dump.entries) == 842
    assert all(e.completed and e.backend == "nccl" for e in dump.entries)
    assert {e.op for e in dump.entries} >= {"all_reduce", "broadcast", "all_gather"}
    assert dump.pg_ranks == {"0": [0]}
    assert dump.entries[-1].duration_ms is not None
    assert dump.entries[-1].call_site.endswith("in <module>")
    from_json = load_dump(gpu_fixtures / NCCL_JSON)
    assert len(from_json.entries) == json.loads((gpu_fixtures / NCCL_JSON).read_text())["entries"].__len__()
    assert from_json.entries[0].input_sizes == ((1,),) and from_json.entries[0].op == "all_gather"


def test_gloo_dump_default_group_keyed_by_empty_string_is_matched_to_its_entries():
    raw = {
        "version": "2.10",
        "pg_config": {"": {"name": "", "desc": "", "ranks": "[0, 1]"}},
        "pg_status": {
            "0": {"last_enqueued_collective": 2, "last_started_collective": -1, "last_completed_collective": 1}
        },
        "entries": [
            {
                "process_group": ("0", "default_pg"),
                "collective_seq_id": s,
                "profiling_name": "gloo:all_reduce",
                "state": "scheduled",
                "input_sizes": [[10]],
                "input_dtypes": ["Float"],
                "is_p2p": False,
            }
            for s in (1, 2)
        ],
    }
    from diag.triage.flight_recorder import normalise_dump

    dump = normalise_dump(restricted_loads(pickle.dumps(raw)), "x", 0)
    assert dump.pg_ranks == {"0": [0, 1]}
    assert [e.completed for e in dump.entries] == [True, False]


def test_non_dump_files_are_rejected_with_reasons(tmp_path):
    (tmp_path / "empty_0").write_bytes(b"")
    (tmp_path / "text_1").write_text("hello")
    (tmp_path / "json_2").write_text("[1, 2]")
    for name, reason in (
        ("empty_0", "empty file"),
        ("text_1", "neither a pickle nor JSON"),
        ("json_2", "no 'entries'"),
    ):
        with pytest.raises(DumpRejected, match=reason):
            load_dump(tmp_path / name)
    assert read_dump_file(tmp_path / "json_2") == [1, 2]
