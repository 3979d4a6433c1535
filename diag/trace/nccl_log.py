"""NCCL's own log (``NCCL_DEBUG=INFO``), parsed into what diag needs: one ``NcclLog`` per process.

Pure and torch-free. NCCL writes one line per event, ``host:pid:tid [cudaDev] NCCL INFO message`` (``... [dev]
file.cc:123 NCCL WARN message`` for warnings); launchers may put anything before the host (``[1,5]<stdout>:``,
``[0] ``, a timestamp) and NCCL 2.27+ may leave pid and tid out. What is read, with the message forms of NCCL
2.18 to 2.28 seen in public logs (tests/fixtures/nccl/ has them, with their sources):

* ``NCCL version 2.18.5+cuda12.0`` (bare or behind the prefix), ``cudaDriverVersion 12020``;
* the network: ``NET/Plugin ...`` (which plugin), ``Using network IB`` (or Socket, IBext_v8, AWS Libfabric),
  ``NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE ...; OOB ...``, ``NET/IB : No device found.``,
  ``NET/Socket : Using [0]eth0:10.0.0.1<0>``, ``GPU Direct RDMA Enabled|Disabled for ... HCA ...``;
* each communicator: ``comm 0x.. rank R nranks N cudaDev D ... - Init START|COMPLETE``, ``comm 0x.. rank R
  nRanks N nNodes M localRanks L ...``, its rings (``Channel 00/02 :  0 1 2 3``, ``Ring 00 : 0 -> 7 -> 6``), trees
  (``Trees [0] 1/-1/-1->0->7 ...``), connections (``Channel 00/0 : 0[0] -> 1[1] via P2P/IPC/read``, ``... [send]
  via NET/IB/0/GDRDMA``, ``Channel 07 : 2[6] -> 3[7] via SHM/direct/direct``), channel counts (``16 coll channels,
  0 collnet channels, 16 nvls channels, 16 p2p channels, 1 p2p channels per peer``), NVLS and CollNet;
* ``NVLS multicast support is [not ]available on dev D``;
* every ``NCCL_*`` setting NCCL reports (``NCCL_IB_HCA set by environment to mlx5_4``, ``... set to ...``);
* warnings, the first ``MAX_WARNINGS``.

Lines of one thread belong to the communicator that thread is initialising (``Init START`` to ``Init COMPLETE``),
so lines of several threads interleaved in one file are attributed correctly. Anything else is counted, never
fatal: ``lines_other`` (NCCL lines of kinds not used: topology dumps, allocations), ``lines_skipped`` (not an
NCCL line, two lines run together by concurrent writers, a known kind that does not parse, the last line of a
file cut short) with a few ``skipped_examples``. An unknown NCCL version is parsed by the same patterns.
Nothing of the log is ever executed or evaluated.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

MAX_WARNINGS = 20
MAX_SKIPPED_EXAMPLES = 5
MAX_CONNECTIONS_PER_COMM = 4096  # a rank connects to its ring and tree neighbours: a few hundred at most
MAX_LINE_CHARS = 4096  # a longer line is not NCCL's (its messages are under 1 KiB): skipped unread

_MARKER_RE = re.compile(r"NCCL (INFO|WARN|TRACE|ABORT)\b")
# The prefix before the marker, read token by token from its end (``host[:pid:tid] [dev] [file.cc:123]``): a
# regex searched over the whole line backtracks through every start position (quadratic in a 4 KB line)
_DEV_TOKEN_RE = re.compile(r"\[-?\d+\]")
_LOC_TOKEN_RE = re.compile(r"\S+:\d+")
_HOST_CUT_RE = re.compile(r"[:\[\]]")
_RANK_TOKEN_RE = re.compile(r"-?\d+")
_BARE_VERSION_TAIL_RE = re.compile(r"NCCL version (?P<v>\S+)\s*")  # fullmatch from the last "NCCL version"
_VERSION_RE = re.compile(r"^NCCL version (?P<v>\S+)\s*$")
_VERSION_PARTS_RE = re.compile(r"^(?P<v>(?P<numbers>\d+\.\d+\.\d+)[^+\s]*?)(?:\+cuda(?P<cuda>\d+(?:\.\d+)*))?$")
_DRIVER_RE = re.compile(r"^cudaDriverVersion (?P<v>\d+)\s*$")
_PLUGIN_RE = re.compile(r"^NET/Plugin\s*:\s*(?P<rest>.*)$")
_LOADED_PLUGIN_RE = re.compile(r"Loaded (?P<kind>net|collnet) plugin (?P<name>.+)$")
_NETWORK_RE = re.compile(r"^Using network (?P<net>\S.*)$")
_NET_IB_RE = re.compile(r"^NET/IB\s*:\s*Using (?P<devs>.*?);\s*OOB (?P<oob>\S*)")
_NET_IB_NONE_RE = re.compile(r"^NET/IB\s*:\s*No device found")
_NET_SOCKET_RE = re.compile(r"^NET/Socket\s*:\s*Using (?P<devs>\[\d+\].*)$")
_DEVICE_RE = re.compile(r"\[(?P<i>\d+)\](?P<name>[^\s<\[]+)")
_GDR_RE = re.compile(r"GPU Direct RDMA (?P<state>Enabled|Disabled) for (?P<what>.*)$")
_NVLS_MC_RE = re.compile(r"^NVLS multicast support is (?P<not>not )?available on dev (?P<dev>\d+)")
_NVLS_COMM_RE = re.compile(r"^(?:NVLS comm 0x|Connected NVLS|NVLS Trees)")
_COLLNET_RE = re.compile(r"^(?:Connected [Cc]oll[Nn]et|CollNet)")
_CHANNEL_COUNT_RE = re.compile(r"(?<!\d)(?P<n>\d+) (?P<kind>coll|collnet|nvls|p2p) channels(?P<per> per peer)?")
# "Channel 00/02 :  0 1": NCCL prints the ring count with two digits; "Channel 00/0 : 0[0] -> ..." (a connection,
# its connIndex with one) cut short after the first rank must not read as a ring
_RING_RE = re.compile(r"^Channel (?P<c>\d+)/(?P<n>\d{2,}) :(?P<ranks>[\s\d-]+)$")  # ranks checked by _ring_ranks
_RING_NEIGHBOURS_RE = re.compile(r"^Ring (?P<c>\d+) : (?P<prev>-?\d+) -> (?P<me>-?\d+) -> (?P<next>-?\d+)\s*$")
_TREES_RE = re.compile(r"^Trees (?P<trees>\[\d+\].*)$")
_TREE_RE = re.compile(r"\[(?P<c>\d+)\] (?P<tree>\S+)")
_CONNECTION_RE = re.compile(
    r"^(?:Channel|Ring) (?P<c>\d+)(?:/(?P<sub>\d+))? : (?P<src>-?\d+)\[(?P<sdev>[^\]]*)\] -> "
    r"(?P<dst>-?\d+)\[(?P<ddev>[^\]]*)\](?: \[(?P<dir>send|receive)\])? via (?P<via>\S.*)$"
)
_NET_VIA_RE = re.compile(r"^NET/(?P<net>.+?)/(?P<dev>\d+)(?:\(\d+\))?(?P<flags>(?:/[^/]+)*)$")
_COMM_INIT_RE = re.compile(
    r"comm (?P<ptr>0x[0-9a-fA-F]+) rank (?P<rank>\d+) nranks (?P<n>\d+) cudaDev (?P<dev>-?\d+)"
    r"(?: nvmlDev (?P<nvml>\d+))? busId (?P<bus>[0-9a-fA-F]+)(?: commId (?P<id>0x[0-9a-fA-F]+))?.*"
    r"- Init (?P<state>START|COMPLETE)"
)
_COMM_TOPO_RE = re.compile(
    r"^comm (?P<ptr>0x[0-9a-fA-F]+) rank (?P<rank>\d+) nRanks (?P<n>\d+) nNodes (?P<nodes>\d+) "
    r"localRanks (?P<local>\d+)"
)
_SETTING_RE = re.compile(r"^(?P<key>NCCL_[A-Z0-9_]+) set (?:by environment )?to (?P<value>.*)$")

# Every message read here has one of these: a line without any is passed over without trying each pattern
_WORTH_READING_RE = re.compile(
    r"NCCL|cudaDriverVersion|NET/|Using network|GPU Direct RDMA|NVLS|Channel |Ring |Trees |comm 0x|channels|"
    r"Connected|CollNet"
)
# Words that start a message of a kind this parser reads: such a line that does not parse is damaged (skipped),
# where any other NCCL line is merely of a kind not used (lines_other).
_KNOWN_STARTS = ("Channel ", "Ring ", "Trees ", "NCCL version")


@dataclass
class NcclConnection:
    """One connection a communicator set up: ``src -> dst`` (ranks in the communicator) on a channel."""

    channel: int
    src: int
    dst: int
    transport: str  # P2P, SHM, NET, COLLNET, NVLS or other
    via: str  # NCCL's words: P2P/IPC/read, NET/IB/0/GDRDMA, SHM/direct/direct ...
    network: str | None = None  # NET only: IB, Socket, IBext_v8, AWS Libfabric ...
    nic: int | None = None  # NET only: NCCL's index of the NIC
    gdr: bool | None = None  # NET only: GPUDirect RDMA (the /GDRDMA flag)
    direction: str | None = None  # send, receive (NET only), None for P2P and SHM


@dataclass
class NcclComm:
    """One NCCL communicator as this process saw it initialise."""

    ptr: str | None = None  # NCCL's comm pointer, 0x...
    comm_id: str | None = None  # commId: the same on every rank of the communicator
    rank: int | None = None  # this process's rank in the communicator
    nranks: int | None = None
    nnodes: int | None = None
    local_ranks: int | None = None
    cuda_dev: int | None = None
    bus_id: str | None = None
    complete: bool = False  # Init COMPLETE seen
    coll_channels: int | None = None
    collnet_channels: int | None = None
    nvls_channels: int | None = None
    p2p_channels: int | None = None
    ring_channels: int | None = None  # the N of "Channel 00/N :": the rings' count
    rings: dict[int, list[int]] = field(default_factory=dict)  # channel -> rank order (only rank 0 logs them)
    ring_neighbours: dict[int, list[int]] = field(default_factory=dict)  # channel -> [prev, me, next] (2.2x)
    trees: dict[int, str] = field(default_factory=dict)  # channel -> NCCL's "up/down->me->parent" text
    nvls: bool = False  # NVLS (NVLink SHARP) set up for this communicator
    collnet: bool = False  # CollNet (in-network reduction, SHARP) set up
    connections: list[NcclConnection] = field(default_factory=list)
    connections_dropped: int = 0  # beyond MAX_CONNECTIONS_PER_COMM

    def transports(self) -> set[str]:
        """Kinds used: P2P, SHM, NET/<network> (NET/IB, NET/Socket ...), COLLNET, NVLS."""
        kinds = {c.transport if c.transport != "NET" else f"NET/{c.network}" for c in self.connections}
        if self.nvls:
            kinds.add("NVLS")
        if self.collnet:
            kinds.add("COLLNET")
        return kinds


@dataclass
class NcclLog:
    """What one process's NCCL log says. Counts tell how much of the log was usable."""

    host: str | None = None
    pid: int | None = None
    version: str | None = None  # 2.18.5 (as NCCL printed it, kept even when not of the usual form)
    cuda_build: str | None = None  # the CUDA NCCL was built for: 12.0
    cuda_driver: int | None = None  # cudaDriverVersion: 12020 is CUDA 12.2's driver API
    net_plugin: str | None = None  # internal, or the loaded plugin's name
    collnet_plugin: str | None = None
    network: str | None = None  # the "Using network" NCCL chose: IB, Socket, IBext_v8, AWS Libfabric ...
    ib_devices: list[str] = field(default_factory=list)  # mlx5_0:1/IB, mlx5_4:1/RoCE ...
    ib_none: bool = False  # "NET/IB : No device found."
    socket_devices: list[str] = field(default_factory=list)  # eth0:10.0.0.1
    gdr_reports: list[str] = field(default_factory=list)  # "Enabled ..." / "Disabled ..." as NCCL wrote them
    nvls_multicast: bool | None = None  # the GPU supports NVLS multicast
    settings: dict[str, str] = field(default_factory=dict)  # NCCL_* NCCL reported, last value kept
    comms: list[NcclComm] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    warnings_total: int = 0
    lines_total: int = 0
    lines_used: int = 0
    lines_other: int = 0
    lines_skipped: int = 0
    skipped_examples: list[str] = field(default_factory=list)

    # -- what the log says, summarised (pure reads of the fields above) ------------------------------------
    @property
    def version_tuple(self) -> tuple[int, int, int] | None:
        match = _VERSION_PARTS_RE.match(self.version or "")
        return tuple(int(p) for p in match.group("numbers").split(".")) if match else None

    def connections(self) -> list[NcclConnection]:
        return [c for comm in self.comms for c in comm.connections]

    def transports(self) -> set[str]:
        return set().union(*(comm.transports() for comm in self.comms)) if self.comms else set()

    def net_kind(self) -> str | None:
        """The inter-node transport: IB, RoCE (IB verbs over Ethernet), Socket (TCP), the plugin's network
        (EFA through AWS Libfabric, ...), from its NET connections; else from "Using network"; else from the
        devices NET/IB or (with no IB device) NET/Socket found; None if nothing says."""
        networks = {c.network for c in self.connections() if c.transport == "NET" and c.network}
        network = sorted(networks, key=lambda n: n != "Socket")[0] if networks else self.network
        if network is None:  # the log was cut before "Using network": what NET/IB and NET/Socket found says it
            network = "IB" if self.ib_devices else "Socket" if self.ib_none and self.socket_devices else None
        if network is None:
            return None
        if network.lower().startswith("ib"):
            layers = {d.split("/")[1] for d in self.ib_devices if "/" in d}
            return "RoCE" if layers == {"RoCE"} else "IB"
        return network

    def gdr(self) -> bool | None:
        """GPUDirect RDMA in use: True if a NET connection has it, False if NET connections exist without it
        (or NCCL said it is disabled and never enabled), None when nothing says."""
        net = [c for c in self.connections() if c.transport == "NET"]
        if net:
            return any(c.gdr for c in net)
        if any(r.startswith("Enabled") for r in self.gdr_reports):
            return True
        return False if self.gdr_reports else None

    def intra_node_transports(self) -> set[str]:
        return {c.transport for c in self.connections() if c.transport in ("P2P", "SHM")}

    def max_coll_channels(self, nranks: int | None = None, nnodes: int | None = None) -> int | None:
        counts = [
            c.coll_channels
            for c in self.comms
            if c.coll_channels is not None
            and (nranks is None or c.nranks == nranks)
            and (nnodes is None or c.nnodes == nnodes)
        ]
        return max(counts) if counts else None

    # -- JSON (the trace cache keeps parsed logs) ----------------------------------------------------------
    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> NcclLog:
        log = _fields_of(cls, data)
        log.comms = [_comm_from_json(c) for c in data.get("comms") or [] if isinstance(c, dict)]
        return log


