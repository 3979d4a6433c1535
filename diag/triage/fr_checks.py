"""Cross-rank checks of Flight Recorder dumps that the (pg, seq) table of collectives cannot express. No torch.

``sources.read_fr_dir`` turns each rank's dump into rows of that table (one row per rank and (pg, seq)); what
needs the entries themselves is here:

* coalesced ops: NCCL records every op of a coalesced group under one collective_seq_id, then an end marker
  (``coalesced``, ``ALLGATHER_coalesced``, ...). The row of that seq describes every op of the group, so a
  mismatch inside the group is a mismatch of the row.
* what must match across ranks, per op: the root of ``gather`` alone has an output, the root of ``scatter``
  alone an input, and ``all_to_all`` may move different amounts on each rank; those parts are not compared
  (``comparable``). ``all_to_all`` is checked as a whole: with split sizes (dump version 2.11 on), what rank i
  sends to j must be what j receives from i; without them, the elements sent over all ranks must equal those
  received.
* point-to-point ops (``send 0->1``, ``recv 1<-0``; group-local ranks): the k-th send from i to j is matched
  with the k-th recv on j from i; their sizes must agree, and an op still pending whose peer never issued its
  counterpart names the peer.
* members: gloo's ``pg_config`` names only the default group (often without its ranks); a group's members are
  then the ranks whose dumps list it (``pg_status`` holds one record per group the rank belongs to).
* gloo's completion: gloo records no completion state and its ``last_completed_collective`` lags behind, so an
  entry that every member has gone past (each issued a later seq of the group) is taken as returned, and so is
  a symmetric collective (every member sends to and receives from the others) that some member returned from.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from diag.triage.flight_recorder import DEFAULT_PG, FRDump, FREntry, sizes_text

# the end markers of a coalesced group: they carry no tensors of their own
COALESCED_END_OPS = ("coalesced", "ALLGATHER_coalesced", "REDUCE_SCATTER_coalesced")
ALL_TO_ALL_OPS = ("all_to_all", "all_to_all_single", "all_to_all_v_single", "alltoall", "alltoall_base")
# collectives whose sizes may differ across ranks by design: not compared shape by shape
UNEVEN_OPS = (*ALL_TO_ALL_OPS, "all_gather_v", "reduce_scatter_v")
# ops one rank may leave before another entered them (a root, a sender): returning from them proves nothing
# about the other members
ROOTED_OPS = ("gather", "scatter", "reduce", "broadcast")


@dataclass(frozen=True)
class OpGroup:
    """One rank's record of one (pg, seq): a single op, or every op of a coalesced group."""

    entries: tuple[FREntry, ...]

    @property
    def last(self) -> FREntry:
        return self.entries[-1]

    @property
    def ops(self) -> tuple[FREntry, ...]:
        """The ops that move data (without the group's end marker)."""
        body = tuple(e for e in self.entries if e.op not in COALESCED_END_OPS)
        return body or self.entries

    @property
    def op(self) -> str:
        names = [e.op for e in self.ops]
        if len(self.entries) == 1:
            return names[0]
        marker = self.last.op if self.last.op in COALESCED_END_OPS else "coalesced"
        counts = Counter(names)
        return f"{marker}[" + ", ".join(f"{n}×{c}" if c > 1 else n for n, c in counts.items()) + "]"


@dataclass
class FRProblem:
    """A verdict found from the entries themselves, for analysis.triage to report."""

    verdict: str  # "desync" or "missing_ranks"
    culprits: list[int]
    pg: str
    seq: int
    op: str
    sizes: str
    evidence: list[str] = field(default_factory=list)
    start_us: float = float("inf")
    dtype: str = ""
    waiting: dict[int, str] = field(default_factory=dict)  # rank -> the op it is inside ("send 0->1")


def op_groups(dump: FRDump) -> list[OpGroup]:
    """A rank's collectives, coalesced ops grouped: consecutive entries of one group with one seq. A seq seen
    again later (a ring buffer that wrapped) starts a new group; the newest is kept by the caller."""
    groups: list[list[FREntry]] = []
    for entry in dump.entries:
        if entry.is_p2p or entry.seq < 0:
            continue
        if groups and (groups[-1][-1].pg, groups[-1][-1].seq) == (entry.pg, entry.seq):
            groups[-1].append(entry)
        else:
            groups.append([entry])
    return [OpGroup(tuple(g)) for g in groups]


