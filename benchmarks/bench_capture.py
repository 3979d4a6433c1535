"""Capture overhead, host cost per record, and bytes on disk.

1. A 2-rank gloo DDP loop with steps of about 20 ms, run six ways side by side in the same processes (one
   core per rank), in blocks whose order is shuffled anew each block: plain, plain again (an A/A comparison:
   its ratio to the first shows what this machine can resolve), instrumented with diag's defaults (on gloo:
   DDP's buckets from Flight Recorder), diag with every bucket timed by a DDP comm hook
   (``ddp_buckets="hook"``), plain with a minimal Python DDP comm hook (no diag), and under torch.profiler
   (CPU activities, the usual way people profile).
   Median step time of each and its ratio to plain; and the median over blocks of each block's median
   against the plain block of the same round, which drift in the machine's speed does not bias.
2. Host cost of one step span (``with diag.step()``) and of recording one collective, in microseconds, and
   what diag adds to a real step, measured step by step in one process (``cost_in_a_real_step``).
3. Bytes on disk per step and per collective record.

usage: python benchmarks/bench_capture.py [--blocks 12] [--block-steps 10] [--trace-format 2]
       python benchmarks/bench_capture.py --loop-only [--blocks 80]      (1 and 3: table "capture")
       python benchmarks/bench_capture.py --real-step-only [--real-step-pairs 4 --real-step-steps 70]
         (2: table "capture_real_step")
       python benchmarks/bench_capture.py --formats-side-by-side [--real-step-pairs 6 --real-step-steps 400]
         (4. schema 1 against schema 2: the real-step cost of each and the A/A pairs, interleaved)

``--json PATH`` saves the table printed (``record.Table``); without ``--loop-only`` or ``--real-step-only`` the
loop's table is saved, with the host costs among its notes.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import Table, add_json_option  # noqa: E402

# diag_ddp_hook: diag.init(..., ddp_buckets="hook"); python_ddp_hook: no diag, only a minimal Python DDP
# communication hook (what DDP's Python hook path costs by itself); profiler: torch.profiler, CPU activities
VARIANTS = ("plain", "plain_again", "diag", "diag_ddp_hook", "python_ddp_hook", "profiler")
VARIANT_LABELS = {
    "plain": "plain",
    "plain_again": "plain again (A/A)",
    "diag": "diag defaults",
    "diag_ddp_hook": 'diag, `ddp_buckets="hook"`',
    "python_ddp_hook": "minimal Python DDP hook, no diag",
    "profiler": "torch.profiler (CPU)",
}


def minimal_ddp_hook(_state, bucket):
    """DDP's averaging all-reduce as the leanest Python communication hook: the process group averages
    (``ReduceOp.AVG``), so no extra pass divides the gradients."""
    import torch.distributed as dist

    average = dist.AllreduceOptions()
    average.reduceOp = dist.ReduceOp.AVG
    return dist.group.WORLD.allreduce([bucket.buffer()], average).get_future().then(lambda fut: fut.value()[0])


def make_ddp(hidden: int, seed: int):
    import torch

    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(hidden, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, 1),
    )
    return torch.nn.parallel.DistributedDataParallel(model)  # DDP's default buckets


def train_step(model, optimizer, batch, grad_norm: bool = False):
    """One step; returns its loss and, when asked, the gradient norm (clip_grad_norm_ as training loops do)."""
    import torch

    loss = torch.nn.functional.mse_loss(model(batch[0]), batch[1])
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1e9) if grad_norm else None
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss, norm


def build_variants(args, session, seed: int):
    """A fresh model and optimizer per variant, built in a shuffled order. Each model's memory placement
    (page alignment, huge pages) changes its speed by a few percent on its own; rebuilding every round and
    shuffling who is built first averages that out instead of charging it to one variant."""
    import torch

    names = list(VARIANTS)
    random.Random(seed).shuffle(names)  # the same on every rank: building DDP models is collective
    models = {name: make_ddp(args.hidden, 0) for name in names}
    optimizers = {name: torch.optim.SGD(m.parameters(), lr=1e-3) for name, m in models.items()}
    session._ddp_buckets = "auto"  # the default: Flight Recorder on gloo
    session.instrument(models["diag"], optimizers["diag"])
    session._ddp_buckets = "hook"  # the same session, instrumenting a model with the DDP hook
    session.instrument(models["diag_ddp_hook"], optimizers["diag_ddp_hook"])
    models["python_ddp_hook"].register_comm_hook(None, minimal_ddp_hook)
    return models, optimizers


def overhead_worker(args) -> None:
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    import diag

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) >= dist.get_world_size():  # one core per rank, as launchers pin ranks: less scheduler noise
        os.sched_setaffinity(0, {cores[rank]})
    trace_dir = Path(args.trace_dir)
    session = diag.init(trace_dir, telemetry=False, trace_format=args.trace_format)
    batch = (torch.randn(args.batch, args.hidden), torch.randn(args.batch, 1))
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    order = list(VARIANTS)
    for block in range(args.blocks):
        if block % args.rebuild_every == 0:
            models, optimizers = build_variants(args, session, seed=block)
            for name in VARIANTS:  # warm-up, untimed
                for _ in range(3):
                    train_step(models[name], optimizers[name], batch)
        random.Random(block).shuffle(order)  # the same order on every rank: their collectives must match
        for name in order:
            model, optimizer = models[name], optimizers[name]
            dist.barrier()
            if name == "profiler":
                prof = profile(activities=[ProfilerActivity.CPU], record_shapes=True)
                prof.__enter__()
            for _ in range(args.block_steps):
                start = time.perf_counter()
                if name.startswith("diag"):
                    with diag.step():
                        train_step(model, optimizer, batch)
                else:
                    train_step(model, optimizer, batch)
                times[name].append(time.perf_counter() - start)
            if name == "profiler":
                prof.__exit__(None, None, None)
    follower = session.recorder.flight_recorder
    reads_before_finish, read_s_before_finish = follower.reads, follower.read_s
    diag.finish()
    if rank == 0:
        # Flight Recorder is read when most of its ring is new, whichever variant issued those
        # collectives (all issue the same number per step): the reading time is charged per step below.
        times["_flight_recorder"] = {"reads": reads_before_finish, "read_s": read_s_before_finish}
        (trace_dir / "times.json").write_text(json.dumps(times))
    dist.destroy_process_group()


def run_overhead(args) -> dict:
    from diag.launch import run_ranks

    with tempfile.TemporaryDirectory() as tmp:
        argv = [
            __file__,
            "--worker",
            "--trace-dir",
            tmp,
            "--blocks",
            str(args.blocks),
            "--block-steps",
            str(args.block_steps),
            "--hidden",
            str(args.hidden),
            "--batch",
            str(args.batch),
            "--rebuild-every",
            str(args.rebuild_every),
            "--trace-format",
            str(args.trace_format),
        ]
        for result in run_ranks(argv, 2, timeout_s=900):
            if result.returncode != 0:
                raise SystemExit(f"rank {result.rank} failed:\n{result.stderr[-3000:]}")
        times = json.loads((Path(tmp) / "times.json").read_text())
        flight_recorder = times.pop("_flight_recorder")
        disk = bytes_on_disk(Path(tmp))
    medians = {name: statistics.median(values) * 1000 for name, values in times.items()}
    # every variant's step issues the same collectives, each costing the same share of the reads
    fr_per_step_ms = flight_recorder["read_s"] * 1000 / sum(len(values) for values in times.values())
    return {
        "median_step_ms": medians,
        "flight_recorder": {**flight_recorder, "per_diag_step_ms": fr_per_step_ms},
        "paired_ratio": paired_ratios(times, args.block_steps),
        "steps_each": len(times["plain"]),
        "disk": disk,
    }


def paired_ratios(times: dict[str, list[float]], block_steps: int) -> dict[str, float]:
    """Median over rounds of (the variant's median step in the round) / (plain's median step in the round)."""

    def block_medians(values):
        return [statistics.median(values[i : i + block_steps]) for i in range(0, len(values), block_steps)]

    plain = block_medians(times["plain"])
    return {
        name: statistics.median(v / p for v, p in zip(block_medians(values), plain)) for name, values in times.items()
    }


def bytes_on_disk(trace_dir: Path) -> dict:
    """Bytes per row of rank 0's files: CSV (format 1) not counting each file's two header lines; format 2 the
    whole of each table's segments (Parquet once compacted at finish)."""
    import diag

    trace = diag.load(trace_dir)
    rank_dir = trace_dir / "rank00000"

    def body_bytes(name: str) -> int:
        if not (rank_dir / f"{name}.csv").exists():
            return sum(p.stat().st_size for p in rank_dir.glob(f"{name}.*") if p.suffix in (".arrows", ".parquet"))
        with open(rank_dir / f"{name}.csv", "rb") as f:
            lines = f.readlines()
        return sum(len(line) for line in lines[2:])

    steps = trace.steps[trace.steps["rank"] == 0]
    colls = trace.collectives[trace.collectives["rank"] == 0]
    all_tables = sum(p.stat().st_size for p in rank_dir.iterdir() if p.name.split(".")[0] in TABLE_NAMES)
    return {
        "bytes_per_step_row": body_bytes("steps") / len(steps),
        "bytes_per_collective_row": body_bytes("collectives") / len(colls),
        "collectives_per_step": len(colls) / len(steps),
        "bytes_per_step_all_tables": all_tables / len(steps),
    }


