"""The dashboard on a many-rank run (320 ranks: above PARTITIONED_MIN_RANKS, so the collectives are reduced rank
by rank and never loaded): the same report and step times as the whole trace loaded, ranks aggregated into
groups (one per node here), drill-down to one rank in headless Chromium (pick its node, then the rank), and
every figure's payload bounded whatever the ranks."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from plotly.utils import PlotlyJSONEncoder

from diag.dashboard.data import (
    MAX_RANK_GROUPS,
    LiveTrace,
    group_options,
    one_rank_table,
    rank_groups,
    rank_options,
)
from diag.dashboard.pages import update_memory
from tests.analysis.golden import differences

pytestmark = pytest.mark.slow
RANKS, STEPS, PER_STEP = 320, 12, 4
FIGURE_LIMIT_BYTES = 2 * 2**20


@pytest.fixture(scope="module")
def many_ranks(tmp_path_factory):
    from tests.analysis.helpers import synthetic

    out = tmp_path_factory.mktemp("dash320")
    plants = synthetic.generate(out, RANKS, STEPS, PER_STEP)
    return out, plants


@pytest.fixture(scope="module")
def live(many_ranks):
    live = LiveTrace(many_ranks[0], poll_interval_s=3600, triage=False)
    live.refresh()
    yield live
    live.stop()


def test_collectives_are_reduced_rank_by_rank_with_the_same_results(many_ranks, live):
    whole = LiveTrace(many_ranks[0], triage=False)
    whole.partitioned = False  # the old path: every table loaded
    whole.refresh()
    assert live.partitioned and live.snapshot.trace.collectives.empty
    assert len(whole.snapshot.trace.collectives) == RANKS * STEPS * PER_STEP
    assert differences(live.snapshot.report.to_dict(), whole.snapshot.report.to_dict()) == []
    # the collectives are reduced once, for the report's window: inside it the times of every rank-step are the
    # whole trace's (float32 kept by the dashboard: 1e-6); outside it (warm-up) the wait is the one each rank
    # measured itself, steps' comm_wait_us, and the rest of the split follows from it
    key = ["rank", "step"]
    mine = live.snapshot.times.sort_values(key).reset_index(drop=True)
    theirs = whole.snapshot.times.sort_values(key).reset_index(drop=True)
    assert mine["wait_us"].dtype == "float32" and mine["rank"].dtype == "int32"
    window = live.snapshot.report.run.window
    inside = mine["step"].between(window.first_step, window.last_step).to_numpy()
    assert inside.any() and not inside.all()  # the synthetic run has warm-up steps outside the window
    pd.testing.assert_frame_equal(mine[inside], theirs[inside], rtol=1e-6, check_dtype=False)
    steps = live.snapshot.trace.steps.sort_values(key).reset_index(drop=True)
    outside = mine[~inside]
    assert (outside["wait_us"].to_numpy() == steps.loc[~inside, "comm_wait_us"].to_numpy(dtype="float32")).all()
    assert len(outside) == len(theirs[~inside])


def test_memory_and_telemetry_are_viewed_rank_by_rank_with_the_same_figures(many_ranks, live):
    """Many ranks: memory and telemetry are never held whole (the report reduces them rank by rank, the pages
    draw compact float32 views); the bands, OOMs, a selected rank's line and the categories of the rank shown
    (read from its own files) are the whole trace's."""
    from diag.dashboard.pages import update_memory, update_telemetry

    whole = LiveTrace(many_ranks[0], triage=False)
    whole.partitioned = False
    whole.refresh()
    mine, theirs = live.snapshot, whole.snapshot
    assert mine.trace.memory.empty and len(theirs.trace.memory) == RANKS * STEPS
    assert len(mine.memory_view) == RANKS * STEPS and mine.memory_view["allocated_bytes"].dtype == "float32"
    assert len(mine.telemetry_view) == len(theirs.trace.telemetry) > 0
    slow = many_ranks[1].compute_straggler
    for snap in (mine, theirs):
        update_memory(snap, slow)
        update_telemetry(snap, slow)
    pd.testing.assert_frame_equal(mine._memo["mem_band"], theirs._memo["mem_band"], rtol=1e-6, check_dtype=False)
    assert mine._memo["ooms"].sort_values(["rank", "step"]).values.tolist() == (
        theirs._memo["ooms"].sort_values(["rank", "step"]).values.tolist()
    )
    for name, band in theirs._memo["tel_bands"].items():
        pd.testing.assert_frame_equal(mine._memo["tel_bands"][name], band, rtol=1e-5, check_dtype=False)
    for rank in (None, slow):  # this synthetic run records no categories: both say so
        a = update_memory(mine, rank)["categories"].to_plotly_json()
        b = update_memory(theirs, rank)["categories"].to_plotly_json()
        assert a["data"] == b["data"] and a["layout"]["annotations"] == b["layout"]["annotations"]
    # the drill-down's read of one rank's own files gives that rank's rows of the whole table
    one = one_rank_table(many_ranks[0], slow, "memory")
    rows = theirs.trace.memory[theirs.trace.memory["rank"] == slow].reset_index(drop=True)
    pd.testing.assert_frame_equal(one.reset_index(drop=True), rows, check_dtype=False, check_categorical=False)


