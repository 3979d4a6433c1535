"""Time ``diag triage`` on a synthetic hang of many ranks, written in the real trace format.

The job: ``--steps`` steps of data-parallel training, ``--collectives`` gradient all_reduces per step in the
default group. In the last step every rank but one enters the first all_reduce and stays there (its watchdog
dump lists it pending); the stuck rank sits in its data loader, with a watchdog dump whose main-thread stack
shows the loader. Heartbeats, manifests, steps and collectives as capture writes them.

    python benchmarks/bench_triage.py /tmp/triage_bench --ranks 1024 --steps 200
    python benchmarks/bench_triage.py /tmp/watchdog_bench --watchdog [--repeat 5] [--json PATH]   # capture side

At scale (``--scale``): ``diag triage`` as its own process (wall, CPU, peak RSS) on hangs written by
``diag.testing.synthetic --hang`` (1,000 steps x 20 collectives per rank, schema version 2 unless ``--format 1``), one run
of ``--ranks`` each, generated in OUT/hangN when absent and kept (``--keep``) or deleted afterwards; with
``--old`` also the previous reader (every row of every rank, ``read_diag_trace(path, 10**12)``) on the same
trace, and the two verdicts compared:

    python benchmarks/bench_triage.py /tmp/triage_scale --scale --ranks 1024 2048 4096 [--old]

``--baseline DIR``: also the same read by the code of another checkout (``PYTHONPATH=DIR``, e.g. main's), on the
same trace, back to back, and the two verdicts compared whole (evidence included). ``--live``: the hang as a
still-running job leaves it (what capture writes, not the synthetic generator's one Parquet segment a table): each
rank's steps and collectives rewritten as a live Arrow stream segment, one record batch per 0.5 s flush (5 steps,
100 collectives), never compacted (20,000 rows is below the 65,536 that trigger compaction); in OUT/liveN.
``--tables``: also this checkout with no rank judged from its heartbeat (every rank's table tails read);
``--old-heartbeats``: the hang written with heartbeats without ``groups``, as before they existed (OUT/hangoldN).
``--one-process``: also this checkout reading every rank in its own process (no worker processes,
inline on the engine's runner), and in two worker processes whatever the load (the default uses them only on idle
cores). Wall, CPU and peak RSS are the triage process's with its worker processes (os.wait4
counts the children it waited for; the peak is the largest one process's).

    python benchmarks/bench_triage.py DIR --judge-both   # each trace under DIR judged from heartbeats and tables,
                                                         # and read by two worker processes
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from diag.trace.schema import COLLECTIVES, MANIFEST_FILE, STEPS, rank_dir_name

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import Table, add_json_option  # noqa: E402

from diag.testing.synthetic import Pending, write_hang_state  # noqa: E402  the hang's dumps, as --hang plants them

START_US = 1_795_000_000_000_000
STEP_US = 100_000
GRAD_BYTES = 25 * 2**20


def write_rank(root: Path, rank: int, world: int, steps: int, per_step: int, stuck: int) -> None:
    rank_dir = root / rank_dir_name(rank)
    rank_dir.mkdir(parents=True)
    manifest = {"schema_version": 1, "run_id": "bench", "rank": rank, "world_size": world, "pid": 1000 + rank}
    manifest["host"] = f"node{rank // 8:03d}"
    manifest["process_groups"] = {"0": {"ranks": list(range(world)), "size": world, "backend": "nccl"}}
    (rank_dir / MANIFEST_FILE).write_text(json.dumps(manifest))
    step_rows, coll_rows = [], []
    seq = 0
    for step in range(steps):
        start = START_US + step * STEP_US
        step_rows.append(f"{step},{start},{STEP_US},1500,40000,50000,3000,6000,,32,16384,,,\n")  # no loss etc.
        for i in range(per_step):
            seq += 1
            coll_rows.append(
                f"{step},0,{seq},all_reduce,{GRAD_BYTES},bfloat16,,{start + 50_000 + i * 1000},1500.0,0,ddp\n"
            )
    (rank_dir / STEPS.file_name).write_text(STEPS.header() + "".join(step_rows))
    (rank_dir / COLLECTIVES.file_name).write_text(COLLECTIVES.header() + "".join(coll_rows))
    now = START_US + (steps + 3) * STEP_US + 200_000_000
    pending = Pending(seq=seq + 1, op="all_reduce", nbytes=GRAD_BYTES, start_us=START_US + steps * STEP_US + 50_000)
    last_start = START_US + (steps - 1) * STEP_US + 50_000 + (per_step - 1) * 1000
    last = {"seq": seq, "op": "all_reduce", "bytes": GRAD_BYTES, "dtype": "bfloat16", "step": steps - 1}
    write_hang_state(rank_dir, rank, steps, rank == stuck, pending, now, 180.0, {**last, "start_us": last_start})


def generate(root: Path, world: int, steps: int, per_step: int) -> int:
    stuck = world // 2 + 5 if world > 8 else world - 1
    for rank in range(world):
        write_rank(root, rank, world, steps, per_step, stuck)
    return stuck


WATCHDOG_JOB = """
import os, sys, time
os.environ.update(RANK="0", WORLD_SIZE="1")
import torch, diag
out, watchdog, steps = sys.argv[1], sys.argv[2] == "on", int(sys.argv[3])
session = diag.init(out, telemetry=False, watchdog=watchdog, heartbeat_interval_s=0.05, hang_threshold_s=3600)
x = torch.randn(64, 64)
t0 = time.perf_counter()
for _ in range(steps):
    with diag.step():
        x = torch.tanh(x @ x)