TABLE_NAMES = ("steps", "collectives", "memory", "phases")


def host_costs(trace_format: int, iterations: int = 20000, pairs: int = 8, pair_steps: int = 800) -> dict:
    """Median microseconds of diag's own host work: one step span, and one recorded collective (the
    wrapper around a collective that does nothing, so that only diag's work is timed)."""
    import torch
    import torch.distributed as dist

    import diag
    from diag.capture import collectives
    from diag.launch import free_port

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1")
    dist.init_process_group("gloo")
    group = dist.group.WORLD
    tensor = torch.ones(1024)

    def no_op_all_reduce(tensor, op=None, group=None, async_op=False):
        return None

    recorded_no_op = collectives._make_wrapper("all_reduce", no_op_all_reduce)
    with tempfile.TemporaryDirectory() as tmp:
        diag.init(tmp, telemetry=False, watchdog=False, trace_format=trace_format)
        empty_ns = timed(lambda: None, iterations)
        span_ns = timed(span_once, iterations)
        record_ns = timed(lambda: recorded_no_op(tensor, group=group), iterations)
        diag.finish()
        sizes = {"rebuilds": pairs, "steps": pair_steps}
        in_step_us, a_a_us, plain_step_us = cost_in_a_real_step(Path(tmp), trace_format, **sizes)
        # training health: without replica fingerprints, and with diag.record(loss, grad_norm) every step
        no_health_us, *_ = cost_in_a_real_step(Path(tmp), trace_format, **sizes, with_a_a=False, fingerprint_every=0)
        with_record_us, *_ = cost_in_a_real_step(Path(tmp), trace_format, **sizes, record_loss=True, with_a_a=False)
    dist.destroy_process_group()
    return {
        "step_span_us": (span_ns - empty_ns) / 1000,
        "collective_record_us": (record_ns - empty_ns) / 1000,
        "in_real_step_us": in_step_us,
        "in_real_step_no_fingerprints_us": no_health_us,
        "in_real_step_with_record_us": with_record_us,
        "a_a_us": a_a_us,
        "plain_step_us": plain_step_us,
        "iterations": iterations,
        "pairs": pairs,
        "pair_steps": pair_steps,
    }


