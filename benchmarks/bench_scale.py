"""`diag analyze` cold, old path against new: the collectives loaded whole in pandas (``--in-memory``) or reduced
rank by rank (``--partitioned``, bounded memory), on synthetic traces of 256, 512 and 1,024 ranks x 1,000 steps x
20 collectives (diag.testing.synthetic, problems planted). Each run is its own process, without the cache;
wall time, CPU time and peak RSS from os.wait4. Both reports must be equal (1e-9 relative) and find the
planted problems.

With ``--dask-workers N`` the partitioned run is also made on a Dask cluster started here (a scheduler and N
single-threaded worker processes on 127.0.0.1): the client's peak RSS, and each worker's, are given.

Also measured once per size: the bytes that move between the passes per rank (pickled instance partial and
reduced sums of one rank), and the instance table's, for docs/scale.md's extrapolation.

    python benchmarks/bench_scale.py                       # 256, 512, 1024 ranks
    python benchmarks/bench_scale.py --ranks 64 --steps 200 --dask-workers 2

``--cold-and-repeat`` measures the partitioned path alone, as a user runs it at scale (no ``--in-memory``
comparison above ``--in-memory-max`` ranks: the whole tables do not fit): generation time and size of a
schema-2 trace (``--format 2``), then ``diag analyze`` cold (no cache yet: it writes the report cache), then the
same command again (the cached report), the planted problems checked on the cold report:

    python benchmarks/bench_scale.py --cold-and-repeat --format 2 --ranks 1024 4096 16384 --root /tmp/scale2
    python benchmarks/bench_scale.py --cold-and-repeat --trace-dir /tmp/scale2/s16384   # a trace written before

Another tree's code on the same trace (its diag is what ``python -m diag`` imports from the working directory),
the cold report kept to compare: ``cd /work/main && PYTHONPATH=/work/main python
/path/to/benchmarks/bench_scale.py --cold-and-repeat --trace-dir DIR --report-out main.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from measured import run_measured  # noqa: E402
from record import Table, add_json_option  # noqa: E402

from diag.testing import synthetic  # noqa: E402
from tests.analysis.golden import differences  # noqa: E402


def analyze_run(trace_dir: Path, *args: str):
    # --fail-on never: the planted problems are high findings, which would end the run with exit status 1
    return run_measured(
        [sys.executable, "-m", "diag", "analyze", str(trace_dir), "--format", "json", "--no-cache", "--fail-on",
         "never", *args]
    )  # fmt: skip


def moved_bytes(trace_dir: Path) -> dict:
    """What moves between the passes on a cluster, per rank: the pickled combined partial and the merged sums of
    one batch of ranks (a Dask task), divided by its ranks; and the instance table broadcast to every worker.
    Measured in a child process (keeps this process small, as measured.py asks)."""
    code = f"""
import pickle, json
from diag.analysis import engine, partitioned as P
try:
    from diag.analysis import collective_waits as W
except ImportError:  # a checkout before the collectives' own module
    W = P