loop_us = (time.perf_counter() - t0) / steps * 1e6
tick_us = dump_ms = float("nan")
if watchdog:
    t0 = time.perf_counter()
    for _ in range(500):
        session.watchdog._tick()
    tick_us = (time.perf_counter() - t0) / 500 * 1e6
    t0 = time.perf_counter()
    for _ in range(20):
        session.watchdog.dump("bench")
    dump_ms = (time.perf_counter() - t0) / 20 * 1e3
diag.finish()
print(loop_us, tick_us, dump_ms)
"""


def bench_watchdog(out: Path, steps: int = 5000, repeat: int = 3, json_path: str | None = None) -> None:
    """Step time of a tiny CPU loop with the watchdog off and on (heartbeat every 50 ms, 100x the default
    rate), and the cost of one watchdog tick and one hang dump; off and on alternate, each run its own process."""
    results: dict[str, list[list[float]]] = {"off": [], "on": []}
    for _ in range(repeat):
        for mode in ("off", "on"):
            shutil.rmtree(out, ignore_errors=True)
            run = subprocess.run(
                [sys.executable, "-c", WATCHDOG_JOB, str(out), mode, str(steps)],
                env={**os.environ, "OMP_NUM_THREADS": "1"},
                capture_output=True,
                text=True,
                check=True,
            )
            results[mode].append([float(v) for v in run.stdout.split()])
    table = Table("triage_watchdog", ["measure", f"median of {repeat}"])
    table.add("step loop, watchdog off", f"{statistics.median(r[0] for r in results['off']):.1f} us/step")
    table.add(
        "step loop, watchdog on, heartbeat every 50 ms (100x the default)",
        f"{statistics.median(r[0] for r in results['on']):.1f} us/step",
    )
    table.add(
        "one watchdog tick (heartbeat write), on the watchdog thread",
        f"{statistics.median(r[1] for r in results['on']):,.0f} us",
    )
    table.add(
        "one hang dump (all thread stacks, no Flight Recorder buffer)",
        f"{statistics.median(r[2] for r in results['on']):.2f} ms",
    )
    table.note(f"{steps:,} steps of a 64x64 matmul a run, OMP_NUM_THREADS=1; tick: mean of 500, dump: mean of 20")
    table.save(json_path)


SCALE_TRIAGE = """
import json, sys
from pathlib import Path
from diag.triage.analysis import triage
from diag.triage.sources import read_diag_trace
rows = int(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2] != "-" else None
options = {}  # none: the default, also in a baseline without these options
if "tables" in sys.argv[3:]:
    options["heartbeats"] = False
if "one-process" in sys.argv[3:]:
    options["workers"] = 1
if "two-workers" in sys.argv[3:]:
    options["workers"] = 2
