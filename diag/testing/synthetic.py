"""Write synthetic trace directories in the real diag format, with problems planted at known ranks.

The timing model is synchronous data-parallel training: each rank's *busy* time per step is its data wait
plus its compute; every rank's iteration lasts as long as the busiest rank's, and the difference is spent
waiting in the step's first collective (so the busiest rank has the shortest duration there, as on a real
job). Clocks get a per-rank offset, recorded in the manifest as capture does.

Planted (ranks chosen from the world size, see ``Plants.for_world``): a compute straggler, a data-loader
straggler, a throttled GPU (hot, low SM clock, slower compute), a memory leak, and a rank with a few
transient spikes. Files are formatted by pyarrow, a whole rank at a time, so 1,024 ranks take about a minute.

    python3 -m diag.testing.synthetic /tmp/synth --ranks 64 --steps 200 [--format 2] [--hang]
"""

from __future__ import annotations

import argparse
import io
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from diag.trace.columnar import PARQUET_SUFFIX, arrow_schema, write_parquet
from diag.trace.schema import (
    COLLECTIVES,
    CSV_SCHEMA_VERSION,
    HEARTBEAT_FILE,
    MANIFEST_FILE,
    MEMORY,
    SCHEMA_VERSION,
    STEPS,
    TELEMETRY,
    Table,
    rank_dir_name,
    segment_name,
)

STEP_COMPUTE_US = 100_000
DATA_WAIT_US = 1_500
TRANSFER_US = 600  # per collective once everyone arrived
BUCKET_BYTES = 25 * 2**20  # DDP's default bucket
TELEMETRY_EVERY_STEPS = 4
FLOPS_PER_STEP = 4.0e13
TOKENS_PER_STEP = 16_384
FINGERPRINT_EVERY = 5
LOSS_SPIKE_FACTOR = 3.0
GRAD_DEPARTS_FACTOR = 1.5
START_US = 1_795_000_000_000_000


