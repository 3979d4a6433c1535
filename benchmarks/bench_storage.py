"""Trace storage: bytes per record on disk, the writer's cost per row, and load time, CSV (schema 1) vs columnar (2).

1. Real collectives: ``benchmarks/storage_job.py``, a 2-rank gloo DDP job (every bucket timed by diag's hook),
   captured once per format. Bytes per collective (and step) record of the finished trace (format 2: Parquet
   segments), and of the live Arrow streams before compaction (what a job killed before finish leaves).
2. Synthetic collectives (``diag.testing.synthetic``, 1,000 steps x 20 collectives a rank): bytes per record;
   and the candidate formats on the same rows (``candidates``: CSV, Arrow IPC file, Parquet's defaults, Parquet
   with diag's encodings, the live stream at several batch sizes), which is how the format was chosen.
3. The writer thread's cost per row: CSV formatting and writing vs building a record batch and appending it to
   the stream, on batches of the real job's rows; and compacting a 65,536-row segment into Parquet.
4. Load: ``diag.load`` of a synthetic trace of 256 and 1,024 ranks in a fresh process (no diag cache; the files
   are in the OS page cache, as right after they were written): wall time and peak RSS, for each format, and
   through the cache (``load_cached``) on a repeat.

5. ``loader.to_frame`` alone (``--skip ... load`` keeps it; ``--skip to_frame`` leaves it out): the same ranks'
   Arrow tables converted to pandas by today's ``to_frame`` and by the conversion it replaced (the whole
   concatenated table through ``Table.to_pandas``, then ``astype`` to the nullable dtypes), each in a fresh
   process, alternated: CPU time (the calling thread) and wall time of the conversion, and the process's peak RSS.

usage: python benchmarks/bench_storage.py [--work DIR] [--load-ranks 256 1024] [--steps 1000] [--job-steps 400]
       [--repeats 3] [--skip real synthetic candidates writer load to_frame] [--json PATH]

Every part prints its results as JSON. ``--json PATH`` saves the bytes-per-record table of parts 1 and 2 (the
two formats side by side, record.Table); it needs both:

    python benchmarks/bench_storage.py --skip candidates writer load to_frame --json PATH
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import pyarrow as pa  # noqa: E402
from record import Table, add_json_option  # noqa: E402

from diag.launch import run_ranks  # noqa: E402
from diag.testing import synthetic  # noqa: E402
from diag.trace.columnar import StreamSegmentWriter  # noqa: E402
from diag.trace.loader import load  # noqa: E402
from diag.trace.schema import COLLECTIVES, TABLES  # noqa: E402

FORMATS = (1, 2)
SYNTHETIC_RANKS = 64  # part 2's run


def table_bytes(trace_dir: Path, table: str) -> int:
    """Bytes of one table's files in every rank directory (CSV, or the segments of format 2)."""
    return sum(
        p.stat().st_size
        for p in trace_dir.glob(f"rank*/{table}.*")
        if p.name == f"{table}.csv" or p.suffix in (".arrows", ".parquet")
    )


def trace_bytes(trace_dir: Path) -> int:
    return sum(p.stat().st_size for p in trace_dir.glob("rank*/*") if p.is_file())


def real_job(work: Path, steps: int, step_ms: float) -> dict:
    """Bytes per record of the same real job captured in each format."""
    out = {}
    for trace_format in FORMATS:
        trace_dir = work / f"real-v{trace_format}"
        shutil.rmtree(trace_dir, ignore_errors=True)
        argv = [
            str(REPO / "benchmarks" / "storage_job.py"),
            str(trace_dir),
            str(steps),
            str(step_ms),
            str(trace_format),
        ]
        results = run_ranks(argv, 2, env={"PYTHONPATH": str(REPO)}, timeout_s=600)
        if any(r.returncode != 0 for r in results):
            raise RuntimeError(f"storage_job failed: {[r.stderr[-2000:] for r in results]}")
        live = json.loads(results[0].stdout.strip().splitlines()[-1])
        trace = load(trace_dir)
        rows = {name: len(getattr(trace, name)) for name in ("steps", "collectives", "memory")}
        out[f"v{trace_format}"] = {
            "rows": rows,
            "bytes_per_record": {name: round(table_bytes(trace_dir, name) / n, 2) for name, n in rows.items() if n},
            "live_bytes_per_record_rank0": {
                name: round(live[name] / len(getattr(trace, name).query("rank == 0")), 2)
                for name in rows
                if name in live
            },
            "trace_bytes": trace_bytes(trace_dir),
        }
        steps0 = trace.steps.query("rank == 0")
        run_s = float((steps0["start_us"] + steps0["duration_us"]).max() - steps0["start_us"].min()) / 1e6
        out[f"v{trace_format}"]["collectives_per_0.5s_flush_rank0"] = round(rows["collectives"] / 2 / (run_s / 0.5), 1)
    return out


