"""`diag analyze TRACE --scheduler ADDRESS` on a real local Dask cluster, against the single-machine run of the
same trace: wall and CPU time, the client's peak RSS, each worker's peak RSS and CPU, the bytes moved, and
whether the two JSON reports are the same.

The cluster is started here as a user starts one (``bench_scale.Cluster``: ``dask scheduler`` and N
``dask worker --nthreads 1`` processes on 127.0.0.1, each its own process). Both analyses run as their own
``python -m diag analyze ... --format json --no-cache`` process (``--no-cache``: nothing is written into the
trace directory, which other benchmarks may read; its listing and times are checked unchanged after).

Bytes moved: every byte received over the TCP connections that have the scheduler's, a worker's or a nanny's
port at one end (client <-> scheduler <-> workers: task submissions, results, the broadcast instance table), from
``ss -tin``'s ``bytes_received`` per socket, sampled every 0.25 s during the run (each byte is received once, by
one end; a connection's last quarter second before it closes may be missed). Also given: the workers' own
counter (``Worker.transfer_outgoing_bytes_total``: what they served, by Dask's size estimate of the results)
and every byte over the loopback interface (``/proc/net/dev``: anything else on loopback counts too).

    python benchmarks/bench_distributed.py /tmp/scale2/s4096 --workers 2
    python benchmarks/bench_distributed.py /tmp/diag-synthetic-1024 --generate 1024 --workers 2

``--generate RANKS`` first writes a synthetic format-2 trace of RANKS ranks x 1,000 steps to TRACE when it holds
none. The figures are printed as they come, then as one row of a table named ``distributed_<ranks>``
(``record.Table``; ``--json PATH`` saves it) with the bytes in detail as notes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_scale import Cluster, analyze_run  # noqa: E402
from record import Table, add_json_option  # noqa: E402
from synthetic_trace import generate_if_missing  # noqa: E402

from tests.analysis.golden import differences  # noqa: E402


def loopback_bytes() -> int:
    """Bytes received on the loopback interface so far (each byte sent over it is received once)."""
    for line in Path("/proc/net/dev").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name.strip() == "lo":
            return int(rest.split()[0])
    return 0


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1].rstrip("]"))


class SocketBytes(threading.Thread):
    """Bytes received on the TCP sockets with one of ``ports`` at either end, by the process that owns each socket:
    each socket's largest ``bytes_received`` seen while sampling, less what it had when sampling started."""

    def __init__(self, ports: set[int], interval_s: float = 0.25):
        super().__init__(daemon=True)
        self.ports, self.interval_s = ports, interval_s
        self.owners: dict = {}  # socket -> pid
        self.start_bytes = self.sample()
        self.seen: dict = dict(self.start_bytes)
        self.done = threading.Event()

    def sample(self) -> dict:
        text = subprocess.run(["ss", "-tinpH"], capture_output=True, text=True).stdout
        found, key = {}, None
        for line in text.splitlines():
            if not line.startswith((" ", "\t")):
                fields = line.split()
                key = None
                if len(fields) >= 5 and {_port(fields[3]), _port(fields[4])} & self.ports:
                    key = (fields[3], fields[4])
                    owner = re.search(r"pid=(\d+)", line)
                    if owner:
                        self.owners[key] = int(owner.group(1))
            elif key is not None:
                received = re.search(r"bytes_received:(\d+)", line)
                found[key] = int(received.group(1)) if received else 0
        return found

    def run(self) -> None:
        while not self.done.wait(self.interval_s):
            for key, received in self.sample().items():
                self.seen[key] = max(received, self.seen.get(key, 0))

    def total(self, cluster_pids: set[int]) -> dict[str, int]:
        """Bytes received by the cluster's processes (scheduler, nannies, workers), by this benchmark's own client,
        and by any other process (the diag analyze client)."""
        self.done.set()
        self.join()
        out = {"cluster": 0, "bench": 0, "client": 0}
        for key, received in self.seen.items():
            pid = self.owners.get(key)
            who = "cluster" if pid in cluster_pids else "bench" if pid == os.getpid() else "client"
            out[who] += received - self.start_bytes.get(key, 0)
        return out