@dataclass
class Plants:
    compute_straggler: int | None = None  # compute x COMPUTE_SLOWDOWN
    data_straggler: int | None = None  # + DATA_EXTRA_US per step waiting for its batch
    throttled: int | None = None  # GPU clock throttled, compute x THROTTLE_SLOWDOWN
    leak: int | None = None  # allocated memory + LEAK_BYTES_PER_STEP each step
    transient: int | None = None  # SPIKE_US extra on a few steps
    spike_steps: list[int] = field(default_factory=list)
    compute_slowdown: float = 1.40
    data_extra_us: int = 25_000
    throttle_slowdown: float = 1.15
    leak_bytes_per_step: int = 8 * 2**20
    spike_us: int = 500_000
    hang_stuck: int | None = None  # --hang: the rank stuck in its data loader while the others wait for it
    health: bool = False  # each step's loss, gradient norm and (every FINGERPRINT_EVERY steps) fingerprint
    loss_spike: tuple[int, int] | None = None  # (rank, step): its loss x LOSS_SPIKE_FACTOR there
    grad_departs: int | None = None  # its gradient norm x GRAD_DEPARTS_FACTOR at every step
    diverged: tuple[int, int] | None = None  # (rank, step): its parameters differ from that step on

    @classmethod
    def for_world(cls, ranks: int, steps: int) -> Plants:
        if ranks < 5:
            return cls()
        spikes = [int(s) for s in np.linspace(steps * 0.3, steps * 0.9, 5)]
        return cls(ranks * 3 // 8, ranks * 5 // 8 + 1, ranks - 2, ranks // 8 + 1, ranks // 4 + 3, spikes)

    @classmethod
    def with_health(cls, ranks: int, steps: int) -> Plants:
        """``for_world``'s plants, and the training values recorded with a loss spike, a rank whose gradient norm
        departs from its peers' and a replica that diverges (on other ranks than the timing plants, from 5)."""
        plants = cls.for_world(ranks, steps)
        plants.health = True
        if ranks >= 5:
            plants.loss_spike = (ranks - 1, steps * 2 // 3)
            plants.grad_departs = ranks // 2
            plants.diverged = (1, steps * 3 // 4)
        return plants


def generate(
    out: str | Path,
    ranks: int,
    steps: int,
    collectives_per_step: int = 20,
    plants: Plants | None = None,
    seed: int = 0,
    trace_format: int = CSV_SCHEMA_VERSION,
    hang: bool = False,
    heartbeat_groups: bool = True,
) -> Plants:
    """Write the trace; ``trace_format`` 1: CSV tables, 2: one Parquet segment per table and rank, as capture
    leaves them once compacted (diag/trace/columnar.py). ``hang``: the job then hangs (``plant_hang``);
    ``heartbeat_groups`` False: its heartbeats as capture wrote them before they carried ``groups``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    plants = plants if plants is not None else Plants.for_world(ranks, steps)
    rng = np.random.default_rng(seed)
    busy_us, data_us = _busy_matrix(ranks, steps, plants, rng)
    iteration_us = busy_us.max(axis=0)  # every rank's iteration lasts as long as the slowest's
    step_start_us = START_US + np.concatenate([[0], np.cumsum(iteration_us[:-1] + collectives_per_step * TRANSFER_US)])
    last_done = []  # each rank's last collective (the heartbeat's groups)
    for rank in range(ranks):
        last = _write_rank(
            out / rank_dir_name(rank),
            rank,
            ranks,
            steps,
            collectives_per_step,
            plants,
            rng,
            busy_us,
            data_us,
            iteration_us,
            step_start_us,
            trace_format,
        )
        last_done.append(last)
    if hang:
        plants.hang_stuck = hang_rank(ranks)
        end_us = int(step_start_us[-1] + iteration_us[-1] + collectives_per_step * TRANSFER_US)
        for rank in range(ranks):
            plant_hang(
                out / rank_dir_name(rank), rank, steps, end_us, plants.hang_stuck, last_done[rank], heartbeat_groups
            )
    (out / "planted.json").write_text(json.dumps(asdict(plants), indent=1))
    return plants


def check_planted(report: dict, plants: Plants) -> list[str]:
    """What the report got wrong about the planted problems (empty: all found, at the right ranks)."""
    problems = []
    persistent = {s["rank"]: s["cause"] for s in report["stragglers"] if s["persistent"]}
    expected = {plants.compute_straggler: "compute", plants.data_straggler: "data", plants.throttled: "throttle"}
    if persistent != expected:
        problems.append(f"persistent stragglers {persistent}, planted {expected}")
    transient = [s["rank"] for s in report["stragglers"] if not s["persistent"]]
    if transient != [plants.transient]:
        problems.append(f"transient stragglers {transient}, planted [{plants.transient}]")
    leaks = [f["ranks"] for f in report["findings"] if f["kind"] == "memory_leak"]
    if leaks != [[plants.leak]]:
        problems.append(f"leaks {leaks}, planted [{plants.leak}]")
    throttled = [f["ranks"] for f in report["findings"] if f["kind"] == "gpu_throttle"]
    if throttled != [[plants.throttled]]:
        problems.append(f"throttled GPUs {throttled}, planted [{plants.throttled}]")
    return problems


def hang_rank(ranks: int) -> int:
    return ranks // 2 + 5 if ranks > 8 else ranks - 1


HANG_STALL_S = 180.0
LOADER_STACK = [
    {"file": "/job/train.py", "line": 88, "name": "<module>"},
    {"file": "/job/train.py", "line": 61, "name": "train"},
    {"file": "/site-packages/diag/capture/session.py", "line": 356, "name": "wrap_loader"},
    {"file": "/site-packages/torch/utils/data/dataloader.py", "line": 733, "name": "__next__"},
    {"file": "/site-packages/torch/utils/data/dataloader.py", "line": 1480, "name": "_next_data"},
    {"file": "/usr/lib/python3.11/threading.py", "line": 327, "name": "wait"},
]
COLLECTIVE_STACK = [
    {"file": "/job/train.py", "line": 88, "name": "<module>"},
    {"file": "/job/train.py", "line": 70, "name": "train"},
    {"file": "/site-packages/torch/distributed/distributed_c10d.py", "line": 3252, "name": "all_reduce"},
]


@dataclass(frozen=True)
class Pending:
    """The all_reduce (group 0) the hung ranks wait in."""

    seq: int
    op: str
    nbytes: int
    start_us: int


def write_hang_state(
    rank_dir: Path,
    rank: int,
    steps: int,
    stuck: bool,
    pending: Pending,
    now_us: int,
    stall_s: float,
    last_done: dict | None = None,
) -> None:
    """A hung rank's watchdog dump and last heartbeat, as capture writes them ``stall_s`` into the hang: in the
    next step's (``steps``) all_reduce ``pending``, or, ``stuck``, in its data loader after step ``steps - 1``.
    ``last_done``: the rank's last collectives row ({seq, op, bytes, dtype, step, start_us}, group 0), which the
    heartbeat's ``groups`` names as issued and completed (the pending one, asynchronous, as issued); None: a
    heartbeat written before ``groups`` existed."""
    if stuck:
        dump = {"reason": f"stall: no progress for {stall_s} s (after step {steps - 1}, phase data_wait)"}
        dump.update(step=None, last_step=steps - 1, phase="data_wait", pending=[])
        dump["threads"] = [{"name": "MainThread", "main": True, "frames": LOADER_STACK}]
    else:
        record = {"pg": "0", "seq": pending.seq, "op": pending.op, "bytes": pending.nbytes, "dtype": "bfloat16"}
        record.update(peer=None, start_us=pending.start_us, step=steps, source="ddp")
        dump = {"reason": f"stall: {pending.op} seq {pending.seq} in group 0 pending {stall_s} s"}
        dump.update(step=steps, last_step=steps - 1, phase="backward", pending=[record])
        dump["threads"] = [{"name": "MainThread", "main": True, "frames": COLLECTIVE_STACK}]
    dump["time_us"] = now_us
    (rank_dir / "hang_dump_001.json").write_text(json.dumps(dump))
    heartbeat = {"rank": rank, "pid": 1000 + rank, "time_us": now_us, "state": "stalled", "interval_s": 5.0}
    heartbeat.update(last_step=steps - 1, step=dump["step"], phase=dump["phase"], pending=dump["pending"], exit=None)
    if last_done is not None:
        issued = last_done if stuck else {k: v for k, v in record.items() if k in last_done}
        heartbeat["groups"] = {"0": {"issued": issued, "completed": last_done}}
    (rank_dir / HEARTBEAT_FILE).write_text(json.dumps(heartbeat))


def plant_hang(
    rank_dir: Path, rank: int, steps: int, end_us: int, stuck: int, last_done: dict, groups: bool = True
) -> None:
    """After the last recorded step (its last collective ``last_done``; ``groups`` False: an old heartbeat), every rank
    but ``stuck`` enters the next step's first all_reduce and stays there; ``stuck`` sits in its data loader.
    What capture leaves of such a job: manifests not finished, each rank's watchdog dump (pending collective
    and main-thread stack) and its last heartbeat, written HANG_STALL_S after the hang began."""
    now_us = end_us + int(HANG_STALL_S * 1e6)
    pending = Pending(seq=last_done["seq"] + 1, op="allreduce", nbytes=BUCKET_BYTES, start_us=end_us + 50_000)
    write_hang_state(rank_dir, rank, steps, rank == stuck, pending, now_us, HANG_STALL_S, last_done if groups else None)
    manifest_path = rank_dir / MANIFEST_FILE
    manifest = json.loads(manifest_path.read_text())
    manifest["finished"] = False
    manifest_path.write_text(json.dumps(manifest))


def _busy_matrix(ranks: int, steps: int, plants: Plants, rng) -> tuple[np.ndarray, np.ndarray]:
    compute = STEP_COMPUTE_US * rng.lognormal(0.0, 0.02, size=(ranks, steps))
    compute[:, 0] *= 3.0  # warm-up: compilation, allocator growth, communicator setup
    compute[:, 1] *= 2.0
    data = DATA_WAIT_US * rng.lognormal(0.0, 0.1, size=(ranks, steps))
    if plants.compute_straggler is not None:
        compute[plants.compute_straggler] *= plants.compute_slowdown
    if plants.throttled is not None:
        compute[plants.throttled] *= plants.throttle_slowdown
    if plants.data_straggler is not None:
        data[plants.data_straggler] += plants.data_extra_us
    if plants.transient is not None:
        compute[plants.transient, plants.spike_steps] += plants.spike_us
    return (compute + data).astype("int64"), data.astype("int64")


def _write_rank(
    rank_dir: Path,
    rank,
    ranks,
    steps,
    n_coll,
    plants: Plants,
    rng,
    busy_us,
    data_us,
    iteration_us,
    step_start_us,
    trace_format,
):
    rank_dir.mkdir(parents=True, exist_ok=True)
    offset_us = int(rng.integers(-5_000, 5_000)) if rank else 0
    step = np.arange(steps, dtype="int64")
    wait_us = iteration_us - busy_us[rank]  # absorbed by the step's first collective
    transfer = (TRANSFER_US * rng.lognormal(0.0, 0.05, size=(steps, n_coll))).astype("int64")
    coll_dur = transfer + rng.integers(0, 40, size=(steps, n_coll))  # jitter: exactly one rank arrives last
    coll_dur[:, 0] += wait_us
    comm_wait = coll_dur.sum(axis=1)
    compute = busy_us[rank] - data_us[rank]
    start = step_start_us + offset_us + data_us[rank]
    forward = (compute * 0.32).astype("int64")
    backward = (compute * 0.6).astype("int64")
    optimizer = compute - forward - backward
    _write_table(
        rank_dir,
        trace_format,
        STEPS,
        {
            "step": step,
            "start_us": start,
            "duration_us": compute + comm_wait,
            "data_wait_us": data_us[rank],
            "forward_us": forward,
            "backward_us": backward,
            "optimizer_us": optimizer,
            "comm_wait_us": comm_wait,
            "device_us": np.full(steps, np.nan),
            "samples": np.full(steps, 8),
            "tokens": np.full(steps, TOKENS_PER_STEP),
            **(_health_values(rank, step, plants) if plants.health else {}),
        },
    )
    coll_start = start[:, None] + forward[:, None] + np.cumsum(coll_dur, axis=1) - coll_dur
    sizes = np.full(n_coll, BUCKET_BYTES, dtype="int64")
    sizes[-1] = 3 * 2**20  # DDP's last bucket is smaller
    n = steps * n_coll
    _write_table(
        rank_dir,
        trace_format,
        COLLECTIVES,
        {
            "step": np.repeat(step, n_coll),
            "pg": _const("0", n),
            "seq": np.arange(n, dtype="int64") + 1,
            "op": _const("allreduce", n),
            "bytes": np.tile(sizes, steps),
            "dtype": _const("bfloat16", n),
            "peer": np.full(n, np.nan),
            "start_us": coll_start.ravel(),
            "duration_us": coll_dur.ravel().astype("float64"),
            "blocking": np.zeros(n, dtype="int8"),
            "source": _const("ddp", n),
        },
    )
    last = {"seq": n, "op": "allreduce", "bytes": int(sizes[-1]), "dtype": "bfloat16", "step": steps - 1}
    last["start_us"] = int(coll_start[-1, -1])
    allocated = np.full(steps, 30 * 2**30, dtype="int64") + rng.integers(0, 2**20, size=steps)
    if rank == plants.leak:
        allocated += step * plants.leak_bytes_per_step
    _write_table(
        rank_dir,
        trace_format,
        MEMORY,
        {
            "step": step,
            "time_us": start + compute,
            "allocated_bytes": allocated,
            "allocated_peak_bytes": allocated + 20 * 2**30,
            "reserved_bytes": allocated + 22 * 2**30,
            "reserved_peak_bytes": allocated + 22 * 2**30,
            "alloc_retries": np.zeros(steps, dtype="int64"),
            "ooms": np.zeros(steps, dtype="int64"),
            "rss_bytes": np.full(steps, 12 * 2**30),
        },
    )
    _write_telemetry(rank_dir, trace_format, rank, plants, rng, start[::TELEMETRY_EVERY_STEPS])
    manifest = {
        "schema_version": trace_format,
        "run_id": "synthetic",
        "rank": rank,
        "local_rank": rank % 8,
        "world_size": ranks,
        "local_world_size": min(8, ranks),
        "host": f"node{rank // 8:04d}",
        "pid": 1000 + rank,
        "launcher": "torchrun",
        "backend": "nccl",
        "device": f"cuda:{rank % 8}",
        "device_name": "NVIDIA H100 80GB HBM3",
        "gpu_index": rank % 8,
        "parallel": {"dp": ranks},
        "flops_per_step": FLOPS_PER_STEP,
        "flops_source": "user",
        "peak_tflops": None,
        "dtype": "bfloat16",
        "clock_offset_us": offset_us,
        "clock_sync_error_us": 50,
        "start_time_us": START_US + offset_us,
        "process_groups": {"0": {"ranks": "all", "size": ranks, "backend": "nccl"}},
        "finished": True,
    }
    (rank_dir / MANIFEST_FILE).write_text(json.dumps(manifest))
    return last


def _health_values(rank: int, step: np.ndarray, plants: Plants) -> dict[str, np.ndarray]:
    """A loss falling with noise of its rank's own (a generator per rank: the timings' draws stay those of a run
    without), a gradient norm every rank shares (after the all-reduce) and the replicas' fingerprints."""
    decay = np.exp(-step / max(len(step), 1))
    loss = 1.0 + 2.0 * decay + 0.02 * np.random.default_rng(10_007 + rank).standard_normal(len(step))
    grad_norm = 1.0 + 0.5 * decay
    fingerprint = np.where(step % FINGERPRINT_EVERY == 0, 1234.5 + 1e-3 * step, np.nan)
    if plants.loss_spike is not None and plants.loss_spike[0] == rank:
        loss = np.where(step == plants.loss_spike[1], loss * LOSS_SPIKE_FACTOR, loss)
    if plants.grad_departs == rank:
        grad_norm = grad_norm * GRAD_DEPARTS_FACTOR
    if plants.diverged is not None and plants.diverged[0] == rank:
        fingerprint = np.where(step >= plants.diverged[1], fingerprint + 1e-3, fingerprint)
    return {"loss": loss, "grad_norm": grad_norm, "param_fingerprint": fingerprint}


def _write_telemetry(rank_dir: Path, trace_format: int, rank: int, plants: Plants, rng, times_us: np.ndarray) -> None:
    n = len(times_us)
    throttled = rank == plants.throttled
    clock = np.where(throttled, 1380.0, 1980.0) - rng.integers(0, 30, size=n)
    reasons = np.full(n, 0x40 | 0x20 if throttled else 0, dtype="int64")
    _write_table(
        rank_dir,
        trace_format,
        TELEMETRY,
        {
            "time_us": times_us,
            "gpu": np.full(n, rank % 8),
            "util_pct": np.full(n, 97.0),
            "mem_util_pct": np.full(n, 45.0),
            "mem_used_bytes": np.full(n, 60 * 2**30),
            "mem_total_bytes": np.full(n, 85_520_809_984),
            "power_w": 640.0 + rng.normal(0, 10, n),
            "power_limit_w": np.full(n, 700.0),
            "temp_c": np.full(n, 91.0 if throttled else 62.0),
            "sm_clock_mhz": clock,
            "sm_clock_max_mhz": np.full(n, 1980.0),
            "throttle_reasons": reasons,
            "pcie_tx_kib_per_s": np.full(n, 900.0),
            "pcie_rx_kib_per_s": np.full(n, 500.0),
            "ecc_corrected": np.zeros(n, dtype="int64"),
            "ecc_uncorrected": np.zeros(n, dtype="int64"),
            "xid": np.full(n, np.nan),
        },
    )


def _const(value: str, n: int) -> pa.DictionaryArray:
    return pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, dtype="int32")), pa.array([value]))