def comparable(entry: FREntry) -> tuple[tuple, tuple, str]:
    """(sizes, dtypes, text) of what every member of the group must agree on for this op."""
    op = entry.op
    if op in UNEVEN_OPS:
        return (), (), ""
    if op == "gather":  # only the root has an output
        sizes, dtypes = entry.input_sizes, entry.input_dtypes
        return sizes, dtypes, f"{sizes_text(sizes)} ->"
    if op == "scatter":  # only the root has an input
        sizes, dtypes = entry.output_sizes, entry.output_dtypes
        return sizes, dtypes, f"-> {sizes_text(sizes)}"
    text = f"{sizes_text(entry.input_sizes)} -> {sizes_text(entry.output_sizes)}"
    if entry.output_dtypes and entry.input_dtypes and set(entry.output_dtypes) != set(entry.input_dtypes):
        text += f" ({','.join(map(str, entry.output_dtypes))} out)"
    return (entry.input_sizes, entry.output_sizes), entry.input_dtypes or entry.output_dtypes, text


def comparable_numel(entry: FREntry) -> int:
    """Elements every member moves alike: the root's extra output of gather (input of scatter) left out."""
    if entry.op in UNEVEN_OPS:
        return 0
    return numel(entry.output_sizes if entry.op == "scatter" else entry.input_sizes)


def numel(sizes: tuple) -> int:
    total = 0
    for shape in sizes:
        dims = shape if isinstance(shape, tuple) else (shape,)
        total += math.prod(int(d) if isinstance(d, int) else 0 for d in dims)
    return total


def infer_members(dumps: dict[int, FRDump], known: dict[str, list[int]], world_size: int) -> dict[str, list[int]]:
    """Members of every group the dumps mention: pg_config's where it lists them, else the ranks whose dumps
    list the group (its pg_status or its entries); the default group is every rank."""
    listed: dict[str, set[int]] = defaultdict(set)
    for rank, dump in dumps.items():
        for pg in (*dump.last_completed_seq, *(e.pg for e in dump.entries)):
            listed[pg].add(rank)
    members = {pg: list(ranks) for pg, ranks in known.items() if ranks}
    members.setdefault(DEFAULT_PG, list(range(world_size)))
    for pg, ranks in listed.items():
        members.setdefault(pg, sorted(ranks))
    return members


def returned_below(groups: dict[int, list[OpGroup]], members: dict[str, list[int]]) -> dict[str, int]:
    """Per group, the seq below which every member has gone past (issued a later seq of the group): the
    collectives below it returned on every member, whatever a lagging ``last_completed_collective`` says."""
    last_seq: dict[tuple[str, int], int] = {}
    for rank, rank_groups in groups.items():
        for group in rank_groups:
            key = (group.last.pg, rank)
            last_seq[key] = max(last_seq.get(key, -1), group.last.seq)
    floors = {}
    for pg, ranks in members.items():
        if ranks and all((pg, r) in last_seq for r in ranks):
            floors[pg] = min(last_seq[(pg, r)] for r in ranks)
    return floors


def returned_on_a_member(groups: dict[int, list[OpGroup]], members: dict[str, list[int]]) -> set[tuple[str, int]]:
    """The (pg, seq) of symmetric collectives that a member returned from while every member issued them: no
    member can return before all have sent their part, so on the others it is done or about to be (gloo bumps
    ``last_completed_collective`` after ``wait()`` returns, and a dump taken in between reads it pending)."""
    issued: dict[tuple[str, int], set[int]] = defaultdict(set)
    returned: set[tuple[str, int]] = set()
    for rank, rank_groups in groups.items():
        for group in rank_groups:
            last = group.last
            if last.is_p2p or any(e.op in ROOTED_OPS for e in group.ops):
                continue
            issued[(last.pg, last.seq)].add(rank)
            if last.completed:
                returned.add((last.pg, last.seq))
    return {key for key in returned if set(members.get(key[0], [])) <= issued[key] and members.get(key[0])}


