"""Flight Recorder verdict cases: NCCL-format dumps rebuilt from PyTorch's analyser tests, NCCL-format dumps
of the hard cases torch's analyser checks (send/recv, coalesced groups, states, all_to_all split sizes), and
real gloo dumps written by torch 2.13 (tests/fixtures/flight_recorder, made by tests/triage/fr_job.py).

Each case is a directory of per-rank dump files, its expected verdict and culprit ranks. The NCCL dumps are
written as ProcessGroupNCCL writes them (the keys of FlightRecorder.hpp, ``nccl:<op>`` names, one
collective_seq_id per collective and per coalesced group, pg_config and pg_status), since no NCCL GPU job can run
here. The upstream cases (``test/distributed/flight_recorder/test_fr_analysis.py``) are rebuilt from its
events: its pairwise ``match_one_event`` checks become jobs of three ranks with one odd rank (so that the odd
one can be named; on two ranks it is a tie), and its ``testBuildDB`` dumps keep their two ranks but get the
sequence numbers a real recorder writes (the upstream fixtures put every entry at collective_seq_id "0", which
no recorder does: torch's analyser matches by order, diag by sequence number).

Used by tests/unit/triage/test_fr_cases.py and benchmarks/fr_cases.py (which also runs on a diag without them).
Imports neither diag nor torch.
"""

from __future__ import annotations

import json
import pickle
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "flight_recorder"
BASE_NS = 1_790_000_000_000_000_000
FRAMES = [{"name": "train_step", "filename": "/job/train.py", "line": 42}]
# the collectives of torch's analyser (components/types.py COLLECTIVES), as upstream's test_all_events runs them
UPSTREAM_COLLECTIVES = (
    "ALLGATHER_coalesced",
    "REDUCE_SCATTER_coalesced",
    "_all_gather_base",
    "_broadcast_oop",
    "_reduce_oop",
    "_reduce_scatter_base",
    "all_gather",
    "all_gather_into_tensor_coalesced",
    "all_gather_single",
    "all_gather_v",
    "all_reduce",
    "all_reduce_barrier",
    "all_to_all",
    "all_to_all_single",
    "all_to_all_v_single",
    "allreduce_coalesced",
    "barrier",
    "broadcast",
    "gather",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_single",
    "reduce_scatter_tensor_coalesced",
    "reduce_scatter_v",
    "scatter",
)


@dataclass
class Case:
    name: str
    source: str  # "pytorch test_fr_analysis.py", "issue 29", "real gloo job"
    verdicts: tuple[str, ...]  # the right verdicts (first: the expected one)
    culprits: list[int] | None  # None: any culprit set is taken as right
    write: object  # callable(directory) writing the dump files
    note: str = ""

    @property
    def expected(self) -> str:
        culprits = "either" if self.culprits is None else ",".join(map(str, self.culprits)) or "-"
        return f"{self.verdicts[0]} [{culprits}]"


# -- NCCL-format dumps ------------------------------------------------------------------------------------------


