"""The dashboard's Compare page: the followed run against the baseline given with --baseline or picked on the page
(a run beside it from the list, or a typed path, validated), drawn from the same comparison as diag compare;
without a baseline it says how to give one. In headless Chromium too."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from diag.cli import main
from diag.dashboard import compare_page
from diag.dashboard.pages import PAGES
from tests.analysis.helpers import make_trace, synthetic


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("dash-compare")
    make_trace(root / "base", 8, 40, plants=synthetic.Plants(), seed=0)
    make_trace(root / "straggler", 8, 40, plants=synthetic.Plants(compute_straggler=2), seed=1)
    (root / "notes").mkdir()  # beside the runs, not a trace: never listed, refused when typed
    (root / "notes" / "todo.txt").write_text("not a trace")
    (root / "empty-run" / "rank00000").mkdir(parents=True)  # a rank directory without a manifest
    return root


@pytest.fixture
def with_baseline(runs):
    from diag.commands.compare import load_summary

    compare_page.set_baseline(load_summary(runs / "base", "base", no_cache=True), runs / "base")
    yield
    compare_page.set_baseline(None)


def _live(path):
    from diag.dashboard.data import LiveTrace

    live = LiveTrace(path, poll_interval_s=0.3)
    live.refresh()
    return live


def test_compare_page_draws_the_run_against_its_baseline(runs, with_baseline):
    from diag.dashboard.app import render_page

    content = render_page(PAGES["/compare"], _live(runs / "straggler").snapshot, None)
    body = str(content["body"])
    assert "regression" in body and "straggler loss" in body
    bars = content["components"]["data"]
    assert {t["name"] for t in bars} >= {"straggler loss (waiting for the slowest rank)"}
    assert list(bars[0]["x"]) == ["base", "this run"]
    assert [t["name"] for t in content["steps"]["data"]] == ["base", "this run"]


def test_compare_page_without_a_baseline_says_how_to_give_one(runs):
    from diag.dashboard.app import render_page

    content = render_page(PAGES["/compare"], _live(runs / "straggler").snapshot, None)
    assert "--baseline DIR" in str(content["body"])


def test_dashboard_command_checks_the_baseline():
    result = CliRunner().invoke(main, ["dashboard", "--help"])
    assert "--baseline" in result.output and "--baseline traces/run1" in result.output
    bad = CliRunner().invoke(main, ["dashboard", ".", "--baseline", "/nonexistent/run"])
    assert bad.exit_code == 2 and "does not exist" in bad.output


@pytest.fixture
def no_baseline():
    compare_page.set_baseline(None)
    yield
    compare_page.set_baseline(None)


def test_only_diag_trace_directories_beside_the_run_are_listed(runs):
    assert [p.name for p in compare_page.sibling_runs(runs / "straggler")] == ["base"]


def test_siblings_that_cannot_be_looked_at_are_left_out(tmp_path):
    """A symlink loop beside the run (pathlib's resolve raised RuntimeError: HTTP 500 on the page), a dangling
    link and an unreadable directory: listed as nothing, the real run still listed."""
    make_trace(tmp_path / "run", 2, 10, plants=synthetic.Plants(), seed=0)
    make_trace(tmp_path / "other", 2, 10, plants=synthetic.Plants(), seed=1)
    (tmp_path / "loop-a").symlink_to(tmp_path / "loop-b")
    (tmp_path / "loop-b").symlink_to(tmp_path / "loop-a")
    (tmp_path / "self-loop").symlink_to(tmp_path / "self-loop")
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    assert [p.name for p in compare_page.sibling_runs(tmp_path / "run")] == ["other"]
    done, message = compare_page.use_baseline("loop-a", tmp_path / "run")
    assert not done and "Traceback" not in message


@pytest.mark.parametrize("exists", [True, False])
def test_a_path_outside_the_runs_parent_gets_one_answer_whether_it_exists_or_not(runs, tmp_path, no_baseline, exists):
    """A token holder typing /root/.ssh learns nothing: the same message for a path that exists and one that
    does not, and for a trace directory outside as for anything else; --baseline-root opens a wider root."""
    outside = tmp_path / "elsewhere" / "run"
    if exists:
        make_trace(outside, 2, 10, plants=synthetic.Plants(), seed=0)
    done, message = compare_page.use_baseline(str(outside), runs / "straggler")
    assert not done
    assert message == compare_page.resolve_baseline(str(tmp_path / "never" / "there"), runs / "straggler")[1]
    assert "only directories under" in message and "does not exist" not in message
    done, _ = compare_page.use_baseline("../" * 12 + str(outside).lstrip("/"), runs / "straggler")
    assert not done  # ../ out of the root is outside too
    compare_page.set_pick_root(tmp_path)
    try:
        done, message = compare_page.use_baseline(str(outside), runs / "straggler")
        assert done is exists and ("does not exist" in message) is not exists
    finally:
        compare_page.set_pick_root(None)


@pytest.mark.parametrize(
    ("typed", "says"),
    [
        ("", "give a directory"),
        ("nope", "does not exist"),
        ("notes/todo.txt", "is not a directory"),
        ("notes", "is not a diag trace directory"),
        ("empty-run", "is not a diag trace directory"),
        ("straggler", "is this run itself"),
    ],
)
def test_a_bad_baseline_gets_a_message_and_leaves_the_page_as_it_was(runs, no_baseline, typed, says):
    done, message = compare_page.use_baseline(typed, runs / "straggler")
    assert not done and says in message and "Traceback" not in message
    assert compare_page.baseline() is None


def test_a_typed_baseline_relative_to_the_runs_parent_or_absolute_is_compared(runs, no_baseline):
    from diag.dashboard.app import render_page

    before = compare_page.state_key()
    done, message = compare_page.use_baseline("base", runs / "straggler")
    assert done and message.startswith(f"baseline: {runs / 'base'}")
    assert compare_page.state_key() != before  # an open page is drawn again
    content = render_page(PAGES["/compare"], _live(runs / "straggler").snapshot, None)
    assert "regression" in str(content["body"]) and "straggler loss" in str(content["body"])
    assert compare_page.use_baseline(str(runs / "base"), runs / "straggler")[0]