# -- all_to_all ------------------------------------------------------------------------------------------------


def all_to_all_problems(groups: dict[int, list[OpGroup]], members: dict[str, list[int]]) -> list[FRProblem]:
    by_key: dict[tuple[str, int], dict[int, FREntry]] = defaultdict(dict)
    for rank, rank_groups in groups.items():
        for group in rank_groups:
            if len(group.entries) == 1 and group.last.op in ALL_TO_ALL_OPS:
                by_key[(group.last.pg, group.last.seq)][rank] = group.last
    problems = []
    for (pg, seq), entries in sorted(by_key.items()):
        ranks = members.get(pg, [])
        if not ranks or any(r not in entries for r in ranks) or len({e.op for e in entries.values()}) > 1:
            continue  # a rank missing from it is a hang; a different op a desync: both judged elsewhere
        problem = _split_mismatch(pg, seq, entries, ranks) or _total_mismatch(pg, seq, entries, ranks)
        if problem:
            problems.append(problem)
    return problems


def _split_mismatch(pg: str, seq: int, entries: dict[int, FREntry], ranks: list[int]) -> FRProblem | None:
    """Dump version 2.11 on: element counts per peer; rank i's input split j must be rank j's output split i."""
    n = len(ranks)
    if any(len(entries[r].input_split_sizes) != n or len(entries[r].output_split_sizes) != n for r in ranks):
        return None
    bad = []
    for i, src in enumerate(ranks):
        for j, dst in enumerate(ranks):
            sent, received = entries[src].input_split_sizes[j], entries[dst].output_split_sizes[i]
            if sent != received:
                bad.append((src, dst, sent, received))
    if not bad:
        return None
    # the rank in most mismatched pairs declared the wrong splits; when none stands out, every rank involved
    count = Counter(r for src, dst, _, _ in bad for r in {src, dst})
    top = max(count.values())
    culprits = sorted(r for r, c in count.items() if c == top)
    if len(culprits) > 1 and top == 1:
        culprits = sorted(count)
    evidence = [f"all_to_all at {_where(pg, seq)}: what one rank sends does not match what its peer receives:"]
    evidence += [
        f"  rank {s} sends {a} elements to rank {d}, rank {d} receives {b} from rank {s}" for s, d, a, b in bad
    ]
    entry = entries[ranks[0]]
    sizes = f"{sum(sum(entries[r].input_split_sizes) for r in ranks)} elements sent in all"
    return FRProblem("desync", culprits, pg, seq, entry.op, sizes, evidence, _start_us(entries.values()))


def _total_mismatch(pg: str, seq: int, entries: dict[int, FREntry], ranks: list[int]) -> FRProblem | None:
    sent = sum(numel(entries[r].input_sizes) for r in ranks)
    received = sum(numel(entries[r].output_sizes) for r in ranks)
    if not sent or not received or sent == received:
        return None
    evidence = [
        f"all_to_all at {_where(pg, seq)}: the members send {sent} elements in all and receive {received}; "
        "the dumps hold no split sizes (version 2.11 records them), so which rank is wrong is unknown",
        *(
            f"  rank {r}: in {sizes_text(entries[r].input_sizes)}, out {sizes_text(entries[r].output_sizes)}"
            for r in ranks
        ),
    ]
    entry = entries[ranks[0]]
    sizes = f"{sent} elements sent in all, {received} received"
    return FRProblem("desync", [], pg, seq, entry.op, sizes, evidence, _start_us(entries.values()))


# -- point-to-point ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class P2POp:
    rank: int  # global rank that recorded it
    entry: FREntry
    src: int  # global ranks
    dst: int


