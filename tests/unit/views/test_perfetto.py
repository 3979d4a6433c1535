"""``diag export --perfetto``: a real run's ranks on one aligned Chrome-trace timeline."""

import dataclasses
import json

import pandas as pd
from click.testing import CliRunner

import diag
from diag.commands.export import command as export_command
from diag.views.perfetto import write_chrome_trace
from tests.conftest import REPO
from tests.views.helpers import assert_honest_timeline

SAMPLE = REPO / "sample_traces" / "straggler"  # real 3-rank gloo DDP run


def export(tmp_path, *args: str) -> list[dict]:
    out = tmp_path / "run.json"
    result = CliRunner().invoke(export_command, [str(SAMPLE), "--perfetto", str(out), *args])
    assert result.exit_code == 0, result.output
    return json.loads(out.read_text())["traceEvents"]


def test_every_rank_step_and_collective_of_the_window_is_exported(tmp_path):
    events = export(tmp_path, "--steps", "5:15")
    trace = diag.load(SAMPLE)
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert sorted(names) == trace.ranks_found and all(name.startswith(f"rank {r} (") for r, name in names.items())
    steps = [e for e in events if e["ph"] == "X" and e["name"].startswith("step ")]
    assert sorted({e["name"] for e in steps}) == sorted(f"step {s}" for s in range(5, 15))
    assert len(steps) == 10 * len(trace.ranks_found)
    window = trace.collectives[(trace.collectives["step"] >= 5) & (trace.collectives["step"] < 15)]
    collectives = [e for e in events if e["ph"] == "X" and "#" in e["name"]]
    assert len(collectives) == len(window)


def test_clock_offsets_put_a_skewed_host_back_on_rank_0s_timeline(tmp_path):
    """Rank 2's clock runs 5 s ahead (its rows and its measured offset both say so): the export is unchanged."""
    original = diag.load(SAMPLE)
    skewed = diag.load(SAMPLE)
    shift_us = 5_000_000
    for frame, column in (
        (skewed.steps, "start_us"),
        (skewed.phases, "start_us"),
        (skewed.collectives, "start_us"),
        (skewed.memory, "time_us"),
    ):
        frame.loc[frame["rank"] == 2, column] += shift_us
    rank2 = skewed.manifests[2]
    skewed.manifests[2] = dataclasses.replace(rank2, clock_offset_us=rank2.clock_offset_us + shift_us)
    write_chrome_trace(original, tmp_path / "original.json")
    write_chrome_trace(skewed, tmp_path / "skewed.json")

    def timeline(path):
        events = json.loads(path.read_text())["traceEvents"]
        return sorted((e["pid"], e["name"], round(e["ts"], 3)) for e in events if e["ph"] == "X")

    assert timeline(tmp_path / "skewed.json") == timeline(tmp_path / "original.json")


def test_ranks_filter(tmp_path):
    events = export(tmp_path, "--ranks", "1", "--steps", "0:3")
    assert {e["pid"] for e in events} == {1}


def test_rank_by_rank_export_of_a_rank_whose_files_hold_a_second_run(tmp_path):
    """A job run twice into the same directory: rank 1's files hold the first run, then a second one whose steps
    start again at 0, later. The window is then cut as the loader cuts it (that rank read whole, its earlier
    run dropped by time), and the events equal the whole-trace export's."""
    import io
    import shutil

    import pandas as pd

    from diag.views.perfetto import write_chrome_trace_dir

    run = shutil.copytree(SAMPLE, tmp_path / "run")
    for name, column in (("steps.csv", "start_us"), ("collectives.csv", "start_us"), ("memory.csv", "time_us")):
        path = run / "rank00001" / name
        lines = path.read_text().splitlines(keepends=True)
        rows = pd.read_csv(io.StringIO("".join(lines[1:])))
        rows[column] += 3_600_000_000  # the second run, an hour later
        path.write_text("".join(lines) + rows.to_csv(header=False, index=False))
    trace = diag.load(run)
    assert any("start again" in s.reason for s in trace.skipped)
    for steps in (None, (2, 5)):
        write_chrome_trace(trace, tmp_path / "whole.json", steps)
        write_chrome_trace_dir(run, tmp_path / "by_rank.json", steps)
        whole = json.loads((tmp_path / "whole.json").read_text())["traceEvents"]
        by_rank = json.loads((tmp_path / "by_rank.json").read_text())["traceEvents"]
        key = lambda e: json.dumps(e, sort_keys=True)  # noqa: E731
        assert sorted(map(key, by_rank)) == sorted(map(key, whole)), steps


# -- what the timeline shows: nested phases, collectives timed or estimated, flows between ranks -----------------