def synthetic_bytes(work: Path, ranks: int, steps: int) -> dict:
    out = {}
    for trace_format in FORMATS:
        trace_dir = work / f"synth-bytes-v{trace_format}"
        shutil.rmtree(trace_dir, ignore_errors=True)
        synthetic.generate(trace_dir, ranks, steps, 20, trace_format=trace_format)
        records = ranks * steps * 20
        out[f"v{trace_format}"] = {
            "collective_bytes_per_record": round(table_bytes(trace_dir, "collectives") / records, 2),
            "trace_bytes_per_rank": trace_bytes(trace_dir) // ranks,
        }
        shutil.rmtree(trace_dir, ignore_errors=True)
    return out


def _size(n_bytes: float) -> str:
    return f"{n_bytes / 1e6:,.2f} MB" if n_bytes >= 1e6 else f"{n_bytes / 1e3:,.1f} KB"


def bytes_table(real: dict, synth: dict, job_steps: int, synthetic_ranks: int, steps: int) -> Table:
    """Parts 1 and 2 as one table: bytes on disk per record, CSV (format 1) beside format 2."""
    table = Table("storage", ["", "CSV (format 1)", "format 2 (Parquet segments)"])
    v1, v2 = real["v1"], real["v2"]
    per = "B/record"
    table.add(
        "real job, collectives",
        *(f"{v['bytes_per_record']['collectives']:.2f} {per}" for v in (v1, v2)),
    )
    table.add(
        "real job, steps / memory",
        *(f"{v['bytes_per_record']['steps']:.1f} / {v['bytes_per_record']['memory']:.1f} {per}" for v in (v1, v2)),
    )
    table.add("real job, all files", *(_size(v["trace_bytes"]) for v in (v1, v2)))
    table.add(
        "real job, collectives before compaction (rank 0's live stream)",
        *(
            f"{v['live_bytes_per_record_rank0']['collectives']:.1f} {per}"
            if "collectives" in v.get("live_bytes_per_record_rank0", {})
            else "-"
            for v in (v1, v2)
        ),
    )
    s1, s2 = synth["v1"], synth["v2"]
    table.add("synthetic, collectives", *(f"{v['collective_bytes_per_record']:.2f} {per}" for v in (s1, s2)))
    table.add("synthetic, one rank's directory", *(_size(v["trace_bytes_per_rank"]) for v in (s1, s2)))
    table.add(
        "synthetic, 1,024 ranks (1,024 times one rank's)", *(_size(v["trace_bytes_per_rank"] * 1024) for v in (s1, s2))
    )
    table.note(
        f"real job: benchmarks/storage_job.py, 2 ranks x {job_steps} steps, {v2['rows']['collectives']:,} "
        f"collective rows, {v2['rows']['steps']:,} steps rows; synthetic: {synthetic_ranks} ranks x {steps:,} steps "
        "x 20 collectives"
    )
    return table