def p2p_problems(dumps: dict[int, FRDump], members: dict[str, list[int]]) -> tuple[list[FRProblem], list[str]]:
    """Size mismatches of matched send/recv pairs, and pending ops whose peer never issued the counterpart.
    Also notes (ops whose group's members are unknown, so whose peer cannot be named)."""
    sends: dict[tuple[str, int, int], list[P2POp]] = defaultdict(list)
    recvs: dict[tuple[str, int, int], list[P2POp]] = defaultdict(list)
    notes = []
    for rank, dump in dumps.items():
        for entry in dump.entries:
            if not entry.is_p2p or entry.src is None or entry.dst is None:
                continue
            ranks = sorted(members.get(entry.pg, []))
            if max(entry.src, entry.dst) >= len(ranks):
                notes.append(f"{entry.op} in process group {entry.pg}: its members are unknown, not matched")
                continue
            op = P2POp(rank, entry, ranks[entry.src], ranks[entry.dst])
            (sends if entry.op == "send" else recvs)[(entry.pg, op.src, op.dst)].append(op)
    problems = []
    for key in sorted(set(sends) | set(recvs)):
        pg, src, dst = key
        sent, received = sends.get(key, []), recvs.get(key, [])
        for k in range(max(len(sent), len(received))):
            send = sent[k] if k < len(sent) else None
            recv = received[k] if k < len(received) else None
            problem = _p2p_pair(pg, src, dst, send, recv, dumps)
            if problem:
                problems.append(problem)
                break  # later pairs of this link are shifted by this one: not judged
    return problems, sorted(set(notes))


def _p2p_pair(pg, src, dst, send: P2POp | None, recv: P2POp | None, dumps) -> FRProblem | None:
    if send and recv:
        if numel(send.entry.input_sizes) == numel(recv.entry.output_sizes) and set(send.entry.input_dtypes) == set(
            recv.entry.output_dtypes or recv.entry.input_dtypes or send.entry.input_dtypes
        ):
            return None
        evidence = [
            f"send {src}->{dst} in process group {pg} ({sizes_text(send.entry.input_sizes)} "
            f"{','.join(map(str, send.entry.input_dtypes))}) is matched by a recv of "
            f"{sizes_text(recv.entry.output_sizes)} {','.join(map(str, recv.entry.output_dtypes))}: "
            "sizes differ, so one of the two ranks posted the wrong tensor",
            f"  rank {src}: send at {send.entry.call_site or 'call site unknown'}",
            f"  rank {dst}: recv at {recv.entry.call_site or 'call site unknown'}",
        ]
        sizes = sizes_text(send.entry.input_sizes)
        inside = {r: f"{o.entry.op} {src}->{dst}" for r, o in ((src, send), (dst, recv)) if not o.entry.completed}
        return FRProblem(
            "desync",
            sorted({src, dst}),
            pg,
            send.entry.seq,
            "send/recv",
            sizes,
            evidence,
            _start_us([send.entry, recv.entry]),
            waiting=inside,
        )
    waiting = send or recv
    if waiting is None or waiting.entry.completed:
        return None  # it completed: its peer took part, only the peer's dump is older or wrapped
    peer = dst if send else src
    counterpart = "recv" if send else "send"
    reason = "has no Flight Recorder dump" if peer not in dumps else f"never issued the matching {counterpart}"
    evidence = [
        f"rank {waiting.rank} issued {waiting.entry.op} {src}->{dst} in process group {pg} "
        f"({sizes_text(waiting.entry.input_sizes or waiting.entry.output_sizes)}), still {waiting.entry.state or 'pending'}; "
        f"rank {peer} {reason}",
        f"  rank {waiting.rank}: {waiting.entry.op} at {waiting.entry.call_site or 'call site unknown'}",
    ]
    sizes = sizes_text(waiting.entry.input_sizes or waiting.entry.output_sizes)
    inside = {waiting.rank: f"{waiting.entry.op} {src}->{dst}"}
    return FRProblem(
        "missing_ranks",
        [peer],
        pg,
        waiting.entry.seq,
        waiting.entry.op,
        sizes,
        evidence,
        _start_us([waiting.entry]),
        waiting=inside,
    )


def _start_us(entries) -> float:
    times = [e.time_created_ns / 1000 for e in entries if e.time_created_ns]
    return min(times) if times else float("inf")


def _where(pg: str, seq: int) -> str:
    return f"seq {seq} of process group {pg}"
