"""Slow links from timing alone: the host, host pair, rank or rank pair common to the process groups whose
collectives are slower than their peers'.

A collective's transfer time is its shortest duration over the group's ranks (``collective_waits.instance_table``):
the time once every rank was there, which a late rank does not lengthen but a slow link does. Its bus bandwidth
(nccl-tests' busbw, ``comms.busbw_factor``) is compared only with collectives of the same op, the same size class
(powers of two), the same group size and the same number of hosts spanned (a group inside a node, on NVLink, is
not the peer of one across nodes), in other groups: each group's median busbw in a class, over the upper
quartile of the groups' medians in that class, then over the median of the groups not slow against that, is the
group's speed there (1: as fast as its peers); a group's speed is the geometric mean over its classes, weighted by
collectives. A group below ``SLOW_RATIO`` is slow.

Then what the slow groups share: for every host, pair of hosts, rank and pair of ranks in a slow group, the
share of slow groups that include it (coverage) and the share of the groups including it that are slow
(exclusivity). The suspect covers the most slow groups, then is the most exclusive to them; on a tie the host
comes before the rank on it (hardware fails per node and NIC), the pair of hosts before either host (a link
between them). One slow group alone is named as a group: nothing tells its members apart.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from diag.analysis.comms import ReducedWaits, algbw_size_bytes, busbw_factor, canonical_op, size_bucket
from diag.analysis.findings import Finding, FindingContext, severity_for
from diag.analysis.section import Section
from diag.trace.mesh import MeshLayout

SLOW_RATIO = 0.6  # a group at less than 60% of its fast peers' busbw is slow
# ... and slower than them collective by collective, not only at the median: a slow link slows every transfer,
# while a busy host's scheduling spreads two healthy groups' transfers over the same wide range
MIN_SLOWER_SHARE = 0.8
MIN_INSTANCES = 3  # timed collectives of a group in a class before its median counts
REFERENCE_QUANTILE = 0.75  # the fast peers: the upper quartile of the groups' medians
MAX_PAIR_GROUP_SIZE = 64  # rank pairs are candidates only in groups up to this size (n^2 pairs)
MAX_SUSPECTS = 3
_KIND_ORDER = {"host pair": 0, "host": 1, "rank pair": 2, "rank": 3, "group": 4}


@dataclass
class GroupSpeed:
    pg: str
    ranks: list[int]
    hosts: list[str]
    collectives: int  # timed collectives compared
    busbw_gbps: float | None  # median over them
    transfer_p50_us: float | None
    speed_ratio: float  # to its fast peers of the same op, size and group size (1: as fast)
    slow: bool
    mesh_dim: str | None = None  # the device-mesh dimension it is, on a run with a mesh
    # of the pairs (one of its collectives, one of a fast peer's of the same class), the share where its was slower
    slower_share: float | None = None


@dataclass
class SlowLink:
    kind: str  # host, host pair, rank, rank pair, group
    name: str  # node0003, node0001<->node0003, rank 3, ranks 2<->3, group 5
    ranks: list[int]
    hosts: list[str]
    slow_groups: list[str]  # the slow groups that include it
    slow_total: int  # slow groups in all
    groups_including: int  # groups that include it, slow or not
    speed_ratio: float  # median speed of the slow groups that include it
    busbw_gbps: float | None  # median busbw of the slow groups that include it
    peer_busbw_gbps: float | None  # median busbw of the groups that are not slow
    lost_s: float  # transfer time above what the fast peers would have taken, over the window
    mesh_dim: str | None = None  # the one device-mesh dimension of every slow group including it, if they share one

    def label(self) -> str:
        """How a sentence names it: "host node2", "hosts node1<->node3", "rank 3", "ranks 2<->3", "group 5"."""
        return {"host": f"host {self.name}", "host pair": f"hosts {self.name}"}.get(self.kind, self.name)


@dataclass
class LinkReport:
    groups: list[GroupSpeed] = field(default_factory=list)  # slowest first
    suspects: list[SlowLink] = field(default_factory=list)  # most likely first
    note: str | None = None


def analyze_links(
    waits: ReducedWaits | None,
    pg_ranks: dict[str, list[int]],
    hosts: dict[int, str],
    mesh: MeshLayout | None = None,
) -> LinkReport | None:
    """None without at least two groups whose collectives can be compared (same op, size class, group size and,
    on a device mesh, dimension: a tp group on NVLink is no peer of a dp group across nodes)."""
    if waits is None:
        return None
    members = _members(waits, pg_ranks)
    dims = {pg: mesh.dim_of(pg) for pg in members} if mesh is not None else {}
    speeds = _instance_speeds(waits, members, hosts, dims)
    if speeds is None:
        return None
    ratios, busbw, transfer, counts = _group_ratios(speeds)
    if len(ratios) < 2:
        return None
    slower = _slower_shares(speeds, {pg for pg, ratio in ratios.items() if ratio < SLOW_RATIO})
    groups = [
        GroupSpeed(
            pg=pg,
            ranks=members.get(pg, []),
            hosts=sorted({hosts[r] for r in members.get(pg, []) if r in hosts}),
            collectives=counts[pg],
            busbw_gbps=busbw[pg],
            transfer_p50_us=transfer[pg],
            speed_ratio=ratio,
            slow=ratio < SLOW_RATIO and slower.get(pg, 0.0) >= MIN_SLOWER_SHARE,
            mesh_dim=dims.get(pg),
            slower_share=slower.get(pg),
        )
        for pg, ratio in ratios.items()
    ]
    groups.sort(key=lambda g: (g.speed_ratio, g.pg))
    report = LinkReport(groups=groups)
    slow = [g for g in groups if g.slow]
    if slow:
        lost = _lost_s(speeds, {g.pg: g.speed_ratio for g in slow})
        report.suspects = _suspects(groups, hosts, lost)
        if report.suspects and report.suspects[0].kind == "group":
            report.note = "one process group is slow: its members cannot be told apart from timing alone"
    return report


def _instance_speeds(
    waits: ReducedWaits, members: dict[str, list[int]], hosts: dict[int, str], dims: dict
) -> pd.DataFrame | None:
    """One row per timed collective of more than one rank: pg, class, busbw, transfer. The class is the op, the
    size's power of two, the group's size, how many hosts it spans (a group inside one node, on NVLink, is not
    compared with one across nodes, on the network) and its mesh dimension (``dims``: pg -> dimension)."""
    inst = waits.instances
    keep = inst["transfer_us"].notna().to_numpy() & (inst["transfer_us"].to_numpy() > 0) & (inst["ranks"] > 1)
    inst = inst[keep]
    if inst.empty:
        return None
    op = inst["op"].astype(str).map(canonical_op)
    size = np.array([len(members.get(str(pg), ())) or n for pg, n in zip(inst["pg"], inst["ranks"])])
    spans = {pg: len({hosts.get(r) for r in ranks}) for pg, ranks in members.items()}
    span = [spans.get(str(pg), 0) for pg in inst["pg"]]
    dim = [dims.get(str(pg)) or "" for pg in inst["pg"]]
    algbw = [
        algbw_size_bytes(o, b, n) / t / 1e3 for o, b, n, t in zip(op, inst["bytes_max"], size, inst["transfer_us"])
    ]
    factor = [busbw_factor(o, n) for o, n in zip(op, size)]
    return pd.DataFrame(
        {
            "pg": inst["pg"].astype(str).to_numpy(),
            "cls": [
                f"{o}/{b}/{n}/{h}/{d}"
                for o, b, n, h, d in zip(op, size_bucket(inst["bytes_max"].to_numpy()), size, span, dim)
            ],
            "busbw_gbps": np.asarray(algbw) * np.asarray(factor),
            "transfer_us": inst["transfer_us"].to_numpy(dtype="float64"),
        }
    )


def _group_ratios(speeds: pd.DataFrame):
    """Per group: its speed over its fast peers (geometric mean over classes, weighted by collectives), and its
    median busbw, median transfer and collectives counted, over the classes it could be compared in.

    The fast peers are found in two passes: first the upper quartile of the groups' medians in a class (the slow
    groups may be half of them), then the median of the groups that pass as not slow against it: one fast
    outlier then does not make its ordinary peers look slow."""
    medians = speeds.groupby(["cls", "pg"])["busbw_gbps"].agg(["median", "size"]).reset_index()
    medians = medians[(medians["size"] >= MIN_INSTANCES) & (medians["median"] > 0)]
    medians = medians[medians.groupby("cls")["pg"].transform("size") >= 2]
    if medians.empty:
        return {}, {}, {}, {}
    first = _ratios(medians, medians.groupby("cls")["median"].transform(lambda m: m.quantile(REFERENCE_QUANTILE)))
    peers = medians[first >= SLOW_RATIO]
    reference = medians["cls"].map(peers.groupby("cls")["median"].median())
    ratios = _ratios(medians, reference.fillna(medians["cls"].map(medians.groupby("cls")["median"].max())))
    logs = np.log(ratios.to_numpy()) * medians["size"].to_numpy()
    weights = medians.groupby("pg")["size"].sum()
    by_group = pd.Series(logs, index=medians.index).groupby(medians["pg"]).sum() / weights
    busbw, transfer, counts = {}, {}, {}
    for pg, classes in medians.groupby("pg")["cls"]:
        rows = speeds[(speeds["pg"] == pg) & speeds["cls"].isin(set(classes))]
        busbw[pg] = float(rows["busbw_gbps"].median())
        transfer[pg] = float(rows["transfer_us"].median())
        counts[pg] = len(rows)
    return {str(pg): float(np.exp(v)) for pg, v in by_group.items()}, busbw, transfer, counts


def _slower_shares(speeds: pd.DataFrame, candidates: set[str]) -> dict[str, float]:
    """Per group slow at its median: of the pairs of one of its collectives and one of a peer's of the same class
    (the groups not slow at the median), the share where its busbw was lower (ties count half)."""
    out = {}
    for pg in candidates:
        below, pairs = 0.0, 0
        for cls, mine in speeds[speeds["pg"] == pg].groupby("cls")["busbw_gbps"]:
            peers = np.sort(
                speeds.loc[(speeds["cls"] == cls) & ~speeds["pg"].isin(candidates), "busbw_gbps"].to_numpy()
            )
            if not len(peers):
                continue
            values = mine.to_numpy()
            higher = len(peers) - np.searchsorted(peers, values, side="right")
            ties = np.searchsorted(peers, values, side="right") - np.searchsorted(peers, values, side="left")
            below += float((higher + 0.5 * ties).sum())
            pairs += len(values) * len(peers)
        if pairs:
            out[pg] = below / pairs
    return out


def _ratios(medians: pd.DataFrame, reference: pd.Series) -> pd.Series:
    return medians["median"] / reference


def _members(waits: ReducedWaits, pg_ranks: dict[str, list[int]]) -> dict[str, list[int]]:
    """Each group's ranks: from the manifests, else the ranks that recorded its collectives."""
    return {**waits.members, **{pg: sorted(ranks) for pg, ranks in pg_ranks.items() if ranks}}


