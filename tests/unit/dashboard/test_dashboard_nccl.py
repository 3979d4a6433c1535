"""The communication page's NCCL view and slow links, drawn from the Report (no browser): a live trace with
nccl.log files (real processes' logs, tests/fixtures/nccl/), and the slow-link figure and text of a report."""

from __future__ import annotations

import pytest

from diag.dashboard import data as d
from diag.dashboard import figures as f
from tests.analysis.helpers import make_trace
from tests.analysis.nccl_logs import SOURCES, process_lines
from tests.analysis.slow_links import layout, links_of


def test_communication_page_shows_nccl_view_with_the_odd_rank_first(tmp_path):
    pytest.importorskip("dash")
    from diag.dashboard.pages import update_comms

    make_trace(tmp_path, ranks=4, steps=8)
    for rank, name in enumerate(["roce_2.19.3", "roce_2.19.3", "socket_2.19.3", "roce_2.19.3"]):
        (tmp_path / f"rank{rank:05d}" / "nccl.log").write_text("\n".join(process_lines(*SOURCES[name])) + "\n")
    live = d.LiveTrace(tmp_path, triage=False)
    live.refresh()
    out = update_comms(live.snapshot, None)
    assert "NCCL versions: 2.19.3 (4 ranks)" in str(out["nccl"])
    assert first_row(out["nccl"])[:4] == ["2", "node0000", "2.19.3", "Socket"]  # the rank unlike the others first
    assert first_row(update_comms(live.snapshot, 3)["nccl"])[0] == "3"  # unless a rank is selected
    assert "fewer than two process groups" in str(out["groups"].layout.annotations[0].text)


def first_row(div) -> list[str]:
    (table,) = [c for c in div.children if type(c).__name__ == "Table"]
    body = table.children[1]
    return [cell.children for cell in body.children[0].children]


def test_live_trace_follows_a_nccl_log_written_after_the_first_poll(tmp_path):
    pytest.importorskip("dash")
    make_trace(tmp_path, ranks=2, steps=6)
    live = d.LiveTrace(tmp_path, triage=False)
    live.refresh()
    assert live.snapshot.report.nccl is None
    (tmp_path / "rank00001" / "nccl.log").write_text("\n".join(process_lines(*SOURCES["socket_2.19.3"])) + "\n")
    live._next_publish_s = 0.0  # on a loaded machine the first analysis can pass 1 s and hold this one back
    assert live.refresh()
    assert live.snapshot.report.nccl.rank(1).net_kind == "Socket"


def test_slow_link_figure_and_text_from_the_report():
    pytest.importorskip("dash")
    from diag.dashboard.pages import _links_text

    report = links_of(layout(), lambda pg, ranks: 4.0 if pg.startswith("x") and {4, 5} & set(ranks) else 1.0)
    fig = f.group_speed_figure(report)
    (bars,) = fig.data
    assert len(bars.x) == len(report.groups) and list(bars.marker.color).count("#d62728") == 6
    assert "host node2: in 6 of 6 slow process groups" in str(_links_text(report))