def _fields_of(cls, data: dict):
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})


def _comm_from_json(data: dict) -> NcclComm:
    comm = _fields_of(NcclComm, data)
    comm.rings = {int(k): v for k, v in (data.get("rings") or {}).items()}
    comm.ring_neighbours = {int(k): v for k, v in (data.get("ring_neighbours") or {}).items()}
    comm.trees = {int(k): v for k, v in (data.get("trees") or {}).items()}
    comm.connections = [_fields_of(NcclConnection, c) for c in data.get("connections") or [] if isinstance(c, dict)]
    return comm


@dataclass
class _Line:
    host: str | None
    pid: int | None
    tid: int | None
    level: str
    message: str


def _split(raw: str) -> _Line | None | str:
    """One log line: an NCCL line, None when it is not one, or "damaged" (two run together, cut short)."""
    markers = len(_MARKER_RE.findall(raw))
    if markers > 1:
        return "damaged"
    if markers == 1:
        marker = _MARKER_RE.search(raw)
        prefix = _prefix(raw[: marker.start()])
        rest = raw[marker.end() :]
        if prefix is None or (rest and not rest.startswith(" ")):
            return "damaged"
        host, pid, tid = prefix
        return _Line(host, pid, tid, marker.group(1), rest.strip())
    bare = _bare_version(raw)
    if bare:  # NCCL <= 2.2x printed its version without the prefix
        return _Line(None, None, None, "VERSION", f"NCCL version {bare.group('v')}")
    return None