def _lost_s(speeds: pd.DataFrame, ratios: dict[str, float]) -> dict[str, float]:
    """Per slow group: its transfer time beyond what it would have taken at its fast peers' speed."""
    out = {}
    for pg, ratio in ratios.items():
        transfer_s = float(speeds.loc[speeds["pg"] == pg, "transfer_us"].sum()) / 1e6
        out[pg] = transfer_s * (1.0 - ratio)
    return out


def _candidates(group: GroupSpeed) -> list[tuple[str, tuple]]:
    out = [("host", (h,)) for h in group.hosts] + [("rank", (r,)) for r in group.ranks]
    out += [("host pair", pair) for pair in itertools.combinations(group.hosts, 2)]
    if len(group.ranks) <= MAX_PAIR_GROUP_SIZE:
        out += [("rank pair", pair) for pair in itertools.combinations(group.ranks, 2)]
    return out


def _suspects(groups: list[GroupSpeed], hosts: dict[int, str], lost: dict[str, float]) -> list[SlowLink]:
    slow = [g for g in groups if g.slow]
    fast = [g for g in groups if not g.slow]
    peer_busbw = float(np.median([g.busbw_gbps for g in fast])) if fast else None
    if len(slow) == 1:
        (group,) = slow
        return [_link("group", f"group {group.pg}", group.ranks, group.hosts, slow, 1, 1, peer_busbw, lost)]
    including: dict[tuple[str, tuple], list[GroupSpeed]] = defaultdict(list)
    for group in groups:
        for candidate in _candidates(group):
            including[candidate].append(group)
    scored = []
    for (kind, key), members in including.items():
        slow_in = [g for g in members if g.slow]
        if len(slow_in) < 2 or len(members) == len(groups):  # in every group (the one host): tells nothing
            continue
        coverage, exclusivity = len(slow_in) / len(slow), len(slow_in) / len(members)
        scored.append((-coverage, -exclusivity, _KIND_ORDER[kind], kind, key, slow_in, len(members)))
    scored.sort(key=lambda s: s[:3] + (str(s[4]),))
    out = []
    for _, _, _, kind, key, slow_in, n_members in scored[:MAX_SUSPECTS]:
        if kind.startswith("host"):
            ranks = sorted(r for r, h in hosts.items() if h in key)
            name, host_names = "<->".join(key), list(key)
        else:
            ranks = list(key)
            name = f"rank {key[0]}" if kind == "rank" else f"ranks {key[0]}<->{key[1]}"
            host_names = sorted({hosts[r] for r in key if r in hosts})
        out.append(_link(kind, name, ranks, host_names, slow_in, len(slow), n_members, peer_busbw, lost))
    return out