@dataclass
class Job:
    """The entries of every rank of one job, numbered as ProcessGroupNCCL numbers them."""

    world: int
    groups: dict[str, list[int]] = field(default_factory=dict)  # pg name -> global ranks
    version: str = "2.10"
    entries: dict[int, list[dict]] = field(default_factory=lambda: defaultdict(list))
    seq: dict[tuple[int, str], int] = field(default_factory=lambda: defaultdict(int))
    p2p_seq: dict[tuple[int, str], int] = field(default_factory=lambda: defaultdict(int))
    clock: int = 0

    def __post_init__(self):
        self.groups.setdefault("0", list(range(self.world)))

    def op(self, rank, name, inputs, outputs, state="completed", pg="0", dtype="Float", out_dtype=None, **extra):
        """One collective on one rank (its own seq); a list of (name, inputs, outputs) is a coalesced group."""
        self.seq[(rank, pg)] += 1
        parts = name if isinstance(name, list) else [(name, inputs, outputs)]
        for part, ins, outs in parts:
            self._append(rank, pg, part, ins, outs, state, dtype, out_dtype, False, **extra)
        return self

    def coll(self, name, inputs, outputs, state="completed", ranks=None, pg="0", **extra):
        for rank in ranks if ranks is not None else self.groups[pg]:
            self.op(rank, name, inputs, outputs, state, pg, **extra)
        self.clock += 1
        return self

    def p2p(self, rank, kind, peer, sizes, state="completed", pg="0"):
        self.p2p_seq[(rank, pg)] += 1
        local = sorted(self.groups[pg])
        me, other = local.index(rank), local.index(peer)
        name = f"send {me}->{other}" if kind == "send" else f"recv {me}<-{other}"
        ins, outs = (sizes, sizes)
        self._append(rank, pg, name, ins, outs, state, "Float", None, True)
        return self

    def steps(self, n=3):
        """A healthy history: n completed all_reduces on every rank."""
        for _ in range(n):
            self.coll("all_reduce", [[1024]], [[1024]])
        return self

    def _append(self, rank, pg, name, ins, outs, state, dtype, out_dtype, is_p2p, **extra):
        entries = self.entries[rank]
        self.clock += 1
        entry = {
            "record_id": len(entries),
            "pg_id": int(pg) if pg.isdigit() else 0,
            "process_group": (pg, "default_pg" if pg == "0" else f"group_{pg}"),
            "collective_seq_id": self.seq[(rank, pg)],  # p2p ops carry the group's current one
            "p2p_seq_id": self.p2p_seq[(rank, pg)],
            "op_id": len(entries) + 1,
            "profiling_name": f"nccl:{name}",
            "time_created_ns": BASE_NS + self.clock * 1_000_000 + rank * 1_000,
            "duration_ms": 0.5 if state == "completed" else None,
            "input_sizes": ins,
            "input_dtypes": [dtype] * len(ins) if ins and ins != [[]] else [],
            "output_sizes": outs,
            "output_dtypes": [out_dtype or dtype] * len(outs) if outs and outs != [[]] else [],
            "state": state,
            "time_discovered_started_ns": None if state == "scheduled" else BASE_NS + self.clock * 1_000_000 + 10,
            "time_discovered_completed_ns": BASE_NS + self.clock * 1_000_000 + 20 if state == "completed" else None,
            "retired": state == "completed",
            "timeout_ms": 600_000,
            "is_p2p": is_p2p,
            "frames": FRAMES,
        }
        entry.update(extra)
        entries.append(entry)

    def dump(self, rank) -> dict:
        config = {
            pg: {"name": pg, "desc": "default_pg" if pg == "0" else f"group_{pg}", "ranks": str(m)}
            for pg, m in self.groups.items()
            if rank in m
        }
        status = {}
        for pg in config:
            mine = [e for e in self.entries[rank] if e["process_group"][0] == pg and not e["is_p2p"]]
            done = [e["collective_seq_id"] for e in mine if e["state"] == "completed"]
            started = [e["collective_seq_id"] for e in mine if e["state"] != "scheduled"]
            status[pg] = {
                "last_enqueued_collective": max((e["collective_seq_id"] for e in mine), default=-1),
                "last_started_collective": max(started, default=-1),
                "last_completed_collective": max(done, default=-1),
            }
        return {
            "version": self.version,
            "pg_config": config,
            "pg_status": status,
            "comm_lib_version": "2.21.5",
            "entries": self.entries[rank],
        }

    def writer(self, without=(), as_json=False):
        def write(directory: Path):
            for rank in range(self.world):
                if rank in without:
                    continue
                path = directory / f"nccl_trace_rank_{rank}"
                if as_json:
                    path.write_text(json.dumps(self.dump(rank)))
                else:
                    path.write_bytes(pickle.dumps(self.dump(rank)))

        return write


def _upstream_pair(name, odd_rank, first, second, verdicts, culprits, world=3):
    """test_fr_analysis.py's match_one_event(first, second): every rank but ``odd_rank`` records ``first``."""
    job = Job(world).steps()
    for rank in range(world):
        op, ins, outs, state, extra = second if rank == odd_rank else first
        job.op(rank, op, ins, outs, state, **extra)
    return Case(name, "pytorch test_fr_analysis.py", verdicts, culprits, job.writer())