def cost_in_a_real_step(
    tmp: Path,
    trace_format: int,
    rebuilds: int = 8,
    steps: int = 800,
    hidden: int = 900,
    record_loss: bool = False,
    with_a_a: bool = True,
    **init_options,
) -> tuple[float, float, float]:
    """What diag adds to one real step, in microseconds: a one-rank DDP model stepped inside ``diag.step()``
    with its forward, backward, optimizer and DDP buckets instrumented, alternating step by step with the
    same model plain. Step by step in one process the machine's drift cancels, which a 2-rank run cannot
    resolve below about 1%. Fresh pairs of models (built in alternating order: placement alone moves speed)
    and a fresh session per pair, median over pairs of the difference of medians; the same with two plain
    models is the A/A figure. The plain model's backward passes through diag's wrapper too (it wraps
    torch.autograd.backward for the process), so the one frame that costs is not in the figure.

    ``record_loss``: the instrumented step also gives diag its loss and gradient norm (``diag.record``), both
    computed in every step of either model (a user's training loop computes them anyway); ``init_options``
    go to ``diag.init`` (e.g. ``fingerprint_every=0`` to leave replica fingerprints out); ``with_a_a=False``
    skips the A/A pairs (NaN) when another call in the same run measured them. Returns (what diag adds, the
    A/A difference, the plain model's median step over the instrumented pairs), in us."""
    plain_steps_us = []

    def difference(instrument: bool, pair: int) -> float:
        diff_us, _, plain_us = real_step_difference(
            tmp, trace_format, instrument, pair, steps, hidden, record_loss, init_options
        )
        if instrument:
            plain_steps_us.append(plain_us)
        return diff_us

    a_a = statistics.median(difference(False, pair) for pair in range(rebuilds)) if with_a_a else float("nan")
    with_diag = statistics.median(difference(True, pair) for pair in range(rebuilds))
    return with_diag, a_a, statistics.median(plain_steps_us)