def _link(kind, name, ranks, host_names, slow_in, slow_total, n_members, peer_busbw, lost) -> SlowLink:
    dims = {g.mesh_dim for g in slow_in}
    return SlowLink(
        kind=kind,
        name=name,
        ranks=list(ranks),
        hosts=list(host_names),
        slow_groups=[g.pg for g in slow_in],
        slow_total=slow_total,
        groups_including=n_members,
        speed_ratio=float(np.median([g.speed_ratio for g in slow_in])),
        busbw_gbps=float(np.median([g.busbw_gbps for g in slow_in])),
        peer_busbw_gbps=peer_busbw,
        lost_s=float(sum(lost.get(g.pg, 0.0) for g in slow_in)),
        mesh_dim=dims.pop() if len(dims) == 1 else None,
    )


# -- findings --------------------------------------------------------------------------------------------------
def link_findings(links: LinkReport, ctx: FindingContext) -> list[Finding]:
    if not links.suspects:
        return []
    suspect = links.suspects[0]
    steps = max(ctx.steps, 1)
    per_step = suspect.lost_s / steps
    title_name = {
        "host pair": f"the link between hosts {suspect.name}",
        "rank pair": f"the link between {suspect.name}",
    }
    title_name = title_name.get(suspect.kind, suspect.label())
    if suspect.mesh_dim:
        title_name += f" in the {suspect.mesh_dim} dimension of the device mesh"
    peers = f"{suspect.peer_busbw_gbps:.3g} GB/s" if suspect.peer_busbw_gbps is not None else "their peers"
    evidence = [
        f"{len(suspect.slow_groups)} of {suspect.slow_total} slow process groups include {suspect.name}; "
        f"{suspect.groups_including - len(suspect.slow_groups)} groups including it are not slow",
        f"their collectives reach busbw {suspect.busbw_gbps:.3g} GB/s, {100 * suspect.speed_ratio:.0f}% of their "
        f"fast peers' of the same op, size and group size (groups not slow: {peers})",
        "slow groups: " + ", ".join(suspect.slow_groups[:8]) + (" ..." if len(suspect.slow_groups) > 8 else ""),
    ]
    evidence += [f"also possible: {s.label()}" for s in links.suspects[1:]]
    return [
        Finding(
            "slow_link",
            severity_for(per_step, ctx.step_s),
            f"Collectives through {title_name} are {1 / max(suspect.speed_ratio, 1e-9):.1f}x slower than their peers'",
            suspect.ranks,
            suspect.lost_s,
            per_step,
            evidence,
            "Test that node or link alone (nccl-tests all_reduce_perf between it and a good node); check its NICs "
            "(ibstat, link speed, error counters), cables and switch port, and NCCL's transport there (diag's NCCL "
            "view: Socket instead of IB, GPUDirect RDMA off).",
            suspect.hosts,
        )
    ]


SECTION = Section("links", link_findings, in_json="when_present")
