"""Every value diag reads from a Kineto trace is checked for type and range where it is read: a value of the wrong
type or out of range is named and left out, the rest of the file is still read (tests/reliability/corpus.py
holds the same damage for every command)."""

from __future__ import annotations

import json

import pytest

from diag.trace.kineto import load_kineto
from tests.reliability.corpus import _kineto_doc


def _load(tmp_path, doc: dict, name: str = "rank0.pt.trace.json"):
    (tmp_path / name).write_text(json.dumps(doc))
    return load_kineto(tmp_path)


def _reasons(trace) -> str:
    return " ".join(s.reason for s in trace.skipped)


def test_stream_out_of_range_drops_that_kernel_only_and_keeps_columns_aligned(tmp_path):
    trace = _load(tmp_path, _kineto_doc(event_args={"stream": 1 << 40}))
    kernels = trace.gpu_kernels
    assert len(kernels) == 3  # the first step's compute kernel left out, not half of its columns
    assert sorted(kernels["stream"].unique()) == [7, 8]
    assert (kernels["end_us"] - kernels["ts_us"]).tolist() == [50.0, 50.0, 50.0]
    assert trace.collectives["bytes"].tolist() == [4096, 4096]
    assert "1 event(s) with a time, duration, stream, id or name of the wrong type" in _reasons(trace)


def test_an_intact_trace_names_no_event_left_out(tmp_path):
    assert "event(s) with" not in _reasons(_load(tmp_path, _kineto_doc()))


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"distributedInfo": {"rank": 10**12, "world_size": 4}}, "distributedInfo.rank '1000000000000' is not a rank"),
        ({"distributedInfo": {"rank": -3}}, "distributedInfo.rank '-3' is not a rank"),
        ({"distributedInfo": [0, 1]}, "distributedInfo is a list"),
        ({"distributedInfo": "rank 0"}, "distributedInfo is a str"),
        ({"deviceProperties": {"name": "x"}}, "deviceProperties is a dict"),
        ({"deviceProperties": 5}, "deviceProperties is a int"),
        ({"baseTimeNanoseconds": "yesterday"}, "baseTimeNanoseconds 'yesterday' is not a time"),
        ({"baseTimeNanoseconds": 1e300}, "baseTimeNanoseconds '1e+300' is not a time"),
    ],
)
def test_metadata_of_the_wrong_type_is_named_and_the_events_still_read(tmp_path, changes, said):
    trace = _load(tmp_path, _kineto_doc(**changes))
    assert said in _reasons(trace)
    assert trace.ranks_found == [0]  # from the file name
    assert trace.steps["step"].tolist() == [0, 1] and len(trace.collectives) == 2


def test_pg_config_not_a_list_and_step_numbers_too_long_are_left_out(tmp_path):
    doc = _kineto_doc(distributedInfo={"rank": 0, "pg_config": {"pg_name": 5}, "world_size": "x"})
    doc["traceEvents"][0]["name"] = "ProfilerStep#" + "9" * 40
    trace = _load(tmp_path, doc)
    assert "distributedInfo.pg_config is a dict" in _reasons(trace)
    assert "world_size 'x'" in _reasons(trace)
    assert trace.steps["step"].tolist() == [1]  # the step whose number no integer holds is not a step


def test_event_times_of_the_wrong_type_skip_the_event(tmp_path):
    doc = _kineto_doc()
    doc["traceEvents"][1]["ts"] = "x"  # the first kernel's launch
    doc["traceEvents"][2]["dur"] = "inf"  # the first kernel
    doc["traceEvents"][3]["ts"] = 1e300  # the second kernel's launch
    trace = _load(tmp_path, doc)
    assert len(trace.gpu_kernels) == 3
    assert trace.gpu_kernels["launch_us"].isna().sum() == 1
    assert "3 event(s) with a time, duration" in _reasons(trace)  # each left out is counted, not silent


def test_an_event_nested_fifty_thousand_levels_is_refused_in_bounded_time_and_memory(tmp_path):
    """ijson builds such an event whole with a prefix string per level (6 GB and 100 s): refused as it is read."""
    import resource
    import time

    deep = json.dumps(_kineto_doc()).replace('"stream": 7', '"deep": ' + "[" * 50_000 + "]" * 50_000 + ', "stream": 7')
    (tmp_path / "rank0.pt.trace.json").write_text(deep)
    (tmp_path / "rank1.pt.trace.json").write_text(json.dumps(_kineto_doc(distributedInfo={"rank": 1})))
    before_kib, started = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.monotonic()
    trace = load_kineto(tmp_path)
    assert time.monotonic() - started < 30
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before_kib < 1 << 20  # under 1 GiB more
    assert trace.ranks_found == [1] and "nested deeper than 64 levels" in _reasons(trace)


def test_a_file_the_parser_refuses_is_said_on_one_line(tmp_path):
    """An integer JSON allows but the parser cannot hold (a correlation of 2**70): the file is skipped with one
    line of reason (before: yajl's context and caret over three lines, then "; file skipped" on a fourth)."""
    (tmp_path / "rank0.pt.trace.json").write_text(json.dumps(_kineto_doc(event_args={"correlation": 1 << 70})))
    (tmp_path / "rank1.pt.trace.json").write_text(json.dumps(_kineto_doc()))
    trace = load_kineto(tmp_path)
    (refused,) = [s for s in trace.skipped if s.path.endswith("rank0.pt.trace.json")]
    assert "integer overflow" in refused.reason and refused.reason.endswith("; file skipped")
    assert "\n" not in refused.reason