def real_step_difference(
    tmp: Path,
    trace_format: int,
    instrument: bool,
    pair: int,
    steps: int,
    hidden: int = 900,
    record_loss: bool = False,
    init_options: dict | None = None,
) -> tuple[float, float, float]:
    """One pair of ``cost_in_a_real_step``: (median step of the instrumented model - median step of the plain
    one, in us; the CPU time of the writer's flushes per second of the run, in ms: its share of a core, 0
    without diag; the plain model's median step, in us)."""
    import torch

    import diag

    batch = (torch.randn(64, hidden), torch.randn(64, 1))
    models = [make_ddp(hidden, 0), make_ddp(hidden, 0)]
    plain, other = models if pair % 2 else models[::-1]
    optimizers = {id(m): torch.optim.SGD(m.parameters(), lr=1e-3) for m in models}
    session = None
    if instrument:
        session = diag.init(
            tmp / f"real-step-{pair}-{len(os.listdir(tmp))}",
            telemetry=False,
            trace_format=trace_format,
            **(init_options or {}),
        )
        diag.instrument(other, optimizers[id(other)])
    times = {id(m): [] for m in models}
    for _ in range(10):  # warm-up
        for model in models:
            train_step(model, optimizers[id(model)], batch)
    started = time.perf_counter()
    for _ in range(steps):
        for model in (plain, other):
            start = time.perf_counter_ns()
            if instrument and model is other:
                with diag.step():
                    loss, grad_norm = train_step(model, optimizers[id(model)], batch, record_loss)
                    if record_loss:
                        diag.record(loss=loss, grad_norm=grad_norm)
            else:
                train_step(model, optimizers[id(model)], batch, record_loss)
            times[id(model)].append(time.perf_counter_ns() - start)
    flush_ms_per_s = 0.0
    if session is not None:
        flush_ms_per_s = session.writer.flush_s * 1e3 / (time.perf_counter() - started)  # before finish's flush
        diag.finish()
    plain_us = statistics.median(times[id(plain)]) / 1000
    return statistics.median(times[id(other)]) / 1000 - plain_us, flush_ms_per_s, plain_us


def formats_side_by_side(pairs: int, pair_steps: int) -> dict:
    """diag's cost in a real step writing schema 1 and schema 2, and the A/A pairs, interleaved pair by pair in
    one process (each pair's order rotated), so the machine's drift falls on all three alike."""
    import torch.distributed as dist

    from diag.launch import free_port

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1")
    dist.init_process_group("gloo")
    results: dict[str, list] = {"a_a": [], "v1": [], "v2": [], "flush_v1": [], "flush_v2": []}
    with tempfile.TemporaryDirectory() as tmp:
        for pair in range(pairs):
            kinds = ["a_a", "v1", "v2"]
            for kind in kinds[pair % 3 :] + kinds[: pair % 3]:
                fmt = 2 if kind == "v2" else 1
                diff_us, flush_ms_per_s, _ = real_step_difference(Path(tmp), fmt, kind != "a_a", pair, pair_steps)
                results[kind].append(diff_us)
                if kind != "a_a":
                    results[f"flush_{kind}"].append(flush_ms_per_s)
    dist.destroy_process_group()
    return results