from diag.analysis.window import choose_window
trace = P.load_without_collectives({str(trace_dir)!r})
window = choose_window(trace.steps, None, [])
batch = engine.rank_sources(trace)[: engine.BATCH_RANKS]
collectives = W.Collectives(window)
parts, (partial, _) = collectives.first(batch)
inst = W.instance_table(partial)
sums = collectives.combine2(*(collectives.second(p, W.match_table(inst)) for p in parts))
print(json.dumps({{"part": sum(p.nbytes for p in parts) / len(batch), "rows": sum(p.rows for p in parts) / len(batch),
                   "partial": len(pickle.dumps(partial)) / len(batch), "sums": len(pickle.dumps(sums)) / len(batch),
                   "instances": len(pickle.dumps(W.match_table(inst)))}}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


class Cluster:
    """A dask scheduler and ``workers`` worker processes on 127.0.0.1, as a user starts them."""

    def __init__(self, workers: int, root: Path):
        self.root, self.procs = root, []
        scheduler_file = root / "scheduler.json"
        self._start("distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                    "--scheduler-file", str(scheduler_file))  # fmt: skip
        deadline = time.monotonic() + 60
        while not scheduler_file.exists():
            if time.monotonic() > deadline:
                raise SystemExit("dask scheduler did not start")
            time.sleep(0.2)
        for i in range(workers):
            self._start("distributed.cli.dask_worker", "--scheduler-file", str(scheduler_file), "--nthreads", "1",
                        "--nworkers", "1", "--no-dashboard", "--host", "127.0.0.1",
                        "--local-directory", str(root / f"w{i}"))  # fmt: skip
        self.address = json.loads(scheduler_file.read_text())["address"]
        from distributed import Client

        self.client = Client(self.address)
        self.client.wait_for_workers(workers, timeout=60)

    def _start(self, *args: str) -> None:
        log = (self.root / f"{len(self.procs)}.log").open("w")
        self.procs.append(subprocess.Popen([sys.executable, "-m", *args], stdout=log, stderr=subprocess.STDOUT))

    def worker_peak_rss_gb(self) -> list[float]:
        import resource

        peaks = self.client.run(lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6)
        return sorted(peaks.values())

    def close(self) -> None:
        self.client.close()
        for proc in reversed(self.procs):
            proc.terminate()
        for proc in self.procs:
            proc.wait(timeout=30)


def bench(ranks: int, steps: int, collectives: int, root: Path, dask_workers: int) -> dict:
    trace_dir = root / f"diag-scale-{ranks}"
    shutil.rmtree(trace_dir, ignore_errors=True)
    try:
        plants = synthetic.generate(trace_dir, ranks, steps, collectives)
        old = analyze_run(trace_dir, "--in-memory")
        new = analyze_run(trace_dir, "--partitioned")
        old_report, new_report = json.loads(old.stdout), json.loads(new.stdout)
        problems = synthetic.check_planted(new_report, plants) if ranks >= 5 else []
        diffs = differences(old_report, new_report)
        if diffs:
            problems.append(f"{len(diffs)} differences old/new, e.g. {diffs[:2]}")
        result = {"ranks": ranks, "rows": ranks * steps * collectives, "old": old, "new": new, "problems": problems}
        result["moved"] = moved_bytes(trace_dir)
        if dask_workers:
            cluster = Cluster(dask_workers, Path(tempfile.mkdtemp(prefix="diag-dask-", dir=root)))
            try:
                run = analyze_run(trace_dir, "--scheduler", cluster.address)
                result["dask"] = run
                result["dask_workers_gb"] = cluster.worker_peak_rss_gb()
                if differences(old_report, json.loads(run.stdout)):
                    problems.append("the cluster's report differs")
            finally:
                cluster.close()
                shutil.rmtree(cluster.root, ignore_errors=True)
        return result
    finally:
        shutil.rmtree(trace_dir, ignore_errors=True)


def cold_and_repeat(
    ranks: int, steps: int, collectives: int, root: Path, trace_format: int, in_memory_max: int, existing: Path | None
) -> dict:
    """Generation, then the partitioned path cold (writing the report cache) and repeated (reading it).
    ``existing``: a trace diag.testing.synthetic already wrote (its planted.json), kept; only its report cache is removed."""
    trace_dir = existing or root / f"diag-scale-{ranks}-v{trace_format}"
    if existing is None:
        shutil.rmtree(trace_dir, ignore_errors=True)
    shutil.rmtree(trace_dir / ".diag-cache", ignore_errors=True)
    try:
        start = time.perf_counter()
        if existing is None:
            plants = synthetic.generate(trace_dir, ranks, steps, collectives, trace_format=trace_format)
        else:
            plants = synthetic.Plants(**json.loads((existing / "planted.json").read_text()))
        generate_s = time.perf_counter() - start if existing is None else float("nan")
        size_gb = sum(f.stat().st_size for f in trace_dir.rglob("*") if f.is_file()) / 1e9
        # --fail-on never: the planted problems are high findings, which would end the run with exit status 1
        argv = [sys.executable, "-m", "diag", "analyze", str(trace_dir), "--format", "json", "--fail-on", "never"]
        cold = run_measured(argv)
        repeat = run_measured(argv)
        problems = synthetic.check_planted(json.loads(cold.stdout), plants) if ranks >= 5 else []
        if repeat.stdout != cold.stdout:
            problems.append("the repeat's report differs")
        if "report read from the cache" not in repeat.stderr:
            problems.append("the repeat did not read the cached report")
        if ranks <= in_memory_max:
            old = analyze_run(trace_dir, "--in-memory")
            diffs = differences(json.loads(old.stdout), json.loads(cold.stdout))
            if diffs:
                problems.append(f"{len(diffs)} differences from --in-memory, e.g. {diffs[:2]}")
        return {"ranks": ranks, "generate_s": generate_s, "size_gb": size_gb, "cold": cold, "repeat": repeat,
                "problems": problems, "compared": ranks <= in_memory_max}  # fmt: skip
    finally:
        shutil.rmtree(trace_dir if existing is None else trace_dir / ".diag-cache", ignore_errors=True)


def main_cold_and_repeat(args) -> None:
    """The table is named ``scale_<ranks>`` (``scale_1024_4096`` for several sizes); ``--json`` saves it."""
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs", flush=True)
    table = Table(f"scale_{'_'.join(map(str, args.ranks))}", [
        "ranks", "collective rows", "trace on disk (MB)", "generation (s)", "cold, partitioned: wall (CPU) (s)",
        "peak RSS (GB)", "process tree peak PSS (GB)", "repeat, cached report: wall (CPU) (s)", "peak RSS (GB)",
        "report",
    ])  # fmt: skip
    for ranks in args.ranks:
        r = cold_and_repeat(ranks, args.steps, args.collectives_per_step, args.root, args.format, args.in_memory_max,
                            args.trace_dir)  # fmt: skip
        cold, repeat = r["cold"], r["repeat"]
        if args.report_out is not None:
            args.report_out.write_text(cold.stdout)
        verdict = "planted problems found" + (", equal to --in-memory" if r["compared"] else "")
        table.add(
            f"{ranks:,}", f"{ranks * args.steps * args.collectives_per_step:,}", f"{r['size_gb'] * 1e3:,.0f}",
            f"{r['generate_s']:.0f}", f"{cold.wall_s:.1f} ({cold.cpu_s:.1f})", f"{cold.peak_rss_gb:.2f}",
            f"{cold.tree_peak_gb:.2f}", f"{repeat.wall_s:.1f} ({repeat.cpu_s:.1f})", f"{repeat.peak_rss_gb:.2f}",
            verdict if not r["problems"] else "; ".join(r["problems"]),
        )  # fmt: skip
        print(f"load average now: {os.getloadavg()[0]:.2f}", flush=True)
    table.note(
        f"schema {args.format}, {args.steps:,} steps x {args.collectives_per_step} collectives per rank; times are wall "
        "(CPU user+system) of each diag analyze process"
    )
    table.save(args.json)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, nargs="+", default=[256, 512, 1024])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--collectives-per-step", type=int, default=20)
    parser.add_argument("--dask-workers", type=int, default=0)
    parser.add_argument("--root", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--cold-and-repeat", action="store_true", help="the partitioned path alone: cold, then repeat")
    parser.add_argument("--format", type=int, default=1, choices=(1, 2), help="trace schema version (2: columnar)")
    parser.add_argument("--trace-dir", type=Path, help="with --cold-and-repeat: a trace the generator wrote (one size)")
    parser.add_argument(
        "--report-out", type=Path, help="with --cold-and-repeat: write the cold run's JSON report here (to compare)"
    )
    parser.add_argument(
        "--in-memory-max", type=int, default=2048, help="compare with --in-memory up to this many ranks"
    )
    add_json_option(parser)
    args = parser.parse_args()
    if args.cold_and_repeat:
        if args.trace_dir is not None:
            args.ranks = [len(list(args.trace_dir.glob("rank*")))]
            manifest = json.loads((args.trace_dir / "rank00000" / "manifest.json").read_text())
            args.format = 2 if manifest.get("schema_version") == 2 else 1
        main_cold_and_repeat(args)
        return
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs", flush=True)
    print("Times are wall (CPU user+system) per diag analyze process, cold (--no-cache).")
    dask_head = " on Dask: client | peak RSS | workers' peak RSS |" if args.dask_workers else ""
    print(
        "| ranks | collective rows | --in-memory | peak RSS | --partitioned | peak RSS |"
        f"{dask_head} part held/rank | moved/rank (batch of 64: partial + sums) | instance table | report |"
    )
    print("|---|---|---|---|---|---|" + ("---|---|---|" if args.dask_workers else "") + "---|---|---|---|")
    for ranks in args.ranks:
        r = bench(ranks, args.steps, args.collectives_per_step, args.root, args.dask_workers)
        old, new, moved = r["old"], r["new"], r["moved"]
        dask = ""
        if "dask" in r:
            workers = ", ".join(f"{gb:.2f}" for gb in r["dask_workers_gb"])
            dask = (
                f" {r['dask'].wall_s:.1f} s ({r['dask'].cpu_s:.1f} s) | {r['dask'].peak_rss_gb:.2f} GB | {workers} GB |"
            )
        print(
            f"| {ranks} | {r['rows']:,} | {old.wall_s:.1f} s ({old.cpu_s:.1f} s) | {old.peak_rss_gb:.2f} GB | "
            f"{new.wall_s:.1f} s ({new.cpu_s:.1f} s) | {new.peak_rss_gb:.2f} GB |{dask} "
            f"{moved['part'] / 1e6:.2f} MB ({moved['part'] / moved['rows']:.1f} B/row) | "
            f"{(moved['partial'] + moved['sums']) / 1e6:.2f} MB | {moved['instances'] / 1e6:.2f} MB | "
            f"{'equal, planted problems found' if not r['problems'] else '; '.join(r['problems'])} |",
            flush=True,
        )
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
