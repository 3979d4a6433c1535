"""What a new user meets on the dashboard, read from the page in headless Chromium: each finding's advice whole,
the Compare page's text inside the window, the Triage table listing every rank it counts, a page with nothing
to draw for this run (not pipelined, no GPU) saying so once and why, and rank axes ticked at ranks only.

The runs: the bundled 3-rank CPU straggler run, a real 1-rank demo job (gloo, CPU) and two synthetic runs for
the comparison."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from diag.dashboard import compare_page
from tests.analysis.helpers import make_trace, synthetic

pytest.importorskip("selenium", reason="browser tests need selenium (pip install -e .[test])")
from tests.dashboard import browser as b  # noqa: E402
from tests.dashboard.helpers import make_app  # noqa: E402

SAMPLE = Path(__file__).resolve().parents[3] / "sample_traces" / "straggler"  # 3 ranks, CPU, not pipelined


@pytest.fixture(scope="module")
def sample_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("first-look") / "straggler"
    shutil.copytree(SAMPLE, run)  # the dashboard's triage and cache write beside the run, not in the repository
    return run


@pytest.fixture(scope="module")
def one_rank_run(tmp_path_factory) -> Path:
    """The demo job on one rank: every rank axis holds the single rank 0."""
    from diag.launch import run_ranks

    run = tmp_path_factory.mktemp("one-rank") / "run"
    (result,) = run_ranks(["-m", "diag.demo", str(run), "--steps", "12"], 1, timeout_s=300)
    assert result.returncode == 0, result.stderr[-2000:]
    return run


def _ticks(driver, name: str, axis: str) -> list[str]:
    """The tick labels plotly drew on ``axis`` (x, y, x2...) of figure ``name``."""
    script = """
    const gd = document.getElementById(arguments[0]).querySelector('.js-plotly-plot');
    return [...gd.querySelectorAll('.' + arguments[1] + 'tick text')].map(t => t.textContent);
    """
    return driver.execute_script(script, b.graph_dom_id(name), axis)


def test_overview_shows_each_findings_advice_whole(browser, serve, sample_run):
    app = make_app(sample_run)
    base = serve(app)
    b.open_page(browser, base + "/", 4)
    findings = app.live.snapshot.report.findings
    assert any(len(x.advice) > 160 for x in findings)  # the run has advice longer than the cut was
    shown = " ".join(b.text(browser, "overview-findings").split())
    for x in findings:
        assert " ".join(x.advice.split()) in shown, x.advice


def test_triage_lists_every_rank_it_counts(browser, serve, sample_run):
    base = serve(make_app(sample_run))
    browser.get(base + "/triage")
    b.wait_for(browser, lambda d: b.text(d, "triage-verdict"), "the triage verdict")
    assert "3 finished" in b.text(browser, "page")
    listed = browser.execute_script(
        "return [...document.querySelectorAll('#page table tbody tr')].map(r => r.cells[0].innerText)"
    )
    assert listed == ["0", "1", "2"]


def test_triage_says_what_to_do_next(browser, serve, tmp_path):
    hang = tmp_path / "hang"
    shutil.copytree(SAMPLE.parent / "hang", hang)
    base = serve(make_app(hang))
    browser.get(base + "/triage")
    b.wait_for(browser, lambda d: b.text(d, "triage-action"), "what to do next")
    assert b.text(browser, "triage-action").startswith("Next: FIX THE CODE (vm): a rank waited for its data loader")


def test_pages_with_nothing_to_draw_for_this_run_say_so_once_and_why(browser, serve, sample_run):
    base = serve(make_app(sample_run))
    for path, text_id, said, why in (
        ("/pipeline", "pipeline-none", "This run is not pipelined", "microbatches"),
        ("/telemetry", "telemetry-none", "No GPU telemetry", "CPU"),  # this run has no GPU
    ):
        browser.get(base + path)
        b.wait_for(browser, lambda d, i=text_id: b.text(d, i), f"the message of {path}")
        page = b.text(browser, "page")
        assert page.count(said) == 1, (path, page)
        assert "not available" not in page.lower()
        for name in ("pipeline-gantt", "pipeline-bubbles") if path == "/pipeline" else ("telemetry-timeline",):
            assert not (b.figure(browser, name) or {}).get("annotations"), (name, b.figure(browser, name))
        assert why in b.text(browser, text_id)


@pytest.mark.parametrize("run_name", ["sample_run", "one_rank_run"])
def test_rank_axes_are_ticked_at_the_runs_ranks_only(browser, serve, request, run_name):
    run = request.getfixturevalue(run_name)
    ranks = [str(r) for r in range(3 if run_name == "sample_run" else 1)]
    base = serve(make_app(run))
    b.open_page(browser, base + "/stragglers", 4)
    assert _ticks(browser, "stragglers-distribution", "x") == ranks
    assert _ticks(browser, "stragglers-compute", "y") == ranks
    b.open_page(browser, base + "/communication", 4)
    assert _ticks(browser, "communication-wait", "x") == ranks
    if run_name == "one_rank_run":  # the demo records memory by category (diag.instrument)
        b.open_page(browser, base + "/memory", 3)
        assert _ticks(browser, "memory-categories", "x2") == ranks


@pytest.fixture
def compared(tmp_path):
    from diag.commands.compare import load_summary

    make_trace(tmp_path / "base", 8, 40, plants=synthetic.Plants(), seed=0)
    make_trace(tmp_path / "straggler", 8, 40, plants=synthetic.Plants(compute_straggler=2), seed=1)
    compare_page.set_baseline(load_summary(tmp_path / "base", "base", no_cache=True), tmp_path / "base")
    yield tmp_path / "straggler"
    compare_page.set_baseline(None)


def test_compare_page_text_stays_inside_the_window(browser, serve, compared):
    base = serve(make_app(compared))
    browser.set_window_size(900, 1100)
    try:
        b.open_page(browser, base + "/compare", 2)
        b.wait_for(browser, lambda d: "Where the time went" in (b.text(d, "page") or ""), "the comparison")
        width = browser.execute_script("return document.documentElement.clientWidth")
        past = browser.execute_script(
            "return [...document.querySelectorAll('#page pre, #page td, #page p, #page li')]"
            ".filter(e => e.getBoundingClientRect().right > arguments[0] + 1).map(e => e.innerText.slice(0, 80))",
            width,
        )
        assert past == []
        assert browser.execute_script("return document.documentElement.scrollWidth") <= width
    finally:
        browser.set_window_size(1400, 1100)
