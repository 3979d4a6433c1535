"""``diag export --perfetto``: a real run's ranks on one aligned Chrome-trace timeline."""

import dataclasses
import json

from click.testing import CliRunner

import diag
from diag.commands.export import command as export_command
from diag.views.perfetto import write_chrome_trace
from tests.conftest import REPO

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


def test_rank_by_rank_export_writes_the_same_events_as_the_whole_trace(tmp_path):
    """``diag export`` reads one rank at a time (memory bounded by a rank, time by the steps asked): on every
    sample run, whole and windowed, with a rank filter, its events are those of ``write_chrome_trace`` of the
    whole loaded trace."""
    from diag.views.perfetto import write_chrome_trace_dir

    for name in ("straggler", "pipeline", "hang", "straggler-h100"):
        run = REPO / "sample_traces" / name
        trace = diag.load(run)
        for steps, ranks in ((None, None), ((2, 5), None), ((1, 3), [1])):
            write_chrome_trace(trace, tmp_path / "whole.json", steps, ranks)
            count, written, _ = write_chrome_trace_dir(run, tmp_path / "by_rank.json", steps, ranks)
            whole = json.loads((tmp_path / "whole.json").read_text())["traceEvents"]
            by_rank = json.loads((tmp_path / "by_rank.json").read_text())["traceEvents"]
            assert count == len(by_rank) == len(whole) > 0
            assert written == (ranks or trace.ranks_found)
            key = lambda e: json.dumps(e, sort_keys=True)  # noqa: E731 - events are dicts: compare as text
            assert sorted(map(key, by_rank)) == sorted(map(key, whole)), (name, steps, ranks)


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