print(json.dumps(triage(read_diag_trace(Path(sys.argv[1]), rows, **options)).to_json()))
"""
READ_NOTES = ("have more records than triage reads", "judged from their heartbeats")  # say what was read: differ


def without_read_notes(verdict: dict) -> dict:
    return {**verdict, "evidence": [e for e in verdict["evidence"] if not any(n in e for n in READ_NOTES)]}


def to_live_streams(trace: Path, rows_per_step: dict[str, int], steps_per_flush: int = 5) -> None:
    """Each rank's steps and collectives (one Parquet segment each) rewritten as capture leaves them in a job
    still running: a live Arrow stream segment with capture's IPC options (zstd buffers, dictionary deltas), one
    record batch per flush, no end-of-stream marker. (Record batches of slices of the table rather than capture's
    own writer, which builds each batch from Python rows: ~0.8 s a rank here; the bytes differ only in the
    dictionaries, sent whole with the first batch instead of growing by deltas.)"""
    import pyarrow as pa
    import pyarrow.ipc as ipc
    import pyarrow.parquet as pq

    from diag.trace.columnar import arrow_schema
    from diag.trace.loader import find_rank_dirs
    from diag.trace.schema import TABLES, segment_name

    options = ipc.IpcWriteOptions(compression="zstd", emit_dictionary_deltas=True, use_threads=False)
    for rank_dir in find_rank_dirs(trace).values():
        for name, per_step in rows_per_step.items():
            table = TABLES[name]
            parquet = rank_dir / segment_name(name, 1, "parquet")
            categories = [c.name for c in table.columns if c.dtype == "category"]
            schema = arrow_schema(table)
            arrow = pq.read_table(parquet, read_dictionary=categories).cast(schema.remove_metadata())
            with pa.OSFile(str(rank_dir / segment_name(name, 1, "arrows")), "wb") as sink:
                stream = ipc.new_stream(sink, schema, options=options)
                for batch in arrow.to_batches(max_chunksize=per_step * steps_per_flush):
                    stream.write_batch(batch.replace_schema_metadata(schema.metadata))
                # not closed: a live stream has no end-of-stream marker
            parquet.unlink()


def bench_scale(
    out: Path,
    ranks: list[int],
    steps: int,
    trace_format: int,
    old: bool,
    keep: bool,
    baseline: Path | None = None,
    live: bool = False,
    rows: int | None = None,
    tables: bool = False,
    old_heartbeats: bool = False,
    one_process: bool = False,
) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from measured import run_measured

    from diag.testing import synthetic

    print(
        f"{'ranks':>6} {'reader':<26} {'wall s':>7} {'CPU s':>7} {'peak RSS GB':>12} {'tree PSS GB':>12} load  verdict"
    )
    for world in ranks:
        trace = out / f"{'live' if live else 'hang'}{'old' if old_heartbeats else ''}{world}"
        if not (trace / "planted.json").exists():
            shutil.rmtree(trace, ignore_errors=True)
            t0 = time.perf_counter()
            synthetic.generate(
                trace, world, steps, 20, trace_format=trace_format, hang=True, heartbeat_groups=not old_heartbeats
            )
            if live:
                (trace / "planted.json").rename(trace / "planted.tmp")  # a half-converted trace is not reused
                to_live_streams(trace, {"steps": 1, "collectives": 20})
                (trace / "planted.tmp").rename(trace / "planted.json")
            print(f"generated {world} ranks x {steps} steps in {time.perf_counter() - t0:.0f} s")
        stuck = json.loads((trace / "planted.json").read_text())["hang_stuck"]
        verdicts = {}
        asked = [str(rows)] if rows else []  # rows a rank, as triage reads of a larger trace (64 at 16,384 ranks)
        readers = [("default" if not rows else f"last {rows} rows", asked, [])]
        # env(1) execs python in the same process (os.wait4 measures python), in the baseline's directory: python -c
        # imports from the working directory first
        if baseline is not None:
            prefix = ["env", "-C", str(baseline), f"PYTHONPATH={baseline}"]
            readers.append((f"{readers[0][0]} ({baseline.name})", asked, prefix))
        if tables:  # every rank's tables read from their ends, no rank judged from its heartbeat
            readers.append(("tables (no heartbeats)", [asked[0] if asked else "-", "tables"], []))
        if one_process:  # this checkout's read without worker processes, and with two whatever the load
            readers.append(("one process (no workers)", [asked[0] if asked else "-", "one-process"], []))
            readers.append(("two worker processes", [asked[0] if asked else "-", "two-workers"], []))
        if old:
            readers.append(("every row (previous)", ["1000000000000"], []))
        for label, extra, prefix in readers:
            run = run_measured([*prefix, sys.executable, "-c", SCALE_TRIAGE, str(trace.resolve()), *extra])
            verdict = json.loads(run.stdout)
            verdicts[label] = verdict
            assert verdict["verdict"] == "missing_ranks" and verdict["culprit_ranks"] == [stuck], verdict["verdict"]
            print(
                f"{world:>6} {label:<26} {run.wall_s:7.1f} {run.cpu_s:7.1f} {run.peak_rss_gb:12.2f} "
                f"{run.tree_peak_gb:12.2f} {os.getloadavg()[0]:4.1f}  "
                f"{verdict['verdict']} {verdict['culprit_ranks']}"
            )
        first = without_read_notes(verdicts[readers[0][0]])
        for label, *_ in readers[1:]:
            if label != "every row (previous)":
                assert without_read_notes(verdicts[label]) == first, label
                print(f"{world:>6} verdict, {label}: equal, evidence and every rank's state included")
        if old:
            same = {k: v for k, v in verdicts[readers[0][0]].items() if k != "evidence"}
            assert same == {k: v for k, v in verdicts["every row (previous)"].items() if k != "evidence"}
            print(f"{world:>6} verdict, culprits, collective, every rank's state: equal")
        if not keep:
            shutil.rmtree(trace)
    print(f"load average (1 min) at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


def judge_both(root: Path) -> None:
    """Each trace directory under ``root`` (e.g. ``faults.py --keep``'s) judged from heartbeats and from its
    tables only: the two verdicts compared whole but for the notes on what was read."""
    from diag.triage.analysis import triage
    from diag.triage.sources import read_diag_trace

    for trace in sorted(p for p in root.iterdir() if p.is_dir()):
        verdicts, judged = {}, 0
        for heartbeats in (True, False):
            data = read_diag_trace(trace, heartbeats=heartbeats, workers=1)
            verdicts[heartbeats] = without_read_notes(triage(data).to_json())
            judged = judged or sum(info.judged_by_heartbeat for info in data.ranks.values())
        # the same trace read by two worker processes (the engine's runner, as a large trace is read): whole verdict
        in_workers = triage(read_diag_trace(trace, workers=2)).to_json()
        verdict = verdicts[True]
        print(
            f"{trace.name:20s} judged from heartbeats {judged}/{len(data.ranks)}  {verdict['verdict']} "
            f"{verdict['culprit_ranks']}  equal to the tables' verdict: {verdicts[True] == verdicts[False]}  "
            f"read by 2 workers equal: {without_read_notes(in_workers) == verdict}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--scale", action="store_true", help="diag triage at scale on synthetic --hang runs")
    parser.add_argument("--format", type=int, default=2, choices=(1, 2), help="with --scale: the trace format")
    parser.add_argument("--old", action="store_true", help="with --scale: also the previous whole-table reader")
    parser.add_argument("--keep", action="store_true", help="with --scale: keep the generated traces")
    parser.add_argument("--baseline", type=Path, help="with --scale: also another checkout's code (PYTHONPATH)")
    parser.add_argument("--live", action="store_true", help="with --scale: the hang as live stream segments")
    parser.add_argument("--rows", type=int, help="with --scale: rows a rank read (default: triage's own choice)")
    parser.add_argument("--tables", action="store_true", help="with --scale: also with no rank judged by heartbeat")
    parser.add_argument(
        "--old-heartbeats", action="store_true", help="with --scale: heartbeats without groups (an old trace)"
    )
    parser.add_argument(
        "--one-process", action="store_true", help="with --scale: also this checkout in one process, and in two"
    )
    parser.add_argument("--ranks", type=int, nargs="+", default=[1024])
    parser.add_argument("--steps", type=int, help="steps per rank (default 200; with --scale 1000)")
    parser.add_argument("--collectives", type=int, default=4, help="all_reduces per step")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--watchdog", action="store_true", help="measure the capture-side watchdog instead")
    parser.add_argument("--judge-both", action="store_true", help="OUT holds traces: judge each both ways")
    add_json_option(parser)
    args = parser.parse_args()
    if args.json and not args.watchdog:
        parser.error("--json: only with --watchdog (the other modes print their figures)")
    if args.judge_both:
        judge_both(args.out)
        return
    if args.scale:
        bench_scale(
            args.out,
            args.ranks,
            args.steps or 1000,
            args.format,
            args.old,
            args.keep,
            args.baseline,
            args.live,
            args.rows,
            args.tables,
            args.old_heartbeats,
            args.one_process,
        )
        return
    args.ranks, args.steps = args.ranks[0], args.steps or 200
    if args.watchdog:
        bench_watchdog(args.out, repeat=args.repeat, json_path=args.json)
        return
    if args.out.exists():
        shutil.rmtree(args.out)
    t0 = time.perf_counter()
    stuck = generate(args.out, args.ranks, args.steps, args.collectives)
    rows = args.ranks * args.steps * args.collectives
    print(f"generated {args.ranks} ranks, {rows:,} collective rows in {time.perf_counter() - t0:.1f} s")

    from diag.triage.analysis import triage
    from diag.triage.sources import read_input

    read_s, analyse_s = [], []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        data = read_input(args.out)
        t1 = time.perf_counter()
        verdict = triage(data)
        read_s.append(t1 - t0)
        analyse_s.append(time.perf_counter() - t1)
    assert verdict.verdict == "missing_ranks" and verdict.culprit_ranks == [stuck], verdict.to_json()
    assert verdict.ranks[stuck].state == "stuck_in_data_loader"
    print(f"read (diag.load + dumps): median {statistics.median(read_s):.2f} s over {args.repeat}")
    print(f"analysis:                 median {statistics.median(analyse_s):.2f} s")
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "diag", "triage", str(args.out)], capture_output=True, text=True)
    print(f"`diag triage` end to end: {time.perf_counter() - t0:.2f} s (exit {out.returncode})")
    print(out.stdout.splitlines()[0])


if __name__ == "__main__":
    main()