def upstream_cases() -> list[Case]:
    e1 = ("all_reduce", [[4, 4]], [[4, 4]], "started", {})
    cases = [
        _upstream_pair("upstream: all_reduce matches itself", 2, _done(e1), _done(e1), ("no_problem",), []),
        _upstream_pair(
            "upstream: all_reduce vs all_gather (type)",
            2,
            e1,
            ("all_gather", [[4, 4]], [[4, 4]], "started", {}),
            ("desync",),
            [2],
        ),
        _upstream_pair(
            "upstream: all_reduce vs all_gather, rank 0 odd",
            0,
            e1,
            ("all_gather", [[4, 4]], [[4, 4]], "started", {}),
            ("desync",),
            [0],
        ),
        _upstream_pair(
            "upstream: all_to_all of equal sizes",
            2,
            ("all_to_all", [[4, 4]], [[4, 4]], "completed", {}),
            ("all_to_all", [[4, 4]], [[4, 4]], "completed", {}),
            ("no_problem",),
            [],
        ),
        _upstream_pair(
            "upstream: input size 4x4 vs 5x4",
            2,
            e1,
            ("all_reduce", [[5, 4]], [[4, 4]], "started", {}),
            ("desync",),
            [2],
        ),
        _upstream_pair(
            "upstream: input size 4x4 vs 5x4, rank 0 odd",
            0,
            e1,
            ("all_reduce", [[5, 4]], [[4, 4]], "started", {}),
            ("desync",),
            [0],
        ),
        _upstream_pair(
            "upstream: output size 4x4 vs 5x4",
            2,
            e1,
            ("all_reduce", [[4, 4]], [[5, 4]], "started", {}),
            ("desync",),
            [2],
        ),
        # upstream: scheduled against completed. A collective one member completed was run by all; the state
        # that can be seen is started on some members and scheduled on the one whose stream never reached it
        _upstream_pair(
            "upstream: state started vs scheduled",
            0,
            e1,
            ("all_reduce", [[4, 4]], [[4, 4]], "scheduled", {}),
            ("missing_ranks",),
            [0],
        ),
        _upstream_pair(
            "upstream: output dtype float32 vs float16",
            2,
            e1,
            ("all_reduce", [[4, 4]], [[4, 4]], "started", {"output_dtypes": ["Half"]}),
            ("desync",),
            [2],
        ),
    ]
    # gather: only the root has an output (e11 against e12 and e13)
    for name, other_out in (
        ("upstream: gather, non-root output empty", [[]]),
        ("upstream: gather, non-root output 4x4", [[4, 4]]),
    ):
        job = Job(3).steps()
        job.op(0, "gather", [[4, 4]], [[4, 4], [4, 4], [4, 4]])
        for rank in (1, 2):
            job.op(rank, "gather", [[4, 4]], other_out)
        cases.append(Case(name, "pytorch test_fr_analysis.py", ("no_problem",), [], job.writer()))
    # test_all_events: every collective against itself (two ranks: the all_gather outputs are twice the input)
    job = Job(2)
    for op in UPSTREAM_COLLECTIVES:
        ins, outs = [[4, 4]], [[4, 4]]
        if op in ("reduce_scatter", "_reduce_scatter_base", "reduce_scatter_tensor_coalesced"):
            outs = [[8]]
        if op in ("all_gather", "_all_gather_base", "all_gather_into_tensor_coalesced"):
            outs = [[32]]
        job.coll(op, ins, outs)
    cases.append(
        Case(
            "upstream: every collective matches itself",
            "pytorch test_fr_analysis.py",
            ("no_problem",),
            [],
            job.writer(),
        )
    )
    return cases + upstream_build_db_cases()


def _done(event):
    return (*event[:3], "completed", event[4])