def _bare_version(raw: str) -> re.Match | None:
    """``NCCL version 2.18.5+cuda12.0`` at the line's start or after a space, ``:``, ``>`` or ``]`` (a launcher's
    tag), found from its last occurrence rather than by a pattern that backtracks over the whole line."""
    at = raw.rfind("NCCL version ")
    if at < 0 or (at > 0 and raw[at - 1] not in " \t\r\f\v:>]"):
        return None
    return _BARE_VERSION_TAIL_RE.fullmatch(raw, at)


def _ring_ranks(text: str) -> list[int] | None:
    """The ranks of a ring line (``  0 1 2 3``): whitespace-separated integers, at least one, each split out
    first (a pattern of repeated spaced numbers backtracks quadratically over a long run of spaces)."""
    parts = text.split()
    if not parts or not text[0].isspace() or not all(_RANK_TOKEN_RE.fullmatch(p) for p in parts):
        return None
    return [int(p) for p in parts]


def _prefix(before: str) -> tuple[str, int | None, int | None] | None:
    """(host, pid, tid) from what precedes ``NCCL INFO``: ``... host[:pid:tid] [dev] [file.cc:123] `` (anything
    before the host: a launcher's tag, a timestamp); None when it is not that. Linear in the line's length."""
    if not before.endswith(" "):
        return None
    tokens = before.split(" ")[:-1]  # single spaces between the parts, as NCCL writes them
    if tokens and _LOC_TOKEN_RE.fullmatch(tokens[-1]) and len(tokens) > 1 and _DEV_TOKEN_RE.fullmatch(tokens[-2]):
        tokens.pop()
    if len(tokens) < 2 or not _DEV_TOKEN_RE.fullmatch(tokens[-1]):
        return None
    head, pid, tid = tokens[-2], None, None
    parts = head.rsplit(":", 2)
    if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit() and parts[1].isascii() and parts[2].isascii():
        head, pid, tid = parts[0], int(parts[1]), int(parts[2])
    host = _HOST_CUT_RE.split(head)[-1]
    return (host, pid, tid) if host else None


