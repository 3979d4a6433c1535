"""The dashboard in headless Chromium: every page drawn with the run's data, linked selection by a real click,
the token, malformed traces, and a live run whose new records appear while the page is open."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from diag.trace.schema import MEMORY, STEPS
from diag.trace.writer import RankWriter

browser_mod = pytest.importorskip("selenium", reason="browser tests need selenium (pip install -e .[test])")
from tests.dashboard import browser as b  # noqa: E402
from tests.dashboard.helpers import make_app  # noqa: E402

PAGE_GRAPHS = {
    "/": 4,
    "/stragglers": 4,
    "/communication": 4,
    "/memory": 3,
    "/telemetry": 2,
    "/pipeline": 0,  # the synthetic run is not pipelined: the page says so once, its figures blank
    "/triage": 0,
}


@pytest.fixture(scope="module")
def synthetic_page(synthetic_run, browser):
    """One server over the synthetic run for the read-only page tests of this module."""
    import threading

    from werkzeug.serving import make_server

    app = make_app(synthetic_run[0])
    server = make_server("127.0.0.1", 0, app.server, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}", synthetic_run[1]
    server.shutdown()
    app.live.stop()


def test_every_page_draws_the_runs_data(browser, synthetic_page):
    base, planted = synthetic_page
    for path, graphs in PAGE_GRAPHS.items():
        if graphs:
            b.open_page(browser, base + path, graphs)
        else:
            browser.get(base + path)
            b.wait_for(browser, lambda d: len(b.text(d, "page") or "") > 40, f"text of {path}")
        page_text = b.text(browser, "page")
        assert "Cannot draw" not in page_text and "could not be drawn" not in page_text, (path, page_text[:500])


def test_straggler_is_named_with_its_cause_and_highlighted(browser, synthetic_page):
    base, planted = synthetic_page
    slow, data_slow = planted["compute_straggler"], planted["data_straggler"]
    b.open_page(browser, base + "/stragglers", 4)
    named = b.text(browser, f"straggler-{slow}")
    assert f"Rank {slow}" in named and "cause: compute" in named
    assert "cause: data" in b.text(browser, f"straggler-{data_slow}")
    heatmap = b.figure(browser, "stragglers-compute")
    assert f"◀ rank {slow} (compute)" in heatmap["annotations"]
    z = heatmap["data"][0]["z"]
    rows = heatmap["data"][0]["y"]
    row_means = [sum(v for v in row if v is not None) / len(row) for row in z]
    assert rows[row_means.index(max(row_means))] == slow  # the hottest row of the compute heatmap
    dist = b.figure(browser, "stragglers-distribution")["data"][0]
    assert dist["x"][dist["y"].index(max(dist["y"]))] in (slow, data_slow)


def test_overview_lists_findings_and_rank_states(browser, synthetic_page):
    base, planted = synthetic_page
    b.open_page(browser, base + "/", 4)
    findings = b.text(browser, "overview-findings")
    assert f"Rank {planted['compute_straggler']}" in findings
    assert "16 finished" in b.figure(browser, "overview-ranks")["title"]
    steps = b.figure(browser, "overview-steps")["data"]
    assert {t["name"] for t in steps} >= {"median rank", "slowest rank"}
    assert max(steps[0]["x"]) == 59


def test_memory_telemetry_pipeline_and_triage_pages_show_their_problems(browser, synthetic_page):
    base, planted = synthetic_page
    b.open_page(browser, base + "/memory", 2)
    assert f"Rank {planted['leak']}: memory grows" in b.text(browser, "memory-summary")
    b.open_page(browser, base + "/telemetry", 2)
    assert f"Rank {planted['throttled']} " in b.text(browser, "telemetry-summary")
    gpus = b.figure(browser, "telemetry-gpus")["data"][0]
    assert gpus["x"][gpus["y"].index(min(gpus["y"]))] == planted["throttled"]  # lowest clock
    browser.get(base + "/pipeline")
    b.wait_for(browser, lambda d: b.text(d, "pipeline-none"), "the pipeline page's message")
    assert "not pipelined" in b.text(browser, "pipeline-none")
    browser.get(base + "/triage")
    b.wait_for(browser, lambda d: b.text(d, "triage-verdict") or b.text(d, "triage-none"), "the triage verdict")
    assert b.text(browser, "triage-verdict").startswith("Verdict: ")


def test_clicking_a_rank_selects_it_on_the_other_pages(browser, synthetic_page):
    base, planted = synthetic_page
    slow, data_slow = planted["compute_straggler"], planted["data_straggler"]
    b.open_page(browser, base + "/stragglers", 4)
    dist = b.figure(browser, "stragglers-distribution")["data"][0]
    b.click_point(browser, "stragglers-distribution", slow, dist["y"][dist["x"].index(slow)])
    b.wait_for(browser, lambda d: f"selected rank: {slow}" in b.status(d), "the click to select the rank")
    b.wait_for(
        browser,
        lambda d: (b.figure(d, "stragglers-rank") or {}).get("title") == f"Rank {slow} vs the median rank",
        "the rank's own figure",
    )
    b.click_point(browser, "stragglers-compute", 30, data_slow)  # a heatmap cell: its rank is the one selected
    b.wait_for(browser, lambda d: f"selected rank: {data_slow}" in b.status(d), "the heatmap click")
    browser.find_element("id", "nav-memory").click()  # client-side navigation keeps the selection
    b.wait_for(browser, lambda d: b.drawn_graphs(d) >= 2, "the memory page")
    b.wait_for(
        browser,
        lambda d: f"rank {data_slow}" in [t["name"] for t in (b.figure(d, "memory-timeline") or {"data": []})["data"]],
        "the selected rank on the memory page",
    )


def test_unknown_url_reaches_no_file(browser, synthetic_page):
    base, _ = synthetic_page
    browser.get(base + "/..%2F..%2Fetc%2Fpasswd")
    b.wait_for(browser, lambda d: "No such page" in (b.text(d, "page") or ""), "the no-such-page message")
    assert "root:x:0:0" not in browser.page_source


def test_pipeline_page_draws_the_gantt_and_names_the_slow_stage(browser, serve):
    run = Path(__file__).resolve().parents[3] / "sample_traces" / "pipeline"  # real 4-rank 1F1B run, stage 2 slow
    if not (run / "rank00000" / "microbatches.csv").exists():
        pytest.skip(f"the pipeline sample run is not in {run}")
    base = serve(make_app(run))
    b.open_page(browser, base + "/pipeline", 2)
    assert "Slowest stage 2" in b.text(browser, "pipeline-summary")
    gantt = b.figure(browser, "pipeline-gantt")["data"]
    assert {"forward", "backward"} <= {t["name"] for t in gantt}
    busy = next(t for t in b.figure(browser, "pipeline-bubbles")["data"] if t["name"] == "busy")
    assert busy["x"][busy["y"].index(max(busy["y"]))] == "stage 2"


def _get(url: str, headers: dict | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_token_is_required_on_every_request(browser, synthetic_run, serve):
    base = serve(make_app(synthetic_run[0], token="s3cret-token"))
    assert _get(base + "/") == 403
    assert _get(base + "/_dash-layout") == 403
    assert _get(base + "/?token=wrong") == 403
    assert _get(base + "/_dash-layout", {"X-Diag-Token": "s3cret-token"}) == 200
    b.open_page(browser, base + "/?token=s3cret-token", 4)
    b.open_page(browser, base + "/stragglers", 4)  # the cookie set by the first visit carries the token
    browser.delete_all_cookies()
    browser.get(base + "/memory")
    assert "needs its token" in browser.page_source


def test_malformed_trace_pages_say_what_is_missing(browser, tmp_path, serve):
    bad = tmp_path / "bad"
    (bad / "rank00000").mkdir(parents=True)
    (bad / "rank00000" / "steps.csv").write_text("hello,world\n1,2\n")
    (bad / "rank00000" / "manifest.json").write_text("{not json")
    (bad / "rank00001").mkdir()
    (bad / "rank00001" / "collectives.csv").write_text("#diag-trace schema=1 table=collectives\nwrong,header\n1,2\n")
    base = serve(make_app(bad))
    b.open_page(browser, base + "/", 4)
    assert "Cannot analyse this trace: no steps recorded" in b.text(browser, "overview-summary")
    problems = b.text(browser, "overview-problems")
    assert "not a diag trace file" in problems and "unreadable JSON" in problems and "header does not match" in problems
    for path in ("/stragglers", "/communication", "/memory", "/telemetry"):
        browser.get(base + path)
        b.wait_for(browser, lambda d: "Cannot draw this page" in (b.text(d, "page") or ""), f"{path}'s message")
        page = b.text(browser, "page")
        assert page.count("Cannot draw this page: no steps recorded") == 1, page  # said once, figures blank
    empty = tmp_path / "empty"
    empty.mkdir()
    base = serve(make_app(empty))
    b.open_page(browser, base + "/", 4)
    assert "no diag traces in" in b.text(browser, "overview-summary")


# -- a live run ---------------------------------------------------------------------------------------------
START_US = 1_795_000_000_000_000


def _manifest(rank: int, finished: bool = False) -> dict:
    return {
        "schema_version": 1,
        "run_id": "live",
        "rank": rank,
        "world_size": 3,
        "host": "h",
        "device_name": "cpu",
        "clock_offset_us": 0,
        "finished": finished,
    }


def _write_steps(writer: RankWriter, steps: range, step_s: float, compute_us: int) -> None:
    for step in steps:
        start = START_US + int(step * step_s * 1e6)
        writer.append(
            "steps",
            STEPS.row(
                step=step,
                start_us=start,
                duration_us=compute_us + 5_000,
                data_wait_us=100,
                forward_us=compute_us // 3,
                backward_us=compute_us // 2,
                optimizer_us=compute_us // 6,
                comm_wait_us=5_000,
                samples=8,
            ),
        )
        writer.append("memory", MEMORY.row(step=step, time_us=start + compute_us, rss_bytes=2**30 + step * 2**20))
    writer.flush()


def test_live_run_new_records_appear_stale_rank_marked_then_finished(browser, tmp_path, serve):
    run = tmp_path / "live"
    writers = {r: RankWriter(run / f"rank{r:05d}") for r in range(3)}
    for rank, writer in writers.items():
        writer.write_manifest(_manifest(rank))
        _write_steps(writer, range(0, 5), 1.0, 50_000)
    base = serve(make_app(run, poll_s=0.3, stale_after_s=20.0))
    b.open_page(browser, base + "/", 4)
    b.wait_for(browser, lambda d: "last step 4" in b.status(d) and "3 live" in b.status(d), "the first steps")

    for rank in (0, 1):  # rank 2 stops writing; the others go on for 50 s of run time
        _write_steps(writers[rank], range(5, 10), 10.0, 50_000)
    b.wait_for(browser, lambda d: "last step 9" in b.status(d), "steps appended while the page is open")
    b.wait_for(browser, lambda d: "stale ranks: 2" in b.status(d), "rank 2 marked stale")
    b.wait_for(
        browser,
        lambda d: b.figure(d, "overview-ranks")["title"] == "Ranks: 2 live, 1 stale",
        "the stale rank in the ranks figure",
    )

    for rank, writer in writers.items():
        writer.write_manifest(_manifest(rank, finished=True))
        writer.close()
    b.wait_for(browser, lambda d: "run finished" in b.status(d), "the finished run")
    assert "3 finished" in b.status(browser)
    assert json.loads((run / "rank00000" / "manifest.json").read_text())["finished"] is True