def _write_table(rank_dir: Path, trace_format: int, table: Table, columns: dict) -> None:
    arrays = []
    rows = len(next(iter(columns.values())))
    for name in table.column_names:
        value = columns.get(name)
        if value is None:  # a column this generator does not plant (loss, fingerprints): empty
            value = np.full(rows, np.nan)
        if isinstance(value, pa.Array):
            arrays.append(value.dictionary_decode() if isinstance(value, pa.DictionaryArray) else value)
        elif value.dtype.kind == "f" and table.dtypes[name] != "Float64":
            arrays.append(pa.array(value, mask=np.isnan(value)).cast(pa.int64()))  # nullable integer column
        else:
            arrays.append(pa.array(value, mask=np.isnan(value) if value.dtype.kind == "f" else None))
    arrow = pa.table(arrays, names=table.column_names)
    if trace_format == SCHEMA_VERSION:
        arrow = arrow.cast(arrow_schema(table))  # the schema's types: dictionary-encoded categories, int8 flags
        write_parquet(table, arrow, rank_dir / segment_name(table.name, 1, PARQUET_SUFFIX))
        return
    buffer = io.BytesIO()
    pacsv.write_csv(arrow, buffer, pacsv.WriteOptions(include_header=False, quoting_style="none"))
    with open(rank_dir / table.file_name, "wb") as handle:
        handle.write(table.header().encode())
        handle.write(buffer.getvalue())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out")
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--collectives-per-step", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--format",
        type=int,
        choices=(CSV_SCHEMA_VERSION, SCHEMA_VERSION),
        default=CSV_SCHEMA_VERSION,
        help="trace schema version: 1 CSV tables (default), 2 Parquet segments (about 20x smaller)",
    )
    parser.add_argument(
        "--hang",
        action="store_true",
        help="the job hangs after its last step: one rank stuck in its data loader, the others in an all_reduce "
        "(watchdog dumps and heartbeats as capture writes them)",
    )
    parser.add_argument(
        "--old-heartbeats",
        action="store_true",
        help="with --hang: heartbeats without their groups' last collectives, as capture wrote them before",
    )
    parser.add_argument(
        "--health",
        action="store_true",
        help="record each step's loss and gradient norm and the replicas' fingerprints, with a loss spike, a "
        "departing gradient norm and a diverged replica planted",
    )
    args = parser.parse_args()
    plants = generate(
        args.out,
        args.ranks,
        args.steps,
        args.collectives_per_step,
        Plants.with_health(args.ranks, args.steps) if args.health else None,
        seed=args.seed,
        trace_format=args.format,
        hang=args.hang,
        heartbeat_groups=not args.old_heartbeats,
    )
    print(json.dumps(asdict(plants)))


if __name__ == "__main__":
    main()
