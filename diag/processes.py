"""Where rank-parallel work runs: the one decision (``worker_count``) and the worker processes that read a large
trace's ranks, each a contiguous share, talking to this process through a pipe. The analysis engine
(``diag.analysis.engine``: ``--workers N`` processes or inline), ``diag triage``'s
read (on the same engine) and the dashboard's first read all ask ``worker_count``. Reading a rank is mostly Python
and pyarrow calls on small files, which threads run one at a time under the GIL; processes use every core.

The worker count comes from the machine (the cores this process may run on) and the trace's size, never from the
load average: on a box busy with other work the user says ``--workers 1``.

A worker sends ``("tick", n)`` as it goes (n more ranks done), ``("error", traceback)`` when it fails, and its
results as any other message."""

from __future__ import annotations

import os
import threading

# above this many rank directories the collectives are never loaded whole (~5 GB per thousand ranks): they are
# reduced rank by rank (diag.analysis.partitioned), by diag analyze and the dashboard alike
PARTITIONED_MIN_RANKS = 64
# from this many ranks worker processes pay by default: their start (~1 s with the fork and the pickling of what
# they send back) is then a small share of the read; below it a few threads here are as fast
PROCESS_MIN_RANKS = 512
# the default's cap: each worker holds its share's partial results, and more than a few cores' worth is a Dask
# cluster's job (diag analyze --scheduler)
WORKERS_MAX = 4


def default_workers() -> int:
    """The cores this process may run on (its CPU affinity: a container's or a job's share, not the machine's),
    at most WORKERS_MAX."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, WORKERS_MAX))


def worker_count(ranks: int, workers: int | None = None) -> int:
    """How many worker processes do the per-rank work of ``ranks`` ranks; 1: all of it in this process.

    ``workers`` (the user's ``--workers``) wins, capped at the number of ranks. Otherwise 1 in a process that runs
    other threads (the dashboard's server): a fork copies the locks those threads hold, not the threads that would
    release them, so a worker could wait forever on one. Otherwise 1 below PROCESS_MIN_RANKS ranks, else
    ``default_workers()``."""
    if workers is not None:
        if workers < 1:
            raise ValueError(f"workers must be at least 1, not {workers}")
        return max(1, min(workers, ranks))
    if threading.active_count() > 1 or ranks < PROCESS_MIN_RANKS:
        return 1
    return default_workers()


def start_worker(target, *args):
    """(this end of its pipe, the process) of a worker running ``target(pipe, *args)``, started as
    ``pool_context`` says."""
    context = pool_context()
    mine, theirs = context.Pipe()
    proc = context.Process(target=target, args=(theirs, *args), daemon=True)
    proc.start()
    theirs.close()
    return mine, proc


def pool_context():
    """The multiprocessing context workers start from: fork where the platform can (a worker starts in
    milliseconds, imports nothing again and re-runs no ``__main__``: spawn would run a caller's script without a
    main guard)."""
    import multiprocessing

    return multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")


def contiguous_shares(items: list, workers: int) -> list[list]:
    """``items`` cut into at most ``workers`` contiguous shares, in order, none empty (the first ones one longer
    where they do not divide evenly)."""
    import numpy as np

    return [[items[i] for i in share] for share in np.array_split(np.arange(len(items)), workers) if len(share)]


def next_result(pipe, tick, who: str, columns: dict | None = None) -> tuple:
    """The worker's next result message, its progress ticks counted on the way (``tick(n)``, or None) and, with
    ``columns``, its ``("column", name, values)`` messages gathered there; its error raised here, saying
    ``who`` failed."""
    while True:
        message = pipe.recv()
        if message[0] == "tick":
            if tick is not None:
                tick(message[1])
        elif message[0] == "column" and columns is not None:
            columns[message[1]] = message[2]
        elif message[0] == "error":
            raise RuntimeError(f"a worker process of {who} failed:\n{message[1]}")
        else:
            return message
