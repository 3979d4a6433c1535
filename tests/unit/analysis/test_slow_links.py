"""Slow links from timing alone (diag/analysis/links.py) on multi-group collective tables with the slowness planted
at a known host, host pair or rank. The tables are the collectives table diag writes, built here row by row: each
collective has one row per member rank; the last rank to arrive sees only the transfer, the others wait longer."""

from __future__ import annotations

from diag.analysis.collective_waits import loaded_waits
from diag.analysis.findings import FindingContext
from diag.analysis.links import SLOW_RATIO, analyze_links, link_findings
from diag.trace.mesh import MeshLayout
from tests.analysis.slow_links import HOSTS, STEPS, TRANSFER_US, collectives, layout, links_of


def test_slow_host_is_named_when_its_groups_are_slow():
    groups = layout()
    report = links_of(groups, lambda pg, ranks: 4.0 if pg.startswith("x") and {4, 5} & set(ranks) else 1.0)
    slow = {g.pg for g in report.groups if g.slow}
    assert slow == {pg for pg, ranks in groups.items() if pg.startswith("x") and {4, 5} & set(ranks)}
    suspect = report.suspects[0]
    assert (suspect.kind, suspect.name, suspect.hosts, suspect.ranks) == ("host", "node2", ["node2"], [4, 5])
    assert len(suspect.slow_groups) == suspect.slow_total == 6 and suspect.groups_including == 7  # tp2 is fine
    assert 0.2 < suspect.speed_ratio < 0.3  # 4x slower
    assert suspect.busbw_gbps < suspect.peer_busbw_gbps / 3


def test_slow_link_between_two_hosts_is_named_as_the_pair():
    groups = layout()
    between_1_and_3 = {HOSTS[2], HOSTS[6]}
    report = links_of(groups, lambda pg, ranks: 3.0 if {HOSTS[r] for r in ranks} == between_1_and_3 else 1.0)
    suspect = report.suspects[0]
    assert (suspect.kind, suspect.name) == ("host pair", "node1<->node3")
    assert sorted(suspect.slow_groups) == ["x0_13", "x1_13"] and suspect.ranks == [2, 3, 6, 7]


def test_slow_rank_is_named_when_its_own_groups_are_slow_not_its_hosts_other_rank():
    groups = layout()
    report = links_of(groups, lambda pg, ranks: 5.0 if 5 in ranks else 1.0)
    suspect = report.suspects[0]
    assert (suspect.kind, suspect.name, suspect.hosts) == ("rank", "rank 5", ["node2"])
    assert sorted(suspect.slow_groups) == ["tp2", "x1_02", "x1_12", "x1_23"]
    assert suspect.groups_including == 4  # every group with rank 5 is slow: exclusive to it


def test_no_suspect_when_every_group_is_as_fast_as_its_peers():
    report = links_of(layout(), lambda pg, ranks: 1.0)
    assert report.suspects == [] and all(g.speed_ratio > SLOW_RATIO for g in report.groups)


def test_one_slow_group_is_named_as_a_group():
    report = links_of(layout(), lambda pg, ranks: 4.0 if pg == "x0_01" else 1.0)
    (suspect,) = report.suspects
    assert (suspect.kind, suspect.name, suspect.ranks) == ("group", "group x0_01", [0, 2])
    assert "cannot be told apart" in report.note


def test_groups_of_other_sizes_or_spans_are_not_compared():
    """Intra-host pairs (NVLink) are 4x faster than cross-host pairs by design: not a slow link."""
    report = links_of(layout(), lambda pg, ranks: 1.0)
    assert not any(g.slow for g in report.groups)
    assert (
        analyze_links(loaded_waits(collectives({"only": [0, 1]}, lambda pg, r: 1.0), None), {"only": [0, 1]}, HOSTS)
        is None
    )


def test_finding_names_the_host_with_evidence_and_time_lost():
    groups = layout()
    report = links_of(groups, lambda pg, ranks: 4.0 if pg.startswith("x") and {4, 5} & set(ranks) else 1.0)
    (finding,) = link_findings(report, FindingContext(step_s=0.05, steps=STEPS, times=None, stragglers=None))
    assert finding.kind == "slow_link" and finding.hosts == ["node2"] and finding.ranks == [4, 5]
    assert "host node2" in finding.title and "4.0x slower" in finding.title
    assert finding.evidence[0].startswith("6 of 6 slow process groups include node2; 1 groups including it")
    # 6 groups x 10 collectives x 3.2 ms above the 0.8 ms their peers take: ~0.14 s/step of a 0.05 s step
    assert abs(finding.time_lost_per_step_s - 6 * 3 * TRANSFER_US / 1e6) < 0.2 * 6 * 3 * TRANSFER_US / 1e6
    assert finding.severity == "high"


def test_on_a_device_mesh_the_finding_names_the_dimension_of_the_slow_groups():
    """The cross-host pairs are one mesh dimension (dp), the intra-host pairs another (tp): a slow host's
    slow groups are all dp groups, so the finding says which dimension the link is in."""
    groups = layout()
    mesh = MeshLayout.from_groups((pg, "dp" if pg.startswith("x") else "tp", ranks) for pg, ranks in groups.items())
    slowdown = lambda pg, ranks: 4.0 if pg.startswith("x") and {4, 5} & set(ranks) else 1.0  # noqa: E731
    report = analyze_links(loaded_waits(collectives(groups, slowdown), None), groups, HOSTS, mesh)
    suspect = report.suspects[0]
    assert (suspect.name, suspect.mesh_dim) == ("node2", "dp")
    assert {g.mesh_dim for g in report.groups if g.slow} == {"dp"}
    (finding,) = link_findings(report, FindingContext(step_s=0.05, steps=STEPS, times=None, stragglers=None))
    assert "host node2 in the dp dimension of the device mesh" in finding.title
    # the same collectives without the mesh: no dimension to name
    (plain,) = link_findings(
        links_of(groups, slowdown), FindingContext(step_s=0.05, steps=STEPS, times=None, stragglers=None)
    )
    assert "dimension" not in plain.title