class _Parser:
    def __init__(self) -> None:
        self.log = NcclLog()
        self.open: dict[int | None, NcclComm] = {}  # thread -> the communicator it is initialising
        self.by_ptr: dict[str, NcclComm] = {}

    def feed(self, raw: str) -> None:
        self.log.lines_total += 1
        if not raw.strip():
            self.log.lines_other += 1
            return
        if len(raw) > MAX_LINE_CHARS:
            self._skip(raw)
            return
        line = _split(raw)
        if line is None or line == "damaged":
            self._skip(raw)
            return
        if line.host is not None and self.log.host is None:
            self.log.host, self.log.pid = line.host, line.pid
        if line.level == "WARN":
            self.log.warnings_total += 1
            if len(self.log.warnings) < MAX_WARNINGS:
                self.log.warnings.append(line.message)
            self.log.lines_used += 1
            return
        used = self._message(line)
        if used:
            self.log.lines_used += 1
        elif used is None:
            self._skip(raw)
        else:
            self.log.lines_other += 1

    def _skip(self, raw: str) -> None:
        self.log.lines_skipped += 1
        if len(self.log.skipped_examples) < MAX_SKIPPED_EXAMPLES:
            self.log.skipped_examples.append(raw[:200])

    def _comm(self, tid: int | None) -> NcclComm:
        comm = self.open.get(tid)
        if comm is None:
            comm = self.open[tid] = NcclComm()
            self.log.comms.append(comm)
        return comm

    def _message(self, line: _Line) -> bool | None:
        """True: used; False: an NCCL line of a kind not read; None: a kind read here that did not parse."""
        msg = line.message
        if not _WORTH_READING_RE.search(msg):  # topology dumps, allocations, timings: most of the log
            return None if msg.startswith(_KNOWN_STARTS) else False
        handlers = (
            (self._comm_line, self._global)
            if msg.startswith(("Channel ", "Ring "))
            else (self._global, self._comm_line)
        )
        for handler in handlers:
            result = handler(msg, line.tid)
            if result is not False:
                return result
        return None if msg.startswith(_KNOWN_STARTS) else False

    def _global(self, msg: str, tid: int | None) -> bool:
        log = self.log
        if match := _VERSION_RE.match(msg):
            log.version = match.group("v")
            parts = _VERSION_PARTS_RE.match(log.version)
            if parts:
                log.version, log.cuda_build = parts.group("v"), parts.group("cuda")
            return True
        if match := _DRIVER_RE.match(msg):
            log.cuda_driver = int(match.group("v"))
            return True
        if match := _PLUGIN_RE.match(msg):
            rest = match.group("rest")
            if loaded := _LOADED_PLUGIN_RE.search(rest):
                if loaded.group("kind") == "net":
                    log.net_plugin = loaded.group("name")
                else:
                    log.collnet_plugin = loaded.group("name")
            elif "internal" in rest:
                log.net_plugin = log.net_plugin or "internal"
            return True
        if match := _NETWORK_RE.match(msg):
            log.network = match.group("net")
            return True
        if match := _NET_IB_RE.match(msg):
            log.ib_devices = [m.group("name") for m in _DEVICE_RE.finditer(match.group("devs"))]
            return True
        if _NET_IB_NONE_RE.match(msg):
            log.ib_none = True
            return True
        if match := _GDR_RE.search(msg):
            if len(log.gdr_reports) < 64:
                log.gdr_reports.append(f"{match.group('state')} for {match.group('what')}")
            return True
        if match := _NET_SOCKET_RE.match(msg):
            log.socket_devices = [m.group("name") for m in _DEVICE_RE.finditer(match.group("devs"))]
            return True
        if match := _NVLS_MC_RE.match(msg):
            log.nvls_multicast = match.group("not") is None
            return True
        if match := _SETTING_RE.match(msg):
            value = match.group("value")
            log.settings[match.group("key")] = value[:-1] if re.fullmatch(r"-?\d+\.", value) else value
            return True
        return False

    def _comm_line(self, msg: str, tid: int | None) -> bool | None:
        if match := _COMM_INIT_RE.search(msg):
            self._init_line(match, tid)
            return True
        if match := _COMM_TOPO_RE.match(msg):
            comm = self._comm_for(match.group("ptr"), tid)
            comm.rank, comm.nranks = int(match.group("rank")), int(match.group("n"))
            comm.nnodes, comm.local_ranks = int(match.group("nodes")), int(match.group("local"))
            return True
        if match := _CONNECTION_RE.match(msg):
            self._connection(match, self._comm(tid))
            return True
        if (match := _RING_RE.match(msg)) and (ranks := _ring_ranks(match.group("ranks"))):
            comm = self._comm(tid)
            comm.rings[int(match.group("c"))] = ranks
            comm.ring_channels = int(match.group("n"))
            return True
        if match := _RING_NEIGHBOURS_RE.match(msg):
            comm = self._comm(tid)
            comm.ring_neighbours[int(match.group("c"))] = [int(match.group(k)) for k in ("prev", "me", "next")]
            return True
        if match := _TREES_RE.match(msg):
            trees = {int(m.group("c")): m.group("tree") for m in _TREE_RE.finditer(match.group("trees"))}
            if not trees:
                return None
            self._comm(tid).trees.update(trees)
            return True
        counts = list(_CHANNEL_COUNT_RE.finditer(msg)) if msg.endswith(("per peer", "per peer.")) else []
        if counts:
            comm = self._comm(tid)
            for count in counts:
                if not count.group("per"):
                    setattr(comm, f"{count.group('kind')}_channels", int(count.group("n")))
            return True
        if _NVLS_COMM_RE.match(msg):
            self._comm(tid).nvls = True
            return True
        if _COLLNET_RE.match(msg):
            self._comm(tid).collnet = True
            return True
        return False

    def _comm_for(self, ptr: str, tid: int | None, starting: bool = False) -> NcclComm:
        """The communicator NCCL calls ``ptr``: the one this thread is initialising, named now if unnamed.
        At ``Init START`` an unnamed one that already holds lines is not it: since NCCL 2.22 connections are
        made at a communicator's first collective, after its Init COMPLETE, on the thread that may start the
        next one; they stay in a communicator of their own rather than be given to the wrong one."""
        comm = self.by_ptr.get(ptr)
        if comm is None:
            comm = self._comm(tid)
            if comm.ptr not in (None, ptr) or (starting and _has_content(comm)):
                comm = self.open[tid] = NcclComm()
                self.log.comms.append(comm)
            comm.ptr = ptr
            self.by_ptr[ptr] = comm
        return comm

    def _init_line(self, match: re.Match, tid: int | None) -> None:
        comm = self._comm_for(match.group("ptr"), tid, starting=match.group("state") == "START")
        comm.rank, comm.nranks = int(match.group("rank")), int(match.group("n"))
        comm.cuda_dev, comm.bus_id = int(match.group("dev")), match.group("bus")
        comm.comm_id = match.group("id") or comm.comm_id
        if match.group("state") == "COMPLETE":
            comm.complete = True
            if self.open.get(tid) is comm:  # lines after this on the thread belong to a new communicator
                del self.open[tid]

    def _connection(self, match: re.Match, comm: NcclComm) -> None:
        if len(comm.connections) >= MAX_CONNECTIONS_PER_COMM:
            comm.connections_dropped += 1
            return
        via = match.group("via")
        connection = NcclConnection(
            channel=int(match.group("c")),
            src=int(match.group("src")),
            dst=int(match.group("dst")),
            transport=_transport_of(via),
            via=via,
            direction=match.group("dir"),
        )
        if net := _NET_VIA_RE.match(via):
            flags = net.group("flags").split("/")
            connection.network, connection.nic = net.group("net"), int(net.group("dev"))
            connection.gdr = "GDRDMA" in flags
        comm.connections.append(connection)