def test_first_load_publishes_a_preliminary_report_before_the_full_one(many_ranks):
    """Many ranks: the first load publishes what the per-step tables alone say (rank states, the groups and their
    pickers, a preliminary report from the steps with the waits the ranks measured themselves) before the
    collectives are reduced, then the snapshot with the full report, then the same with the memory and
    telemetry views (read rank by rank after it). While preliminary, the pages drawn from the collectives,
    memory and telemetry say they come with the full report, and the Overview and Stragglers pages say theirs
    is preliminary."""
    from diag.dashboard.data import PRELIMINARY
    from diag.dashboard.pages import update_comms, update_overview, update_stragglers, update_telemetry

    seen = []
    # no cache: the module's other loads cached the report, which a load would read at once (test_dashboard_cache)
    first = LiveTrace(many_ranks[0], poll_interval_s=3600, triage=False, cache=False)
    first.prepare = lambda snap: seen.append(snap)
    first.refresh()
    early, reported, done = seen
    assert [s.report_source for s in seen] == [PRELIMINARY, "computed", "computed"]
    assert early.analysing and "being reduced" in early.analysis_error and not done.analysing
    assert reported.views_pending and reported.memory_view is None and not done.views_pending
    assert "being read" in update_memory(reported, None)["summary"].children
    assert len(done.memory_view) == RANKS * STEPS and done.report is reported.report
    assert len(early.rank_states) == RANKS and (early.rank_states["state"] != "no data").all()
    slow = many_ranks[1].compute_straggler
    # the preliminary report names the planted compute straggler, as the full one does
    assert slow in {s.rank for s in early.report.stragglers.stragglers}
    assert slow in {s.rank for s in done.report.stragglers.stragglers}
    assert early.report.comms.collectives == [] and done.report.comms.collectives
    # its step times are the ranks' own split, every rank-step of the run (as with a cached report)
    assert len(early.times) == RANKS * STEPS
    assert (
        early.times["wait_us"].to_numpy().tolist()
        == early.trace.steps["comm_wait_us"].to_numpy(dtype="float32").tolist()
    )
    for update, what in ((update_comms, "collectives"), (update_memory, "memory"), (update_telemetry, "telemetry")):
        text = str(update(early, None))
        assert "come with the full report" in text and what in text, (what, text[:300])
        assert "come with the full report" not in str(update(done, None))
    for update in (update_overview, update_stragglers):
        assert "Preliminary report" in str(update(early, slow)) and "Preliminary report" not in str(update(done, slow))
    assert len(group_options(early)) == RANKS // 8
    node = next(g for g in rank_groups(early.trace) if slow in g.ranks)
    assert rank_options(early, node.key)[0]["value"] == slow  # drill-down works before the full report
    assert first.snapshot is done and done.version == reported.version + 1 == early.version + 2


def test_ranks_are_grouped_per_node_then_in_blocks(many_ranks, live):
    trace = live.snapshot.trace
    groups = rank_groups(trace)
    assert len(groups) == RANKS // 8 and groups[0].label == "node0000: ranks 0-7"  # 8 ranks per host
    assert sorted(r for g in groups for r in g.ranks) == list(range(RANKS))
    blocks = rank_groups(trace, max_groups=30)  # more nodes than that: contiguous blocks
    assert len(blocks) <= 30 and blocks[0].label == "ranks 0-10" and sum(len(g.ranks) for g in blocks) == RANKS
    assert len(group_options(live.snapshot)) <= MAX_RANK_GROUPS
    slow = many_ranks[1].compute_straggler
    node = next(g for g in groups if slow in g.ranks)
    listed = rank_options(live.snapshot, node.key)  # the node's ranks, slowest first
    assert [o["value"] for o in listed][0] == slow and sorted(o["value"] for o in listed) == list(node.ranks)