def upstream_build_db_cases() -> list[Case]:
    src = "pytorch test_fr_analysis.py"
    cases = []
    # case 1: all_reduce in the default group and in a sub-group of one rank each
    job = Job(2)
    job.coll("all_reduce", [[4, 4]], [[4, 4]])
    job.groups["1"] = [0]
    job.op(0, "all_reduce", [[5, 5]], [[5, 5]], pg="1")
    job.groups["1"] = [1]
    job.op(1, "all_reduce", [[5, 5]], [[5, 5]], pg="1")
    job.groups["1"] = [0]

    def write_case1(directory, job=job):
        for rank in (0, 1):
            dump = job.dump(rank)
            dump["pg_config"]["1"] = {"name": "1", "desc": "sub_pg", "ranks": str([rank])}
            (directory / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(dump))

    cases.append(Case("upstream build_db 1: all_reduce, one-rank sub-groups", src, ("no_problem",), [], write_case1))
    job = Job(2).coll("allreduce_coalesced", [[4, 4]], [[4, 4]])
    cases.append(Case("upstream build_db 2: allreduce_coalesced", src, ("no_problem",), [], job.writer()))
    group = [("broadcast", [[4, 4]], [[4, 4]]), ("broadcast", [[4, 4]], [[4, 4]]), ("coalesced", [[]], [[]])]
    job = Job(2).coll(group, None, None)
    cases.append(Case("upstream build_db 3: two broadcasts coalesced", src, ("no_problem",), [], job.writer()))
    job = Job(2)
    job.op(
        0,
        [
            ("_broadcast_oop", [[4, 4]], [[4, 4]]),
            ("_broadcast_oop", [[5, 5]], [[5, 5]]),
            ("ALLGATHER_coalesced", [[]], [[]]),
        ],
        None,
        None,
        "started",
    )
    job.op(
        1,
        [
            ("_broadcast_oop", [[4, 4]], [[4, 4]]),
            ("_broadcast_oop", [[4, 4]], [[4, 4]]),
            ("ALLGATHER_coalesced", [[]], [[]]),
        ],
        None,
        None,
        "started",
    )
    cases.append(
        Case(
            "upstream build_db 4: mismatch inside a coalesced group (2 ranks, a tie)",
            src,
            ("desync",),
            [0, 1],  # one rank on each side and neither issued before: both are named
            job.writer(),
        )
    )
    job = Job(3).steps()
    for rank in range(3):
        second = [[4, 4]] if rank == 2 else [[5, 5]]
        job.op(
            rank,
            [
                ("_broadcast_oop", [[4, 4]], [[4, 4]]),
                ("_broadcast_oop", second, second),
                ("ALLGATHER_coalesced", [[]], [[]]),
            ],
            None,
            None,
            "started",
        )
    cases.append(
        Case("upstream build_db 4 on 3 ranks: rank 2 odd inside a coalesced group", src, ("desync",), [2], job.writer())
    )
    group = [
        ("_reduce_oop", [[4, 4]], [[4, 4]]),
        ("_reduce_oop", [[4, 4]], [[4, 4]]),
        ("REDUCE_SCATTER_coalesced", [[]], [[]]),
    ]
    job = Job(2).coll(group, None, None)
    cases.append(Case("upstream build_db 5: two reduces coalesced", src, ("no_problem",), [], job.writer()))
    job = Job(2).coll("all_reduce", [[4, 4]], [[4, 4]])
    job.op(1, group, None, None)
    cases.append(
        Case(
            "upstream build_db 6: a coalesced group rank 1 completed is not in rank 0's (older) dump",
            src,
            ("no_problem",),
            [],
            job.writer(),
            note="completed on rank 1, so rank 0 took part: its dump was written before it",
        )
    )
    return cases