def _transport_of(via: str) -> str:
    head = via.split("/", 1)[0].upper()
    if head in ("P2P", "SHM", "NET", "COLLNET", "NVLS"):
        return head
    return "SHM" if "shared memory" in via else "other"


def parse_lines(lines) -> NcclLog:
    """An NcclLog of one process from its log lines (an iterable of str, without line ends)."""
    parser = _Parser()
    for raw in lines:
        parser.feed(raw.rstrip("\r\n"))
    log = parser.log
    log.comms = _merged(c for c in log.comms if _has_content(c))
    return log


def _merged(comms) -> list[NcclComm]:
    """With one named communicator, lines no initialising thread claimed (connections NCCL 2.22+ makes at the
    first collective, on another thread) can only be its own: they are given to it. With several, they stay
    apart, in communicators without a name."""
    comms = list(comms)
    named = [c for c in comms if c.ptr is not None]
    if len(named) != 1:
        return comms
    (owner,) = named
    for comm in comms:
        if comm is owner:
            continue
        room = MAX_CONNECTIONS_PER_COMM - len(owner.connections)
        owner.connections.extend(comm.connections[:room])
        owner.connections_dropped += comm.connections_dropped + max(0, len(comm.connections) - room)
        owner.rings.update(comm.rings)
        owner.ring_neighbours.update(comm.ring_neighbours)
        owner.trees.update(comm.trees)
        owner.nvls |= comm.nvls
        owner.collnet |= comm.collnet
        for name in ("coll_channels", "collnet_channels", "nvls_channels", "p2p_channels", "ring_channels"):
            if getattr(owner, name) is None:
                setattr(owner, name, getattr(comm, name))
    return [owner]