def formats_table(results: dict) -> Table:
    med = statistics.median
    v2_minus_v1 = [b - a for a, b in zip(results["v1"], results["v2"])]
    table = Table("capture_formats", ["diag's cost in a real step", "median over pairs (us)", "per pair (us)"])
    for label, values in (
        ("schema 1 (CSV)", results["v1"]),
        ("schema 2 (columnar)", results["v2"]),
        ("A/A (plain, plain)", results["a_a"]),
        ("schema 2 - schema 1", v2_minus_v1),
    ):
        table.add(label, f"{med(values):.1f}", _listed(values))
    table.note(f"{len(results['v1'])} pairs of each, interleaved in one process (each pair's order rotated)")
    table.note(
        f"writer thread's flushes, CPU ms per second of the run: schema 1 {med(results['flush_v1']):.2f}, "
        f"schema 2 {med(results['flush_v2']):.2f} (off the training thread, but mostly holding the GIL)"
    )
    return table


def _listed(values: list[float]) -> str:
    return " ".join(f"{v:.1f}" for v in values)


def record_costs(trace_format: int, iterations: int, repeats: int) -> None:
    """Only the host cost of one step span and of one recorded collective (a wrapped collective that does
    nothing), ``repeats`` times in one process: what a change to the per-collective recording costs, resolvable
    on a loaded machine where the end-to-end loop's A/A is not. Run each checkout's code in turn (PYTHONPATH)."""
    import torch
    import torch.distributed as dist

    import diag
    from diag.capture import collectives
    from diag.launch import free_port

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1")
    dist.init_process_group("gloo")
    tensor = torch.ones(1024)
    recorded_no_op = collectives._make_wrapper("all_reduce", lambda tensor, op=None, group=None, async_op=False: None)
    with tempfile.TemporaryDirectory() as tmp:
        diag.init(tmp, telemetry=False, watchdog=False, trace_format=trace_format)
        for _ in range(repeats):
            empty_ns = timed(lambda: None, iterations)
            span_ns = timed(span_once, iterations)
            record_ns = timed(lambda: recorded_no_op(tensor, group=dist.group.WORLD), iterations)
            print(
                f"step span {(span_ns - empty_ns) / 1000:.2f} us, one collective {(record_ns - empty_ns) / 1000:.2f} us"
            )
        diag.finish()
    dist.destroy_process_group()


def span_once() -> None:
    import diag

    with diag.step():
        pass


def timed(function, iterations: int) -> float:
    samples = []
    for _ in range(iterations):
        start = time.perf_counter_ns()
        function()
        samples.append(time.perf_counter_ns() - start)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--trace-dir")
    parser.add_argument("--blocks", type=int, default=20)
    parser.add_argument("--block-steps", type=int, default=10)
    parser.add_argument("--hidden", type=int, default=900)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--rebuild-every", type=int, default=5, help="blocks between fresh models for every variant")
    parser.add_argument(
        "--trace-format",
        type=int,
        default=2,
        choices=(1, 2),
        help="trace schema version diag writes (2: capture's default; 1: CSV)",
    )
    parser.add_argument("--real-step-pairs", type=int, default=8, help="model pairs of the one-process real-step cost")
    parser.add_argument("--real-step-steps", type=int, default=800, help="steps of each model of a pair")
    parser.add_argument("--real-step-only", action="store_true", help="only the host costs and the real-step cost")
    parser.add_argument("--loop-only", action="store_true", help="only the 2-rank loop and the bytes on disk")
    parser.add_argument(
        "--formats-side-by-side",
        action="store_true",
        help="only the real-step cost, schema 1 and 2 and the A/A pairs interleaved (--real-step-pairs/-steps)",
    )
    parser.add_argument(
        "--record-cost-only", type=int, metavar="REPEATS", help="only the span and collective record costs, repeated"
    )
    add_json_option(parser)
    args = parser.parse_args()
    if args.record_cost_only:
        record_costs(args.trace_format, 20000, args.record_cost_only)
        return
    if args.worker:
        overhead_worker(args)
        return
    if args.formats_side_by_side:
        formats_table(formats_side_by_side(args.real_step_pairs, args.real_step_steps)).save(args.json)
        return
    if args.real_step_only:
        costs = host_costs(args.trace_format, pairs=args.real_step_pairs, pair_steps=args.real_step_steps)
        host_costs_table(costs).save(args.json)
        return
    table = overhead_table(args)
    if not args.loop_only:
        costs = host_costs(args.trace_format, pairs=args.real_step_pairs, pair_steps=args.real_step_steps)
        print()
        costs_table = host_costs_table(costs)
        print()
        for what, us in costs_table.rows:  # one table a result: the host costs as the loop table's notes
            table.note(f"{what}, us: {us}")
        for line in costs_table.notes:
            table.note(line)
    table.save(args.json)