def nccl_cases() -> list[Case]:
    src = "issue 29"
    cases = []
    job = Job(2).steps().p2p(0, "send", 1, [[8]]).p2p(1, "recv", 0, [[8]]).steps(1)
    cases.append(Case("nccl: send/recv matched", src, ("no_problem",), [], job.writer()))
    job = Job(2).steps().p2p(0, "send", 1, [[8]], state="started")
    cases.append(Case("nccl: send 0->1 with no recv posted", src, ("missing_ranks",), [1], job.writer()))
    job = Job(2).steps().p2p(1, "recv", 0, [[8]], state="started")
    cases.append(Case("nccl: recv 1<-0 with no send posted", src, ("missing_ranks",), [0], job.writer()))
    job = Job(2).steps().p2p(0, "send", 1, [[8]], state="started").p2p(1, "recv", 0, [[6]], state="started")
    cases.append(Case("nccl: send 8 elements, recv 6", src, ("desync",), [0, 1], job.writer()))
    job = Job(4).steps()
    job.op(0, "gather", [[16]], [[16], [16], [16], [16]])
    for rank in (1, 2, 3):
        job.op(rank, "gather", [[16]], [])
    job.op(0, "scatter", [[8], [8], [8], [8]], [[8]])
    for rank in (1, 2, 3):
        job.op(rank, "scatter", [], [[8]])
    job.steps(1)
    cases.append(Case("nccl: gather and scatter (root shapes differ)", src, ("no_problem",), [], job.writer()))
    # all_to_all_single, rank r sends j+1 rows of 4 to each peer j and so receives r+1 rows from each
    world = 3
    job = Job(world).steps()
    for rank in range(world):
        job.op(rank, "all_to_all_single", [[sum(j + 1 for j in range(world)), 4]], [[world * (rank + 1), 4]])
    job.steps(1)
    cases.append(Case("nccl 2.10: all_to_all_single with uneven splits", src, ("no_problem",), [], job.writer()))
    # all_to_all_single with split sizes (element counts per peer): rank r sends 4*(j+1) to peer j
    for name, wrong, verdicts, culprits in (
        ("nccl 2.11: all_to_all_single, split sizes agree", None, ("no_problem",), []),
        ("nccl 2.11: all_to_all_single, rank 1 expects half of what each peer sends it", "receives", ("desync",), [1]),
        ("nccl 2.11: all_to_all_single, rank 1 sends rank 0 three times what it expects", "sends", ("desync",), [0, 1]),
    ):
        job = Job(world, version="2.11").steps()
        for rank in range(world):
            sends = [(j + 1) * 4 for j in range(world)]
            receives = [(rank + 1) * 4] * world
            if wrong == "receives" and rank == 1:
                receives = [4] * world
            if wrong == "sends" and rank == 1:
                sends = [12, 8, 12]
            state = "started" if wrong else "completed"
            job.op(
                rank,
                "all_to_all_single",
                [[sum(sends) // 4, 4]],
                [[sum(receives) // 4, 4]],
                state,
                input_split_sizes=sends,
                output_split_sizes=receives,
            )
        cases.append(
            Case(
                name,
                src,
                verdicts,
                culprits,
                job.writer(),
                note="one mismatched pair: either side may be wrong, both are named" if wrong == "sends" else "",
            )
        )
    job = Job(3).steps()
    job.coll("all_reduce", [[64]], [[64]], "started", ranks=[0, 1])
    cases.append(Case("nccl: rank 2 never issued the all_reduce", src, ("missing_ranks",), [2], job.writer()))
    cases.append(
        Case(
            "nccl JSON dumps: rank 2 never issued the all_reduce",
            src,
            ("missing_ranks",),
            [2],
            job.writer(as_json=True),
        )
    )
    job = Job(3).steps()
    job.coll("all_reduce", [[64]], [[64]], "started", ranks=[0, 1])
    job.op(2, "all_reduce", [[64]], [[64]], "started")
    cases.append(
        Case(
            "nccl: rank 2 has no dump, ranks 0 and 1 wait for it",
            src,
            ("missing_ranks", "dead_rank"),
            [2],
            job.writer(without=(2,)),
        )
    )
    job = Job(4).steps()
    for rank in range(4):
        size = [[2, 8]] if rank == 0 else [[8]]
        job.op(
            rank,
            [
                ("all_gather_into_tensor", size, [[32]]),
                ("all_gather_into_tensor", [[8]], [[32]]),
                ("ALLGATHER_coalesced", [[]], [[]]),
            ],
            None,
            None,
            "started",
        )
    cases.append(Case("nccl: rank 0 odd inside a coalesced all_gather", src, ("desync",), [0], job.writer()))
    job = Job(3).steps()
    job.op(0, "all_reduce", [[64]], [[64]], "scheduled")
    job.op(1, "all_reduce", [[64]], [[64]], "started")
    job.op(2, "all_reduce", [[64]], [[64]], "started")
    cases.append(
        Case("nccl: all_reduce started on 1 and 2, only scheduled on 0", src, ("missing_ranks",), [0], job.writer())
    )
    return cases + neighbour_cases()


def neighbour_cases() -> list[Case]:
    """The same checks on other job shapes: world sizes, groups, batched and pipeline send/recv."""
    src = "issue 29"
    cases = []
    job = Job(4, groups={"1": [2, 3]}).steps()
    job.coll("all_reduce", [[16]], [[16]], ranks=[2, 3], pg="1")
    job.op(2, "all_reduce", [[16]], [[16]], "started", pg="1")
    job.coll("all_reduce", [[64]], [[64]], "started", ranks=[0, 1])
    cases.append(
        Case(
            "nccl: rank 3 stalls; 2 waits in group [2, 3], 0 and 1 in the world group",
            src,
            ("missing_ranks",),
            [3],
            job.writer(),
        )
    )
    job = Job(3).steps()
    group = [("all_reduce", [[8]], [[8]]), ("all_reduce", [[8]], [[8]]), ("coalesced", [[]], [[]])]
    job.coll(group, None, None, "started", ranks=[0, 1])
    cases.append(Case("nccl: rank 2 never issued a coalesced group", src, ("missing_ranks",), [2], job.writer()))
    job = Job(2).steps()
    for rank, peer in ((0, 1), (1, 0)):  # batch_isend_irecv: a send and a recv under one p2p seq each
        job.p2p(rank, "send", peer, [[32]])
        job.p2p_seq[(rank, "0")] -= 1
        job.p2p(rank, "recv", peer, [[32]])
    job.steps(1)
    cases.append(Case("nccl: batched send/recv exchange, both ways", src, ("no_problem",), [], job.writer()))
    job = Job(4).steps()
    job.p2p(0, "send", 1, [[4, 64]]).p2p(1, "recv", 0, [[4, 64]])
    job.p2p(1, "send", 2, [[4, 64]], state="started")
    cases.append(
        Case("nccl: pipeline 0->1->2->3, rank 2 never posts its recv", src, ("missing_ranks",), [2], job.writer())
    )
    job = Job(4).steps()
    job.coll("_reduce_scatter_base", [[64]], [[16]])
    job.coll("_all_gather_base", [[16]], [[64]])
    job.coll("reduce_scatter_tensor_coalesced", [[64]], [[16]])
    job.steps(1)
    cases.append(
        Case("nccl: FSDP-style reduce_scatter and all_gather (input != output)", src, ("no_problem",), [], job.writer())
    )
    job = Job(4, groups={"1": [0, 2]}).steps()
    job.op(0, "all_to_all_single", [[10, 8]], [[3, 8]], pg="1")
    job.op(2, "all_to_all_single", [[2, 8]], [[9, 8]], pg="1")
    job.steps(1)
    cases.append(Case("nccl: uneven all_to_all_single in group [0, 2]", src, ("no_problem",), [], job.writer()))
    job = Job(3).steps()
    for rank in range(3):
        job.op(rank, "all_to_all_single", [[9, 4]], [[6 if rank == 2 else 9, 4]], "started")
    cases.append(
        Case(
            "nccl 2.10: all_to_all_single, 27 rows sent in all, 24 received",
            src,
            ("desync",),
            [],
            job.writer(),
            note="no split sizes: the totals disagree, no rank can be named",
        )
    )
    return cases


# -- real gloo dumps -----------------------------------------------------------------------------------------------

GLOO_EXPECTED = {
    "missing_rank": (("missing_ranks",), [2]),
    "subgroup_chain": (("missing_ranks",), [2]),
    "rooted": (("no_problem",), []),
    # dp=2 x tp=2 DeviceMesh: rank 3 stops before a tensor-parallel all_reduce; gloo's pg_status is keyed by
    # each rank's own group ids, not the groups' names
    "mesh_tp_hang": (("missing_ranks",), [3]),
}


def gloo_cases(fixtures: Path = FIXTURES) -> list[Case]:
    cases = []
    for run in sorted(p for p in fixtures.glob("gloo_*") if p.is_dir()):
        scenario = run.name[len("gloo_") :].rsplit("_", 1)[0]
        verdicts, culprits = GLOO_EXPECTED[scenario]

        def write(directory: Path, run=run):
            for file in run.iterdir():
                (directory / file.name).write_bytes(file.read_bytes())

        cases.append(Case(f"gloo (torch 2.13): {run.name[len('gloo_') :]}", "real gloo job", verdicts, culprits, write))
    return cases


def all_cases() -> list[Case]:
    return upstream_cases() + nccl_cases() + gloo_cases()
