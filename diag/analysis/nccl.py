"""NCCL's own view of the run, from each rank's nccl.log (``diag.trace.nccl_log``): which transport each rank
uses, NCCL's version and settings, GPUDirect RDMA, channels, NVLS; and the ranks that differ from their peers.

A slower transport than the peers (TCP sockets where the others have InfiniBand or RoCE), an NCCL version or a
setting that differs between ranks, P2P or GPUDirect RDMA off on some nodes, fewer channels than communicators of
the same shape elsewhere: each is a finding naming the ranks and hosts, with what it does to bandwidth. These
findings cost no measured time of their own (the slow collectives they cause are counted where they are measured:
``comms``, ``links``), so they carry 0 s and a severity of their own.

Pure and torch-free: the rank's log, its manifest (host, process groups, torch's NCCL version) and nothing else.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

from diag.analysis.findings import Finding, FindingContext, ranks_text
from diag.analysis.section import Section
from diag.trace.manifest import Manifest
from diag.trace.nccl_log import NcclLog

# NCCL_* settings that differ between ranks by design: not a mismatch
PER_RANK_SETTINGS = frozenset({"NCCL_DEBUG_FILE", "NCCL_COMM_ID", "NCCL_HOSTID"})
RDMA_NOTE = "InfiniBand or RoCE"
# The effect of each, as NCCL's users and maintainers report it (the figures are typical, not measured here)
SOCKET_EFFECT = (
    "NET/Socket moves data through TCP and the CPU: typically 4-5x less bus bandwidth than IB/RoCE between the "
    "same nodes (e.g. busbw 5 vs 25 GB/s reported in NCCL issues), and every collective through these ranks runs "
    "at that speed"
)
SHM_EFFECT = (
    "SHM copies through host memory instead of P2P over NVLink/PCIe: intra-node bandwidth falls several times "
    "(NVLink gives hundreds of GB/s, host memory a few tens)"
)
GDR_EFFECT = (
    "without GPUDirect RDMA the NIC reads and writes host memory, staged by the CPU: lower inter-node bandwidth and "
    "more CPU load (commonly 10-50% of busbw for large messages)"
)
CHANNELS_EFFECT = "each channel is a ring or tree of its own: fewer channels carry proportionally less bandwidth"


@dataclass
class NcclRankView:
    rank: int
    host: str | None
    version: str | None  # from the log, else torch's NCCL version from the manifest
    cuda_driver: int | None
    net_plugin: str | None
    network: str | None  # NCCL's "Using network"
    net_kind: str | None  # IB, RoCE, Socket, or the plugin's network: of its NET connections, else the network chosen
    intra_node: list[str]  # P2P, SHM: how this rank reaches GPUs of its own node
    transports: list[str]  # every kind seen: P2P, SHM, NET/IB, NET/Socket, NVLS, COLLNET
    gdr: bool | None
    nvls: bool
    nvls_multicast: bool | None
    collnet: bool
    channels: int | None  # the most collective channels of its communicators
    communicators: int
    settings: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)  # NCCL WARN messages, the first few
    lines_skipped: int = 0


@dataclass
class NcclGroupView:
    """A torch process group and the NCCL communicator its ranks built for it (matched by commId)."""

    pg: str
    ranks: list[int]
    comm_id: str | None
    transports: list[str]
    net_kinds: list[str]
    channels: int | None


@dataclass
class NcclReport:
    ranks: list[NcclRankView] = field(default_factory=list)
    groups: list[NcclGroupView] = field(default_factory=list)
    ranks_without_log: list[int] = field(default_factory=list)
    versions: dict[str, list[int]] = field(default_factory=dict)  # NCCL version -> ranks
    lines_skipped: int = 0  # over all ranks' logs
    notes: list[str] = field(default_factory=list)

    def group(self, pg: str) -> NcclGroupView | None:
        return next((g for g in self.groups if g.pg == pg), None)

    def rank(self, rank: int) -> NcclRankView | None:
        return next((r for r in self.ranks if r.rank == rank), None)


def analyze_nccl(logs: dict[int, NcclLog], manifests: dict[int, Manifest]) -> NcclReport | None:
    """None when no rank has an NCCL log (capture off, gloo only, or NCCL_DEBUG set by the user elsewhere)."""
    if not logs:
        return None
    report = NcclReport()
    for rank in sorted(logs):
        report.ranks.append(_rank_view(rank, logs[rank], manifests.get(rank)))
    report.ranks_without_log = sorted(set(manifests) - set(logs))
    versions: dict[str, list[int]] = defaultdict(list)
    for view in report.ranks:
        if view.version:
            versions[view.version].append(view.rank)
    report.versions = dict(versions)
    report.lines_skipped = sum(v.lines_skipped for v in report.ranks)
    report.groups = match_groups(logs, pg_ranks_of(manifests))
    if report.ranks_without_log:
        report.notes.append(
            f"{ranks_text(report.ranks_without_log)} wrote no nccl.log (NCCL_DEBUG set by the user, diag.init after "
            "NCCL started, or no NCCL communicator)"
        )
    return report


def _rank_view(rank: int, log: NcclLog, manifest: Manifest | None) -> NcclRankView:
    comms = log.comms
    return NcclRankView(
        rank=rank,
        host=(manifest.host if manifest else None) or log.host,
        version=log.version or (manifest.nccl_version if manifest else None),
        cuda_driver=log.cuda_driver,
        net_plugin=log.net_plugin,
        network=log.network,
        net_kind=log.net_kind(),
        intra_node=sorted(log.intra_node_transports()),
        transports=sorted(log.transports()),
        gdr=log.gdr(),
        nvls=any(c.nvls for c in comms),
        nvls_multicast=log.nvls_multicast,
        collnet=any(c.collnet for c in comms),
        channels=log.max_coll_channels(),
        communicators=len(comms),
        settings=dict(log.settings),
        warnings=log.warnings[:5],
        lines_skipped=log.lines_skipped,
    )


def pg_ranks_of(manifests: dict[int, Manifest]) -> dict[str, list[int]]:
    return {name: list(info.ranks) for m in manifests.values() for name, info in m.process_groups.items() if info.ranks}


def match_groups(logs: dict[int, NcclLog], pg_ranks: dict[str, list[int]]) -> list[NcclGroupView]:
    """Each process group with the communicator its members agree on: a member's candidates are its
    communicators of the group's size where its rank is its position in the group; the commId common to all
    members names the group's (two groups of one size sharing a member are told apart this way)."""
    out = []
    for name, ranks in sorted(pg_ranks.items()):
        members = sorted(ranks)
        if not members or not all(r in logs for r in members):
            continue
        common: set[str] | None = None
        for position, rank in enumerate(members):
            ids = {c.comm_id for c in logs[rank].comms if c.comm_id and c.nranks == len(members) and c.rank == position}
            common = ids if common is None else common & ids
        if not common or len(common) != 1:
            continue
        (comm_id,) = common
        comms = [c for r in members for c in logs[r].comms if c.comm_id == comm_id]
        transports = sorted(set().union(*(c.transports() for c in comms)))
        nets = sorted({f"{c.network}" for comm in comms for c in comm.connections if c.transport == "NET"})
        channels = [c.coll_channels for c in comms if c.coll_channels is not None]
        out.append(NcclGroupView(name, members, comm_id, transports, nets, min(channels) if channels else None))
    return out


