"""``diag export --perfetto``: a real run's ranks on one aligned Chrome-trace timeline."""

import json

from click.testing import CliRunner

import diag
from diag.commands.export import command as export_command
from diag.views.perfetto import write_chrome_trace
from tests.conftest import REPO
from tests.views.helpers import assert_honest_timeline

# -- what the timeline shows: nested phases, collectives timed or estimated, flows between ranks -----------------


def test_messages_from_trace_files_print_no_control_characters(tmp_path):
    """A run whose folder name and manifest hold terminal escapes (a cleared screen, a window title): the notes
    and the summary on stderr show them escaped."""
    import shutil
    import subprocess
    import sys

    run = shutil.copytree(REPO / "sample_traces" / "hang", tmp_path / "run\x1b[2J")
    manifest_path = run / "rank00000" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["world_size"] = "\x1b]0;pwned\x07"
    manifest_path.write_text(json.dumps(manifest))
    stderr = {}
    for name, extra in (("export", []), ("absent rank", ["--ranks", "9"])):
        result = subprocess.run(
            [sys.executable, "-m", "diag", "export", str(run), "--perfetto", str(tmp_path / "o.json"), *extra],
            capture_output=True,
            text=True,
            cwd=REPO,
        )
        assert result.returncode == (2 if extra else 0), result.stderr
        stderr[name] = result.stderr
    for text in stderr.values():
        assert "\x1b" not in text and "\x07" not in text
        assert "run\\x1b[2J" in text
    assert "world_size in manifests (\\x1b]0;pwned\\x07)" in stderr["export"]


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


REAL_RUNS = ("straggler", "straggler-h200", "hang", "pipeline")  # real gloo runs: 3 ranks (DDP), 3, 3, 4 (pipeline)


def test_real_runs_show_steps_with_nested_phases_collectives_with_durations_and_flows(tmp_path):
    for name in REAL_RUNS:
        run = REPO / "sample_traces" / name
        out = tmp_path / f"{name}.json"
        result = CliRunner().invoke(export_command, [str(run), "--perfetto", str(out), "-q"])
        assert result.exit_code == 0, result.output
        events = json.loads(out.read_text())["traceEvents"]
        assert_honest_timeline(events)
        trace = diag.load(run)
        steps = [e for e in events if e.get("cat") == "step"]
        assert len(steps) == len(trace.steps)
        # the steps table's phases, laid out and said so, unless the trace timed a phase of that name
        for step in steps:
            row = step["args"]
            inside = [e for e in events if e.get("cat") == "phase" and e["pid"] == step["pid"]]
            inside = [e for e in inside if e["args"]["step"] == row["step"]]
            laid_out = {
                e["name"]: e["args"]["duration_us"] for e in inside if e["args"].get("start") == "laid out in order"
            }
            expected = {"data wait": row["data_wait_us"], "forward": row["forward_us"]}
            expected.update(backward=row["backward_us"], optimizer=row["optimizer_us"])
            assert laid_out == {k: v for k, v in expected.items() if v > 0}, (name, row)
            timed = trace.phases[(trace.phases["rank"] == step["pid"]) & (trace.phases["step"] == row["step"])]
            assert sorted(e["name"] for e in inside if "start" not in e["args"]) == sorted(timed["name"].astype(str))
        # every collective of the trace, and the instances of more than one rank linked
        collectives = [e for e in events if e.get("cat", "").startswith("collective")]
        assert len(collectives) == len(trace.collectives)
        shared = (
            trace.collectives[trace.collectives["seq"] >= 0].groupby(["pg", "seq"], observed=True)["rank"].nunique()
        )
        linked = {e["bind_id"] for e in collectives if "bind_id" in e}
        point_to_point = trace.collectives["op"].astype(str).isin(["send", "recv"]).any()
        if not point_to_point:
            assert len(linked) == int((shared > 1).sum()), name
