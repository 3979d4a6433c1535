"""The dashboard's Compare page: the followed run against the baseline given with --baseline, drawn from the
same comparison as diag compare; without a baseline it says how to give one. In headless Chromium too."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from diag.cli import main
from diag.dashboard import compare_page
from diag.dashboard.pages import PAGES
from tests.analysis.helpers import make_trace, synthetic
from tests.dashboard.conftest import browser, serve  # noqa: F401 - fixtures


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("dash-compare")
    make_trace(root / "base", 8, 40, plants=synthetic.Plants(), seed=0)
    make_trace(root / "straggler", 8, 40, plants=synthetic.Plants(compute_straggler=2), seed=1)
    return root


@pytest.fixture
def with_baseline(runs):
    from diag.commands.compare import load_summary

    compare_page.set_baseline(load_summary(runs / "base", "base", None, None, None, None, True))
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


@pytest.mark.slow
def test_compare_page_in_the_browser(runs, with_baseline, browser, serve):  # noqa: F811
    from diag.dashboard.app import create_app
    from tests.dashboard import browser as b

    base = serve(create_app(runs / "straggler", live=_live(runs / "straggler"), refresh_ms=500))
    b.open_page(browser, base + "/compare", 2)
    text = b.text(browser, "page")
    assert "Compare" in text and "regression" in text and "Where the time went" in text
    assert "straggler loss" in text
    assert len(b.figure(browser, "compare-steps")["data"]) == 2