def group_evidence(logs: dict[int, NcclLog], pg: str | None, members: list[int], max_warnings: int = 3) -> list[str]:
    """What NCCL's logs say about a process group (triage's hang, a slow group): the communicator's transports,
    each member's network and GPUDirect RDMA, and the NCCL warnings of its members. Empty without logs."""
    members = [r for r in members if r in logs]
    if not members:
        return []
    out = []
    matched = match_groups(logs, {pg: members}) if pg is not None else []
    if matched:
        group = matched[0]
        out.append(
            f"NCCL: process group {pg} is communicator {group.comm_id}, transports {', '.join(group.transports) or '-'}"
            + (f", {group.channels} channels" if group.channels is not None else "")
        )
    by_kind: dict[tuple, list[int]] = defaultdict(list)
    for rank in members:
        log = logs[rank]
        gdr = {True: ", GPUDirect RDMA on", False: ", GPUDirect RDMA off", None: ""}[log.gdr()]
        by_kind[(log.net_kind() or "no network", "/".join(sorted(log.intra_node_transports())), gdr)].append(rank)
    for (net, intra, gdr), ranks in sorted(by_kind.items(), key=lambda kv: kv[1][0]):
        out.append(f"NCCL: {ranks_text(ranks)}: NET/{net}" + (f", {intra} inside the node" if intra else "") + gdr)
    warnings = [(rank, w) for rank in members for w in logs[rank].warnings]
    out += [f"NCCL WARN on rank {rank}: {w}" for rank, w in warnings[:max_warnings]]
    if len(warnings) > max_warnings:
        out.append(f"... {len(warnings) - max_warnings} more NCCL warnings on these ranks")
    return out