def overhead_table(args) -> Table:
    result = run_overhead(args)
    medians = result["median_step_ms"]
    paired = result["paired_ratio"]
    table = Table("capture", ["variant", "median step (ms)", "ratio to plain", "median of per-round ratios"])
    for name in VARIANTS:
        table.add(
            VARIANT_LABELS[name],
            f"{medians[name]:.2f}",
            f"{medians[name] / medians['plain']:.4f}",
            f"{paired[name]:.4f}",
        )
    table.note(
        f"2-rank gloo DDP (3-layer MLP, width {args.hidden}, batch {args.batch}), {result['steps_each']:,} steps of "
        f"each variant, interleaved in blocks of {args.block_steps} steps in shuffled order, fresh models every "
        f"{args.rebuild_every} blocks; trace format {args.trace_format}"
    )
    fr = result["flight_recorder"]
    charged = (medians["diag"] + fr["per_diag_step_ms"]) / medians["plain"]
    table.note(
        f"Flight Recorder reads: {fr['reads']}, {fr['read_s'] * 1000:.1f} ms in all, {fr['per_diag_step_ms'] * 1000:.1f} us "
        f"per step's collectives; diag's ratio with that added (an upper bound: a sixth of it is already in): {charged:.4f}"
    )
    disk = result["disk"]
    table.note(
        f"bytes on disk: {disk['bytes_per_step_row']:.0f} per step row, {disk['bytes_per_collective_row']:.0f} per "
        f"collective row ({disk['collectives_per_step']:.1f} collectives/step), "
        f"{disk['bytes_per_step_all_tables']:.0f} per step over all tables"
    )
    return table


def host_costs_table(costs: dict) -> Table:
    table = Table("capture_real_step", ["what diag adds", "median (us)"])
    plain_us = costs["plain_step_us"]

    def share(us: float) -> str:
        return f"{us:.1f} ({100 * us / plain_us:.2f}%)"

    table.add("host cost of one step span (`with diag.step()`)", f"{costs['step_span_us']:.2f}")
    table.add(
        "host cost of recording a collective (a no-op collective's wrapper)", f"{costs['collective_record_us']:.2f}"
    )
    table.add("real step, diag defaults", share(costs["in_real_step_us"]))
    table.add("real step, A/A (plain against plain)", share(costs["a_a_us"]))
    table.add(
        "real step, without replica fingerprints (`fingerprint_every=0`)",
        share(costs["in_real_step_no_fingerprints_us"]),
    )
    table.add(
        "real step, defaults plus `diag.record(loss, grad_norm)` every step",
        share(costs["in_real_step_with_record_us"]),
    )
    table.note(
        f"span and collective: medians of {costs['iterations']:,} calls. Real step: one-rank DDP (3-layer MLP, width "
        f"900, batch 64; plain step {plain_us / 1000:.2f} ms), step by step against the same model plain, "
        f"{costs['pairs']} pairs of fresh models, {costs['pair_steps']} steps each; the median over pairs of the "
        f"difference of medians (%: of the plain step)"
    )
    return table


if __name__ == "__main__":
    main()