def test_every_figure_is_bounded(live):
    """Figures are aggregated (rank groups x step windows, bands, one point per rank at most): each page's
    figures stay far below the 2 MB limit, with and without a rank selected."""
    from diag.dashboard.app import render_page
    from diag.dashboard.pages import PAGES, prepare

    prepare(live.snapshot)
    for rank in (None, 7):
        for page in PAGES.values():
            content = render_page(page, live.snapshot, rank)
            for name in page.graphs:
                size = len(json.dumps(content[name], cls=PlotlyJSONEncoder))  # as Dash sends it
                assert size <= FIGURE_LIMIT_BYTES, (page.title, name, size)
    heatmap = json.loads(
        json.dumps(render_page(PAGES["/stragglers"], live.snapshot, None)["compute"], cls=PlotlyJSONEncoder)
    )
    z = heatmap["data"][0]["z"]
    rows = int(z["shape"].split(",")[0]) if isinstance(z, dict) else len(z)
    assert rows <= 256  # rank groups, not ranks


def test_drill_down_from_a_node_to_its_slow_rank_in_the_browser(many_ranks, live, browser, serve):

    from diag.dashboard.app import create_app
    from tests.dashboard import browser as b

    slow = many_ranks[1].compute_straggler
    node = f"node{slow // 8:04d}"
    base = serve(create_app(many_ranks[0], live=live, refresh_ms=500))
    b.open_page(browser, base + "/stragglers", 4)

    def pick(dropdown_id: str, typed: str) -> None:
        """Open the dropdown, type into its search box, click the option that shows ``typed``."""
        browser.find_element("id", dropdown_id).click()
        search = b.wait_for(browser, lambda d: _search_box(d), f"the search box of {dropdown_id}")
        search.send_keys(typed)
        option = b.wait_for(browser, lambda d: _option(d, typed), f"an option with {typed!r}")
        option.click()

    pick("group-select", node)
    b.wait_for(browser, lambda d: node in (b.text(d, "group-select-value") or ""), "the node picked")
    pick("group-rank-select", f"rank {slow},")
    b.wait_for(browser, lambda d: f"selected rank: {slow}" in b.status(d), "the straggler selected")
    assert browser.find_element("id", "rank-input").get_attribute("value") == str(slow)
    b.wait_for(
        browser,
        lambda d: any(f"rank {slow}" in a for a in b.figure(d, "stragglers-compute")["annotations"]),
        "the selected rank marked on the heatmap",
    )


def _search_box(driver):
    active = driver.switch_to.active_element
    return active if "dash-dropdown-search" in (active.get_attribute("class") or "") else None


def _option(driver, typed: str):
    options = driver.find_elements("css selector", ".dash-dropdown-option")
    return next((o for o in options if typed in o.text), None)


def test_compare_summary_reads_the_step_components_rank_by_rank(many_ranks, live):
    """Many ranks: the server does not hold the step's components (forward, backward, optimizer, device time);
    the Compare page's summary of this run reads them again, rank by rank, and is the whole trace's."""
    from diag.analysis.compare import summarize_run
    from diag.dashboard.data import with_step_components

    whole = LiveTrace(many_ranks[0], triage=False)
    whole.partitioned = False
    whole.refresh()
    assert "forward_us" not in live.snapshot.trace.steps and "forward_us" in whole.snapshot.trace.steps
    mine = summarize_run(with_step_components(live.snapshot.trace), live.snapshot.report, "run")
    theirs = summarize_run(whole.snapshot.trace, whole.snapshot.report, "run")
    assert mine.components_ms.keys() == theirs.components_ms.keys() and mine.components_ms
    for name, values in theirs.components_ms.items():
        assert mine.components_ms[name] == pytest.approx(values, rel=1e-9), name
    assert mine.step_ms == theirs.step_ms and mine.gpu_busy_pct == pytest.approx(theirs.gpu_busy_pct)
    assert mine.config == theirs.config