# -- findings --------------------------------------------------------------------------------------------------
def nccl_findings(report: NcclReport, ctx: FindingContext) -> list[Finding]:
    return [
        *_transport_findings(report),
        *_version_findings(report),
        *_setting_findings(report),
        *_intra_node_findings(report),
        *_gdr_findings(report),
        *_channel_findings(report),
    ]


def _hosts(views: list[NcclRankView]) -> list[str]:
    return sorted({v.host for v in views if v.host})


def _finding(kind, severity, title, views, evidence, advice) -> Finding:
    return Finding(kind, severity, title, [v.rank for v in views], 0.0, 0.0, evidence, advice, _hosts(views))


def _by(views: list[NcclRankView], key) -> dict:
    out: dict = defaultdict(list)
    for view in views:
        out[key(view)].append(view)
    return out


def _described(views: list[NcclRankView]) -> str:
    hosts = _hosts(views)
    return f"{ranks_text([v.rank for v in views])}" + (f" on {', '.join(hosts[:4])}" if hosts else "")


def _transport_findings(report: NcclReport) -> list[Finding]:
    networked = [v for v in report.ranks if v.net_kind]
    socket = [v for v in networked if v.net_kind == "Socket"]
    rdma = [v for v in networked if v.net_kind != "Socket"]
    if socket and rdma:
        kinds = Counter(v.net_kind for v in rdma)
        evidence = [
            f"{_described(socket)}: NET/Socket",
            *(f"{_described([v for v in rdma if v.net_kind == k])}: NET/{k}" for k in kinds),
            SOCKET_EFFECT,
        ]
        evidence += [f"rank {v.rank}: NET/IB found no device" for v in socket if v.network == "Socket"][:3]
        return [
            _finding(
                "nccl_transport",
                "high",
                f"{len(socket)} of {len(networked)} ranks fell back to TCP sockets where their peers use "
                f"{'/'.join(sorted(kinds))}",
                socket,
                evidence,
                "Check the RDMA devices and drivers on those hosts (ibv_devinfo, NCCL_IB_HCA, the container's "
                "access to /dev/infiniband, the network plugin): NCCL chose Socket there because it found no usable "
                "IB/RoCE device.",
            )
        ]
    hosts = _hosts(networked)
    if socket and not rdma and len(hosts) > 1:
        return [
            _finding(
                "nccl_transport",
                "medium",
                f"Every rank talks across nodes through TCP sockets (NET/Socket) on {len(hosts)} hosts",
                socket,
                [f"{_described(socket)}: NET/Socket", SOCKET_EFFECT],
                f"If the cluster has {RDMA_NOTE}, NCCL did not find it: check NCCL_IB_DISABLE, NCCL_NET, the "
                "network plugin and the RDMA devices in the container.",
            )
        ]
    return []


def _version_findings(report: NcclReport) -> list[Finding]:
    if len(report.versions) < 2:
        return []
    by_version = sorted(report.versions.items(), key=lambda kv: -len(kv[1]))
    minority = [report.rank(r) for _, ranks in by_version[1:] for r in ranks]
    evidence = [f"NCCL {version}: {_described([report.rank(r) for r in ranks])}" for version, ranks in by_version]
    return [
        _finding(
            "nccl_version",
            "high",
            f"Ranks run different NCCL versions ({', '.join(v for v, _ in by_version)})",
            minority,
            evidence + ["mixed NCCL versions can hang or fail at communicator setup, and tune channels differently"],
            "Run every rank with the same NCCL (the same container image, or the same torch wheel and no "
            "LD_LIBRARY_PATH override of libnccl).",
        )
    ]


def _setting_findings(report: NcclReport) -> list[Finding]:
    keys = sorted({k for v in report.ranks for k in v.settings} - PER_RANK_SETTINGS)
    out = []
    differing = []
    for key in keys:
        values = _by(report.ranks, lambda v, key=key: v.settings.get(key, "(not set)"))
        if len(values) > 1:
            differing.append((key, values))
    if differing:
        odd = []
        evidence = []
        for key, values in differing[:6]:
            ordered = sorted(values.items(), key=lambda kv: -len(kv[1]))
            odd += [v for _, views in ordered[1:] for v in views]
            evidence.append(f"{key}: " + "; ".join(f"{value} on {_described(views)}" for value, views in ordered))
        unique = list({v.rank: v for v in odd}.values())
        out.append(
            _finding(
                "nccl_settings",
                "low",
                f"NCCL settings differ between ranks: {', '.join(k for k, _ in differing[:4])}",
                unique,
                evidence,
                "Different NCCL_* settings give ranks different transports, NICs or algorithms; unless a host needs "
                "its own (an interface name), set them the same everywhere.",
            )
        )
    return out


