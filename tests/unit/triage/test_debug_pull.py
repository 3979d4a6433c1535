"""The on-demand pull from PyTorch's debug server (diag/triage/debug_pull.py), on pages its frontend rendered for
a real 3-rank gloo job (tests/fixtures/debug_server/pages, README.md there), and on pages that are not its."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from diag.triage.analysis import triage
from diag.triage.debug_pull import PullError, frontend_url, rank_answers, stacks_text
from diag.triage.debug_server import parse_stacks
from diag.triage.sources import read_input

PAGES = Path(__file__).resolve().parents[2] / "fixtures" / "debug_server" / "pages"


def _answers(name: str):
    return rank_answers((PAGES / name).read_text())


def test_every_rank_s_stacks_are_cut_from_the_page_with_its_worker():
    answers = _answers("stacks.html")
    assert [a.rank for a in answers] == [0, 1, 2]
    assert all(a.text and a.status == 200 and a.worker_url.startswith("http://vm:") for a in answers)
    assert "wait_for_slow_input" in answers[2].text and "<module>" in answers[2].text  # as torch rendered it


def test_the_pulled_stacks_are_judged_as_a_dump_of_the_debug_server(tmp_path):
    """Written as the periodic dumper writes them, the pulled stacks give the verdict its dumps give."""
    (tmp_path / "stacks_20261129_103600.txt").write_text(stacks_text(_answers("stacks.html")))
    verdict = triage(read_input(tmp_path))
    assert verdict.verdict == "missing_ranks" and verdict.culprit_ranks == [2], verdict.evidence
    assert verdict.ranks[0].state == "waiting_in_collective"


def test_a_rank_that_did_not_answer_is_a_failed_rank_of_the_dump(tmp_path):
    answers = _answers("stacks_partial.html")
    assert [(a.rank, a.text is None, a.status) for a in answers] == [(0, False, 200), (1, False, 200), (2, True, 408)]
    path = tmp_path / "stacks_20261129_103601.txt"
    path.write_text(stacks_text(answers))
    dump = parse_stacks(path)
    assert sorted(dump.threads) == [0, 1] and dump.failed == {2: "HTTP 408"}


def test_flight_recorder_answers_are_each_rank_s_json_dump():
    answers = _answers("fr_trace_json_partial.html")
    dumps = {a.rank: json.loads(a.text) for a in answers if a.text is not None}
    assert sorted(dumps) == [0, 1] and all(d["entries"] for d in dumps.values())
    assert [a.rank for a in answers if a.text is None] == [2]


@pytest.mark.parametrize(
    "page",
    [
        "<html><body>502 Bad Gateway</body></html>",  # a proxy's page
        "",
        "<h2>Rank 99999999999: http://x/handler/dump_traceback?</h2><pre>x</pre>",
    ],
)
def test_a_page_that_is_not_the_debug_server_s_is_refused(page):
    with pytest.raises(PullError):
        rank_answers(page)


def test_a_worker_heading_that_is_not_http_gives_no_worker_to_profile():
    answers = rank_answers(
        "<h2>Rank 0: file:///etc/passwd/handler/x?</h2><pre>Thread 0x1 (most recent call first):</pre>"
    )
    assert answers[0].worker_url == ""


@pytest.mark.parametrize("url", ["file:///tmp/x", "node0:25999", "http://", "http://node0:25999/?x=1", "ftp://n/"])
def test_only_an_http_address_of_the_debug_server_is_taken(url):
    with pytest.raises(PullError):
        frontend_url(url)


def test_the_frontend_address_is_kept_as_given():
    assert frontend_url(" http://node0:25999/ ") == "http://node0:25999"
    assert frontend_url("https://debug.example/job7") == "https://debug.example/job7"


def test_cli_says_why_it_could_not_pull_and_exits_2(tmp_path):
    from click.testing import CliRunner

    from diag.cli import main

    refused = CliRunner().invoke(main, ["triage", "--pull", "file:///etc", str(tmp_path / "now")])
    assert refused.exit_code == 2 and "not an http:// or https:// URL" in refused.output
    nobody = CliRunner().invoke(main, ["triage", "--pull", "http://127.0.0.1:9", str(tmp_path / "now")])
    assert nobody.exit_code == 2 and "cannot pull from the debug server" in nobody.output
    watching = CliRunner().invoke(main, ["triage", "--pull", "http://127.0.0.1:9", "--watch", str(tmp_path)])
    assert watching.exit_code == 2 and "leave out --watch" in watching.output


@pytest.mark.parametrize(
    ("text", "ranks"),
    [
        ("0, 7 12", [0, 7, 12]),
        ("3", [3]),
        ("2,2", [2]),
        ("", None),
        ("a", None),
        ("-1", None),
        ("1 2 3 4 5 6 7 8 9", None),
    ],
)
def test_the_ranks_to_profile_are_a_short_list_of_ranks(text, ranks):
    from diag.dashboard.live_pull import parse_ranks

    parsed, problem = parse_ranks(text)
    assert (parsed if problem is None else None) == ranks


def test_each_pull_gets_a_directory_of_its_own(tmp_path):
    from diag.dashboard.live_pull import _next_pull_directory

    assert _next_pull_directory(tmp_path).name == "pull-1"
    (tmp_path / "pull-1").mkdir()
    (tmp_path / "pull-9").mkdir()
    (tmp_path / "pull-x").mkdir()
    assert _next_pull_directory(tmp_path).name == "pull-10"


def test_dashboard_refuses_a_debug_server_address_that_is_not_http(tmp_path):
    from click.testing import CliRunner

    from diag.cli import main

    bad = CliRunner().invoke(main, ["dashboard", str(tmp_path), "--debug-server", "file:///etc"])
    assert bad.exit_code == 2 and "--debug-server" in bad.output and "not an http://" in bad.output
    alone = CliRunner().invoke(main, ["dashboard", str(tmp_path), "--debug-dir", str(tmp_path / "d")])
    assert alone.exit_code == 2 and "add --debug-server" in alone.output