def writer_cost(trace_dir: Path, batch_rows: int = 100, repeats: int = 30) -> dict:
    """Microseconds per row on the writer thread: format 1's CSV formatting + write, format 2's record batch +
    stream append; and compacting one 65,536-row segment (rows: the real job's collectives, repeated)."""
    from diag.trace.columnar import COMPACT_ROWS
    from diag.trace.writer import format_rows

    frame = load(trace_dir).collectives[COLLECTIVES.column_names]
    rows = [
        COLLECTIVES.row(**{k: (None if v is None or v != v else v) for k, v in zip(COLLECTIVES.column_names, r)})
        for r in frame.astype(object).where(frame.notna(), None).itertuples(index=False)
    ]
    batches = [rows[i : i + batch_rows] for i in range(0, min(len(rows), batch_rows * repeats), batch_rows)]
    with tempfile.TemporaryDirectory() as tmp:
        csv_path = Path(tmp) / "c.csv"
        start = time.perf_counter()
        with open(csv_path, "a") as handle:
            for batch in batches:
                handle.write(format_rows(batch))
                handle.flush()
        csv_us = (time.perf_counter() - start) / sum(map(len, batches)) * 1e6
        segments = StreamSegmentWriter(Path(tmp), COLLECTIVES, compact_rows=1 << 40)
        start = time.perf_counter()
        for batch in batches:
            segments.append(batch)
        arrow_us = (time.perf_counter() - start) / sum(map(len, batches)) * 1e6
        segments.close()
        big = StreamSegmentWriter(Path(tmp), COLLECTIVES, compact_rows=1 << 40)
        many = (rows * (COMPACT_ROWS // len(rows) + 1))[:COMPACT_ROWS]
        for i in range(0, len(many), 1000):
            big.append(many[i : i + 1000])
        start = time.perf_counter()
        big.compact()
        compact_ms = (time.perf_counter() - start) * 1e3
    return {
        "batch_rows": batch_rows,
        "v1_csv_us_per_row": round(csv_us, 2),
        "v2_stream_us_per_row": round(arrow_us, 2),
        "v2_compact_65536_rows_ms": round(compact_ms, 1),
    }


def candidates(trace_dirs: dict[str, Path]) -> dict:
    """Bytes per collective record of rank 0's collectives written each candidate way, the same rows for all:
    CSV as diag writes it, an Arrow IPC file (Feather v2) with zstd, Parquet with pyarrow's defaults (+ zstd),
    Parquet with diag's encodings (the compacted segment), and the live Arrow stream at 50, 100 and 1,000 rows
    a record batch (zstd buffers, dictionary deltas), as the writer appends one batch a flush."""
    import io

    import pyarrow.feather as feather
    import pyarrow.parquet as pq

    from diag.trace.columnar import arrow_schema, parquet_options, write_parquet
    from diag.trace.writer import format_rows

    out = {}
    for label, trace_dir in trace_dirs.items():
        frame = load(trace_dir).collectives.query("rank == 0")[COLLECTIVES.column_names].reset_index(drop=True)
        arrow = pa.Table.from_pandas(frame, preserve_index=False).cast(arrow_schema(COLLECTIVES))
        rows = [
            COLLECTIVES.row(**{k: (None if v is None or v != v else v) for k, v in zip(COLLECTIVES.column_names, r)})
            for r in frame.astype(object).where(frame.notna(), None).itertuples(index=False)
        ]
        n = len(rows)
        sizes = {"csv": len((COLLECTIVES.header() + format_rows(rows)).encode())}
        buffer = io.BytesIO()
        feather.write_feather(arrow, buffer, compression="zstd")
        sizes["arrow_ipc_file_zstd"] = len(buffer.getvalue())
        for name, options in (("parquet_defaults", {}), ("parquet_defaults_zstd", {"compression": "zstd"})):
            buffer = io.BytesIO()
            pq.write_table(arrow, buffer, **options)
            sizes[name] = len(buffer.getvalue())
        with tempfile.TemporaryDirectory() as tmp:
            write_parquet(COLLECTIVES, arrow, Path(tmp) / "c.parquet")
            sizes["parquet_diag_segment"] = (Path(tmp) / "c.parquet").stat().st_size
            for batch_rows in (50, 100, 1000):
                stream = StreamSegmentWriter(Path(tmp), COLLECTIVES, compact_rows=1 << 40)
                for i in range(0, n, batch_rows):
                    stream.append(rows[i : i + batch_rows])
                stream.abandon()
                sizes[f"arrow_stream_{batch_rows}_rows_a_batch"] = stream.bytes_written
                for p in Path(tmp).glob("*.arrows"):
                    p.unlink()
        out[label] = {"rows": n, **{k: round(v / n, 2) for k, v in sizes.items()}}
    assert parquet_options  # the options measured are the writer's own (write_parquet uses them)
    return out


LOAD_SNIPPET = """
import sys, time
t = time.perf_counter()
from diag.trace.{module} import {function}
result = {function}(sys.argv[1]{extra})
trace = result[0] if isinstance(result, tuple) else result
print(time.perf_counter() - t, len(trace.collectives), len(trace.skipped))
"""


def timed_process(code: str, trace_dir: Path, env: dict) -> dict:
    """Run ``code`` in a fresh Python; its wall time (whole process, imports included) and peak RSS."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(trace_dir)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    _, status, usage = os.wait4(proc.pid, 0)
    wall_s = time.perf_counter() - start
    stdout, stderr = proc.stdout.read().decode(), proc.stderr.read().decode()
    if status != 0:
        raise RuntimeError(stderr[-2000:])
    inner_s, rows, skipped = stdout.split()
    return {
        "wall_s": round(wall_s, 2),
        "load_s": round(float(inner_s), 2),
        "peak_rss_mb": round(usage.ru_maxrss / 1024),
        "collective_rows": int(rows),
        "skipped": int(skipped),
    }


def load_times(work: Path, ranks: int, steps: int, repeats: int) -> dict:
    """Both formats generated first, then loaded alternately ``repeats`` times each (cold: a fresh process, no
    diag cache), and through the cache (its second use), so that drift in the machine's load (it is shared)
    falls on both alike; the median of each."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "XDG_CACHE_HOME": str(work / "xdg")}
    cold_code = LOAD_SNIPPET.format(module="loader", function="load", extra="")
    cached_code = LOAD_SNIPPET.format(module="cache", function="load_cached", extra="")
    dirs, out = {}, {}
    for trace_format in FORMATS:
        trace_dir = dirs[trace_format] = work / f"synth-{ranks}-v{trace_format}"
        shutil.rmtree(trace_dir, ignore_errors=True)
        start = time.perf_counter()
        synthetic.generate(trace_dir, ranks, steps, 20, trace_format=trace_format)
        out[f"v{trace_format}"] = {
            "generate_s": round(time.perf_counter() - start, 1),
            "trace_mb": round(trace_bytes(trace_dir) / 2**20, 1),
            "cold": [],
            "cached_repeat": [],
        }
    for _ in range(repeats):
        for trace_format in FORMATS:
            out[f"v{trace_format}"]["cold"].append(timed_process(cold_code, dirs[trace_format], env))
    for trace_format in FORMATS:
        timed_process(cached_code, dirs[trace_format], env)  # writes the cache
    for _ in range(repeats):
        for trace_format in FORMATS:
            out[f"v{trace_format}"]["cached_repeat"].append(timed_process(cached_code, dirs[trace_format], env))
    for trace_format in FORMATS:
        entry = out[f"v{trace_format}"]
        for key in ("cold", "cached_repeat"):
            runs = entry[key]
            entry[key] = {
                "wall_s_median": statistics.median(r["wall_s"] for r in runs),
                "wall_s_each": [r["wall_s"] for r in runs],
                "peak_rss_mb_max": max(r["peak_rss_mb"] for r in runs),
                "collective_rows": runs[0]["collective_rows"],
                "skipped": runs[0]["skipped"],
            }
        shutil.rmtree(dirs[trace_format], ignore_errors=True)
    out["load_average_1min"] = round(os.getloadavg()[0], 1)
    return out


TO_FRAME_SNIPPET = """
import resource, sys, time
import pyarrow as pa
from concurrent.futures import ThreadPoolExecutor
from diag.trace import loader
from diag.trace.schema import TABLES

def whole_table_to_pandas(parts, table):  # one conversion of the whole table, beside loader.to_frame's
    arrow = pa.concat_tables(parts).unify_dictionaries() if len(parts) > 1 else parts[0]
    parts.clear()
    frame = arrow.to_pandas(split_blocks=True, self_destruct=True)
    del arrow
    for column in table.columns:
        if str(frame[column.name].dtype) != column.dtype:
            frame[column.name] = frame[column.name].astype(column.dtype)
    return frame

reader = loader.TraceReader(sys.argv[1])
chunks = {name: [] for name in reader.tables}
with ThreadPoolExecutor(max_workers=loader.READ_THREADS) as pool:
    for result in pool.map(lambda item: reader.read_rank(*item), reader.rank_dirs().items()):
        for name, arrow in result.tables.items():
            chunks[name].append(arrow)
convert = whole_table_to_pandas if sys.argv[2] == "before" else loader.to_frame
cpu, wall = time.thread_time(), time.perf_counter()  # this thread: Table.to_pandas also converts on a pool
frames = {name: convert(chunks[name], TABLES[name]) for name in reader.tables if chunks[name]}
print(time.thread_time() - cpu, time.perf_counter() - wall, sum(len(f) for f in frames.values()), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def to_frame_times(work: Path, ranks: int, steps: int, repeats: int) -> dict:
    """``loader.to_frame`` against the whole-table conversion it replaced, on a schema-2 synthetic trace: fresh
    processes alternated (a process's first large allocations fault pages in: the second conversion in one
    process would look faster whichever it is)."""
    trace_dir = work / f"synth-{ranks}-v2-to-frame"
    shutil.rmtree(trace_dir, ignore_errors=True)
    synthetic.generate(trace_dir, ranks, steps, 20, trace_format=2)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    runs: dict[str, list] = {"before": [], "after": []}
    for _ in range(repeats):
        for which in runs:
            proc = subprocess.Popen(
                [sys.executable, "-c", TO_FRAME_SNIPPET, str(trace_dir), which],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                cwd=str(work),  # not the repository's parent: -c puts the working directory first on sys.path
            )
            stdout, stderr = proc.communicate()
            if proc.returncode != 0:
                raise RuntimeError(stderr.decode()[-2000:])
            cpu_s, wall_s, rows, peak_kb = stdout.decode().split()
            runs[which].append(
                {"cpu_s": float(cpu_s), "wall_s": float(wall_s), "rows": int(rows), "peak_rss_mb": int(peak_kb) // 1024}
            )
    shutil.rmtree(trace_dir, ignore_errors=True)
    return {
        which: {
            "cpu_s_median": round(statistics.median(r["cpu_s"] for r in each), 2),
            "wall_s_median": round(statistics.median(r["wall_s"] for r in each), 2),
            "cpu_s_each": [round(r["cpu_s"], 2) for r in each],
            "wall_s_each": [round(r["wall_s"], 2) for r in each],
            "peak_rss_mb_max": max(r["peak_rss_mb"] for r in each),
            "rows": each[0]["rows"],
        }
        for which, each in runs.items()
    } | {"load_average_1min": round(os.getloadavg()[0], 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", default=None, help="scratch directory (default: a temporary one)")
    parser.add_argument("--load-ranks", type=int, nargs="*", default=[256, 1024])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--job-steps", type=int, default=400)
    parser.add_argument("--step-ms", type=float, default=50.0)
    parser.add_argument("--repeats", type=int, default=3, help="cold loads of each format, alternated")
    parser.add_argument(
        "--skip", nargs="*", default=[], choices=["real", "synthetic", "candidates", "writer", "load", "to_frame"]
    )
    add_json_option(parser)
    args = parser.parse_args()
    if args.json and {"real", "synthetic"} & set(args.skip):
        parser.error("--json saves the bytes-per-record table: it needs the real and synthetic parts")
    work = Path(args.work or tempfile.mkdtemp(prefix="bench-storage-"))
    work.mkdir(parents=True, exist_ok=True)
    results: dict = {"tables": list(TABLES)}
    if "real" not in args.skip:
        results["real_job"] = real_job(work, args.job_steps, args.step_ms)
        print(json.dumps({"real_job": results["real_job"]}), flush=True)
    if "writer" not in args.skip and (work / "real-v2").exists():
        results["writer"] = writer_cost(work / "real-v2")
        print(json.dumps({"writer": results["writer"]}), flush=True)
    if "synthetic" not in args.skip:
        results["synthetic"] = synthetic_bytes(work, SYNTHETIC_RANKS, args.steps)
        print(json.dumps({"synthetic": results["synthetic"]}), flush=True)
    if "real_job" in results and "synthetic" in results:
        bytes_table(results["real_job"], results["synthetic"], args.job_steps, SYNTHETIC_RANKS, args.steps).save(
            args.json
        )
    if "candidates" not in args.skip:
        one = work / "candidates-synthetic"
        shutil.rmtree(one, ignore_errors=True)
        synthetic.generate(one, 1, args.steps, 20)
        dirs = {"synthetic": one, **({"real": work / "real-v1"} if (work / "real-v1").exists() else {})}
        results["candidates"] = candidates(dirs)
        print(json.dumps({"candidates": results["candidates"]}), flush=True)
    if "load" not in args.skip:
        for ranks in args.load_ranks:
            results[f"load_{ranks}"] = load_times(work, ranks, args.steps, args.repeats)
            print(json.dumps({f"load_{ranks}": results[f"load_{ranks}"]}), flush=True)
    if "to_frame" not in args.skip:
        for ranks in args.load_ranks:
            results[f"to_frame_{ranks}"] = to_frame_times(work, ranks, args.steps, args.repeats)
            print(json.dumps({f"to_frame_{ranks}": results[f"to_frame_{ranks}"]}), flush=True)
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