def worker_figures(dask_worker) -> dict:
    """Run on each worker (``Client.run`` passes the worker): its peak RSS, CPU time and transfer counters."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "peak_rss_gb": usage.ru_maxrss / 1e6,  # KiB on Linux
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "sent_bytes": dask_worker.transfer_outgoing_bytes_total,
    }


def signature(trace_dir: Path) -> tuple:
    """The trace directory's listing with sizes and modification times, to check that nothing was written."""
    return tuple(sorted((str(p.relative_to(trace_dir)), p.stat().st_size, p.stat().st_mtime_ns)
                        for p in trace_dir.rglob("*")))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace", type=Path)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--root", type=Path, default=Path(tempfile.gettempdir()), help="cluster's local files")
    parser.add_argument("--no-single", action="store_true", help="skip the single-machine run and the comparison")
    parser.add_argument("--generate", type=int, metavar="RANKS", help="write a synthetic trace first if none")
    add_json_option(parser)
    args = parser.parse_args()
    generate_if_missing(args.trace, args.generate)
    before = signature(args.trace)
    ranks = len([d for d in args.trace.iterdir() if d.name.startswith("rank")])
    free = subprocess.run(["free", "-g"], capture_output=True, text=True).stdout
    print(f"{args.trace}: {ranks} ranks; {os.cpu_count()} CPUs, load average {os.getloadavg()}\n{free}", flush=True)

    root = Path(tempfile.mkdtemp(prefix="diag-dask-", dir=args.root))
    cluster = Cluster(args.workers, root)
    try:
        idle = {a: w["cpu_s"] for a, w in cluster.client.run(worker_figures).items()}
        info = cluster.client.scheduler_info()["workers"]
        ports = {
            _port(cluster.address),
            *map(_port, info),
            *(_port(w["nanny"]) for w in info.values() if w.get("nanny")),
        }
        sockets = SocketBytes(ports)
        sockets.start()
        lo_start = loopback_bytes()
        dask = analyze_run(args.trace, "--scheduler", cluster.address)
        lo_bytes = loopback_bytes() - lo_start
        pids = {proc.pid for proc in cluster.procs} | set(cluster.client.run(os.getpid).values())
        moved = sockets.total(pids)
        workers = cluster.client.run(worker_figures)
    finally:
        cluster.close()
        shutil.rmtree(root, ignore_errors=True)
    print(f"load average after the cluster run: {os.getloadavg()}", flush=True)
    print(f"Dask ({args.workers} workers): wall {dask.wall_s:.1f} s, client CPU {dask.cpu_s:.1f} s, "
          f"client peak RSS {dask.peak_rss_gb:.2f} GB")  # fmt: skip
    for address, w in sorted(workers.items()):
        print(f"  worker {address}: peak RSS {w['peak_rss_gb']:.2f} GB, CPU {w['cpu_s'] - idle[address]:.1f} s, "
              f"sent {w['sent_bytes'] / 1e6:.1f} MB")  # fmt: skip
    sent = sum(w["sent_bytes"] for w in workers.values())
    both = moved["cluster"] + moved["client"]
    print(f"  bytes received over the cluster's connections: {both / 1e6:.1f} MB = {both / ranks / 1e3:.1f} KB/rank: "
          f"by the diag analyze client {moved['client'] / 1e6:.1f} MB, by the scheduler and workers "
          f"{moved['cluster'] / 1e6:.1f} MB (this benchmark's own client: {moved['bench'] / 1e6:.2f} MB)")  # fmt: skip
    print(f"  workers' results sent (to peers and the client): {sent / 1e6:.1f} MB = {sent / ranks / 1e3:.1f} KB/rank; "
          f"loopback during the run: {lo_bytes / 1e6:.1f} MB = {lo_bytes / ranks / 1e3:.1f} KB/rank", flush=True)  # fmt: skip
    report = json.loads(dask.stdout)
    single_cells, same = ["not run"] * 3, "not compared"
    if not args.no_single:
        single = analyze_run(args.trace)
        print(f"single machine: wall {single.wall_s:.1f} s, CPU {single.cpu_s:.1f} s, peak RSS "
              f"{single.peak_rss_gb:.2f} GB, process tree PSS {single.tree_peak_gb:.2f} GB")  # fmt: skip
        diffs = differences(json.loads(single.stdout), report)
        same = "byte-identical" if single.stdout == dask.stdout else f"{len(diffs)} differences (1e-9): {diffs[:5]}"
        print(f"reports: {same}")
        single_cells = [f"{single.wall_s:.1f}", f"{single.cpu_s:.1f}", f"{single.tree_peak_gb:.2f}"]
    print(f"load average at the end: {os.getloadavg()}")
    if signature(args.trace) != before:
        raise SystemExit(f"{args.trace} changed during the benchmark")
    print()
    table = Table(f"distributed_{ranks}", [
        "ranks", "Dask wall (s)", "client CPU (s)", "client peak RSS (GB)", "workers' peak RSS (GB)",
        "workers' CPU (s)", "bytes moved (KB a rank)", "single machine wall (s)", "single machine CPU (s)",
        "single machine tree PSS (GB)", "reports",
    ])  # fmt: skip
    ordered = [workers[a] for a in sorted(workers)]
    table.add(
        f"{ranks:,}", f"{dask.wall_s:.1f}", f"{dask.cpu_s:.1f}", f"{dask.peak_rss_gb:.2f}",
        ", ".join(f"{w['peak_rss_gb']:.2f}" for w in ordered),
        ", ".join(f"{w['cpu_s'] - idle[a]:.1f}" for a, w in sorted(workers.items())),
        f"{both / ranks / 1e3:.1f}", *single_cells, same,
    )  # fmt: skip
    table.note(
        f"{args.workers} `dask worker --nthreads 1` processes and the scheduler on 127.0.0.1, sharing this machine's "
        f"{os.cpu_count()} CPUs with the client"
    )
    table.note(
        f"bytes moved: received over the cluster's connections, {both / 1e6:.1f} MB: by the diag analyze client "
        f"{moved['client'] / 1e6:.1f} MB, by the scheduler and workers {moved['cluster'] / 1e6:.1f} MB; workers' "
        f"results sent {sent / ranks / 1e3:.1f} KB a rank; loopback during the run {lo_bytes / ranks / 1e3:.1f} KB a rank"
    )
    table.save(args.json)


if __name__ == "__main__":
    main()