def _has_content(comm: NcclComm) -> bool:
    return bool(
        comm.ptr
        or comm.connections
        or comm.rings
        or comm.ring_neighbours
        or comm.trees
        or comm.coll_channels is not None
        or comm.nvls
        or comm.collnet
    )


def parse_text(text: str) -> NcclLog:
    """An NcclLog of one process from the text of its log (NCCL_DEBUG_FILE). A last line without its line end
    was cut short (the file is being written, or the process died mid-line): counted as skipped."""
    lines = text.split("\n")
    tail = lines.pop()
    log = parse_lines(lines)
    if tail.strip():
        log.lines_total += 1
        log.lines_skipped += 1
        if len(log.skipped_examples) < MAX_SKIPPED_EXAMPLES:
            log.skipped_examples.append(tail[:200])
    return log


def split_processes(text: str) -> dict[tuple[str, int | None], list[str]]:
    """The lines of a log several processes wrote together (stderr of a launcher, a pasted log), by (host, pid):
    what one NCCL_DEBUG_FILE per process would have held. A line without the prefix (NCCL's bare version line,
    a launcher's own output) goes with the preceding NCCL line's process."""
    out: dict[tuple[str, int | None], list[str]] = {}
    current: tuple[str, int | None] | None = None
    for raw in text.splitlines():
        line = _split(raw) if len(raw) <= MAX_LINE_CHARS else None
        if isinstance(line, _Line) and line.host is not None:
            current = (line.host, line.pid)
        if current is not None:
            out.setdefault(current, []).append(raw)
    return out