def _intra_node_findings(report: NcclReport) -> list[Finding]:
    p2p = [v for v in report.ranks if "P2P" in v.intra_node]
    shm_only = [v for v in report.ranks if v.intra_node == ["SHM"]]
    disabled = [v for v in report.ranks if v.settings.get("NCCL_P2P_DISABLE") == "1"]
    culprits = {v.rank: v for v in [*shm_only, *disabled]}
    if not culprits or not (p2p or disabled):
        return []
    views = list(culprits.values())
    evidence = [f"{_described(shm_only)}: SHM between GPUs of a node"] if shm_only else []
    evidence += [f"{_described(p2p)}: P2P"] if p2p else []
    evidence += [f"{_described(disabled)}: NCCL_P2P_DISABLE=1"] if disabled else []
    return [
        _finding(
            "nccl_p2p",
            "medium",
            f"P2P between GPUs is off on {len(_hosts(views)) or len(views)} "
            f"{'host' if len(_hosts(views)) == 1 else 'hosts'}: NCCL goes through host memory (SHM) there",
            views,
            [*evidence, SHM_EFFECT],
            "Check NCCL_P2P_DISABLE / NCCL_P2P_LEVEL, ACS and IOMMU settings and the GPU topology (nvidia-smi topo "
            "-m) on those hosts.",
        )
    ]


def _gdr_findings(report: NcclReport) -> list[Finding]:
    on = [v for v in report.ranks if v.gdr is True]
    off = [v for v in report.ranks if v.gdr is False and v.net_kind not in (None, "Socket")]
    if not (on and off):
        return []
    return [
        _finding(
            "nccl_gdr",
            "medium",
            f"GPUDirect RDMA is off on {len(_hosts(off)) or len(off)} hosts where the others use it",
            off,
            [f"{_described(off)}: NET without GDRDMA", f"{_described(on)}: NET/.../GDRDMA", GDR_EFFECT],
            "Load the nvidia-peermem module (or use DMA-BUF) on those hosts and check NCCL_NET_GDR_LEVEL.",
        )
    ]


def _channel_findings(report: NcclReport) -> list[Finding]:
    """Communicators of one shape (ranks, nodes) set up the same number of channels unless a node's topology
    (a missing NVLink, a NIC down) gives it fewer; NCCL makes the ranks of one communicator agree, so ranks are
    compared by the channels of their communicators of each shape."""
    # shape -> rank -> channels, from the groups matched to communicators, and from the ranks' own views
    by_shape: dict[tuple, dict[int, int]] = defaultdict(dict)
    for group in report.groups:
        if group.channels is not None:
            for rank in group.ranks:
                by_shape[(len(group.ranks), bool(group.net_kinds))][rank] = group.channels
    if not by_shape:
        for view in report.ranks:
            if view.channels is not None:
                by_shape[(0, False)][view.rank] = view.channels
    out = []
    for channels in by_shape.values():
        if len(set(channels.values())) < 2:
            continue
        most = max(Counter(channels.values()).items(), key=lambda kv: (kv[1], kv[0]))[0]
        fewer = [report.rank(r) for r, n in sorted(channels.items()) if n < most]
        if not fewer:
            continue
        least = min(channels[v.rank] for v in fewer)
        out.append(
            _finding(
                "nccl_channels",
                "medium",
                f"{len(fewer)} ranks set up fewer NCCL channels ({least}) than their peers ({most})",
                fewer,
                [f"{_described(fewer)}: {least}-{max(channels[v.rank] for v in fewer)} channels", CHANNELS_EFFECT],
                "Compare the GPU/NIC topology of those hosts with the others (nvidia-smi topo -m, NVLink status, "
                "NICs up), and NCCL_MIN_NCHANNELS / NCCL_MAX_NCHANNELS.",
            )
        )
    return out


SECTION = Section("nccl", nccl_findings, in_json="when_present")