def test_untimed_collectives_are_estimated_from_the_analysis_waits(tmp_path):
    """straggler-h200's collectives carry issue times only (DDP buckets read from gloo's Flight Recorder): each
    is drawn for the wait for the last rank to issue it, which is the wait the report reads
    (``collective_waits.loaded_waits``: per rank and step, and who arrived last); the last rank's own (no wait, no
    timed collective to give a transfer) is a 1 us lower bound."""
    from diag.analysis.collective_waits import loaded_waits

    run = REPO / "sample_traces" / "straggler-h200"
    events = export_events(tmp_path, run)
    trace = diag.load(run)
    coll = trace.collectives
    assert coll["duration_us"].isna().all()
    waits = loaded_waits(coll, None, trace.clock_offsets_us())
    row_of = {
        (int(r), str(pg), int(s)): (int(step), bool(b))
        for r, pg, s, step, b in zip(coll["rank"], coll["pg"], coll["seq"], coll["step"], coll["blocking"])
    }
    estimated = [e for e in events if e.get("cat") == "collective,estimated"]
    assert len(estimated) == len(coll)
    blocking_sum, async_max, rows, last = {}, {}, {}, {}
    for e in estimated:
        rank, wait_us = e["pid"], e["args"]["wait_us"]
        step, blocking = row_of[(rank, e["args"]["pg"], e["args"]["seq"])]
        rows[rank, step] = rows.get((rank, step), 0) + 1
        if blocking:
            blocking_sum[rank, step] = blocking_sum.get((rank, step), 0.0) + wait_us
        else:
            async_max[rank, step] = max(async_max.get((rank, step), 0.0), wait_us)
        last[rank] = last.get(rank, 0) + (wait_us == 0)
        assert abs(e["dur"] - max(wait_us, 1.0)) < 1e-6
        assert "lower bound" in e["args"]["transfer"]
    drawn = {cell: blocking_sum.get(cell, 0.0) + async_max.get(cell, 0.0) for cell in {*blocking_sum, *async_max}}
    assert drawn.keys() == set(waits.per_rank_step.index)
    for cell, wait_us in waits.per_rank_step.items():
        assert abs(drawn[cell] - wait_us) <= 0.05 * rows[cell] + 1e-6  # each drawn wait is rounded to 0.1 us
    assert [last.get(rank, 0) for rank in range(len(waits.last_arrivals))] == waits.last_arrivals.tolist()
    assert any(e["dur"] > 1000 for e in estimated)  # the straggler's peers waited for it


def test_untimed_collective_takes_its_peers_transfer_else_the_measured_bandwidth(tmp_path):
    """The straggler run with rank 2's all_reduce durations removed (as Flight Recorder gives DDP's buckets on
    gloo): each is drawn for its wait for the last rank to issue it plus the transfer ranks 0 and 1 measured;
    with step 7's removed on every rank, plus its bytes at the median bandwidth of the run's timed all_reduce."""
    import statistics

    trace = diag.load(SAMPLE)
    coll = trace.collectives
    all_reduce = coll["op"].astype(str) == "all_reduce"
    step7 = int(coll[all_reduce & (coll["step"] == 7)]["seq"].iloc[0])
    untimed = all_reduce & ((coll["rank"] == 2) | (coll["seq"] == step7))
    coll.loc[untimed, "duration_us"] = pd.NA
    transfer = coll[all_reduce].groupby("seq")["duration_us"].min()  # the shortest measured: ranks 0 and 1's
    rate = statistics.median(sorted((coll[all_reduce].groupby("seq")["bytes"].max() / transfer).dropna().tolist()))
    write_chrome_trace(trace, tmp_path / "run.json")
    events = json.loads((tmp_path / "run.json").read_text())["traceEvents"]
    assert_honest_timeline(events)
    estimated = [e for e in events if e.get("cat") == "collective,estimated" and e["args"]["op"] == "all_reduce"]
    assert len(estimated) == int(untimed.sum())
    for e in estimated:
        seq = e["args"]["seq"]
        same = coll[all_reduce & (coll["seq"] == seq)]
        issued = same["start_us"] - same["rank"].map(trace.clock_offsets_us()).fillna(0.0)
        untimed_issued = issued[same["duration_us"].isna()]
        wait_us = untimed_issued.max() - issued[same["rank"] == e["pid"]].iloc[0]
        if seq == step7:
            expected = wait_us + same["bytes"].max() / rate
            assert "median bandwidth of the timed all_reduce" in e["args"]["transfer"]
        else:
            expected = wait_us + transfer[seq]
            assert e["args"]["transfer"] == "the shortest duration measured on another rank"
        assert abs(e["dur"] - max(expected, 1.0)) < 1e-3, (e, expected)


def export_events(tmp_path, run) -> list[dict]:
    out = tmp_path / f"{run.name}.json"
    result = CliRunner().invoke(export_command, [str(run), "--perfetto", str(out), "-q"])
    assert result.exit_code == 0, result.output
    return json.loads(out.read_text())["traceEvents"]


def test_output_folder_created_and_absent_rank_is_exit_2(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = REPO / "sample_traces" / "pipeline"  # 4 ranks
    result = CliRunner().invoke(export_command, [str(run), "--perfetto", "out/missing_dir/run1.json", "-q"])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "out" / "missing_dir" / "run1.json").read_text())["traceEvents"]
    result = CliRunner().invoke(export_command, [str(run), "--perfetto", "out/r9.json", "--ranks", "9"])
    assert result.exit_code == 2 and "has no rank 9 (it has ranks 0-3)" in result.output
    assert not (tmp_path / "out" / "r9.json").exists()


def test_nothing_to_export_is_an_input_error_and_leaves_no_file(tmp_path):
    """A window past the run's end, or rank directories holding manifests only: exit 2 with a message, as
    ``diag analyze`` does, and no file of rank names alone (before: exit 0, "12 events from 3 ranks")."""
    import shutil

    manifests = tmp_path / "manifests"
    for rank_dir in sorted(SAMPLE.glob("rank*")):
        (manifests / rank_dir.name).mkdir(parents=True)
        shutil.copy(rank_dir / "manifest.json", manifests / rank_dir.name)
    for run, args in ((SAMPLE, ["--steps", "100:200"]), (manifests, [])):
        out = tmp_path / "out.json"
        result = CliRunner().invoke(export_command, [str(run), "--perfetto", str(out), *args])
        assert result.exit_code == 2, result.output
        assert "nothing to export" in result.output and not out.exists()
