"""Where rank-parallel work runs: the one decision (``worker_count``) and the one pool of worker processes
(``Workers``) that does it, each worker a contiguous share of the ranks, talking to this process through a pipe.
The analysis engine (``diag.analysis.engine``: ``--workers N`` processes or inline), ``diag triage``'s read (on
the same engine) and the dashboard's first read all ask ``worker_count``. Reading a rank is mostly Python and
pyarrow calls on small files, which threads run one at a time under the GIL; processes use every core.

The worker count comes from the machine (the cores this process may run on) and the trace's size, never from the
load average: on a box busy with other work the user says ``--workers 1``.

A worker sends ``("tick", n)`` as it goes (n more ranks done), ``("column", name, values)`` for each column it
streams, ``("error", traceback)`` when its call fails and ``("done", result)`` when it succeeds."""

from __future__ import annotations

import contextlib
import os
import threading
import traceback

# above this many rank directories the collectives are never loaded whole (~5 GB per thousand ranks): they are
# reduced rank by rank (diag.analysis.collective_waits), by diag analyze and the dashboard alike
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


class Workers:
    """``count`` forked worker processes, started once (``start``, or ``with``: fork them before this process
    runs other threads, whose locks a fork would copy held) and reused by every ``call`` until ``close``. Each
    worker keeps a dict of its own across calls, so a later call can use what an earlier one left there.
    ``count`` 1 is this process alone: nothing is forked, and the runs given the pool are inline."""

    def __init__(self, count: int):
        self.count, self._pipes, self._procs = count, [], []

    def __enter__(self) -> Workers:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        """Fork the workers, once (forked before a load, a worker shares none of its pages: its PSS is its own)."""
        if self._procs or self.count < 2:
            return
        try:
            for _ in range(self.count):
                pipe, proc = start_worker(_serve)
                self._pipes.append(pipe)
                self._procs.append(proc)
        except BaseException:
            self.close()
            raise

    def close(self, stop_timeout_s: float = 30.0) -> None:
        """Stop the workers; kill one still running ``stop_timeout_s`` after it was told to stop."""
        for pipe in self._pipes:
            with contextlib.suppress(OSError):  # a worker that died: nothing to say to it
                pipe.send(("stop",))
        for proc in self._procs:
            proc.join(timeout=stop_timeout_s)
            if proc.is_alive():
                proc.kill()
                proc.join()
        self._pipes, self._procs = [], []

    def call(self, function, shares: list, progress=None, streamed: bool = False) -> list:
        """Worker i's ``function(shares[i], local, channel)`` (top-level: it is pickled with its share), for
        every share, their results in share order. ``local``: the worker's own dict; ``channel``: its
        ``Channel`` to this process; ``progress(n)``: its ticks counted as they come. ``streamed``: each
        result is (what the function returned, the columns it streamed, by name). A worker's error, or a worker
        that stops before it answers, is raised here; the workers are then killed (what they were doing when
        the call failed is unknown), and the pool takes no more calls."""
        if not self._procs:
            raise RuntimeError("the worker processes are not running: start() them first (a failed call stops them)")
        if len(shares) > self.count:
            raise ValueError(f"{len(shares)} shares for {self.count} worker processes")
        try:
            for pipe, share in zip(self._pipes, shares):
                pipe.send(("call", function, share))
            return [self._answer(i, function, progress, streamed) for i in range(len(shares))]
        except BaseException:
            self.close(stop_timeout_s=0)
            raise

    def _answer(self, i: int, function, progress, streamed: bool):
        """Worker i's result, its ticks counted on the way (``progress(n)``) and, ``streamed``, its columns
        gathered; its error raised here, naming the function that failed."""
        who, columns = f"{function.__module__}.{function.__qualname__}", {}
        while True:
            try:
                message = self._pipes[i].recv()
            except EOFError:  # its end of the pipe closed: the process is gone
                self._procs[i].join(timeout=1)
                raise RuntimeError(
                    f"a worker process of {who} stopped before it answered (exit code {self._procs[i].exitcode})"
                ) from None
            if message[0] == "tick" and progress is not None:
                progress(message[1])
            elif message[0] == "column":
                columns[message[1]] = message[2]
            elif message[0] == "error":
                raise RuntimeError(f"a worker process of {who} failed:\n{message[1]}")
            elif message[0] == "done":
                return (message[1], columns) if streamed else message[1]


class Channel:
    """What a function a worker runs says to the caller while it runs: ``tick(n)``, n more ranks done; ``column``,
    one column of a frame sent column by column (one column's pickle in flight, not a share's whole frame)."""

    def __init__(self, pipe):
        self._pipe = pipe

    def tick(self, n: int) -> None:
        self._pipe.send(("tick", n))

    def column(self, name: str, values) -> None:
        self._pipe.send(("column", name, values))


def _serve(pipe) -> None:
    """A worker of ``Workers``: each call's function on its share, until told to stop or its caller is gone."""
    local, channel = {}, Channel(pipe)
    while True:
        try:
            message = pipe.recv()
        except EOFError:  # the calling process is gone
            return
        if message[0] != "call":
            return
        _, function, share = message
        try:
            pipe.send(("done", function(share, local, channel)))
        except Exception:  # noqa: BLE001 - said to the caller, which raises it
            pipe.send(("error", traceback.format_exc()))
        del message, share
        release_heap_memory()  # the worker lives on: what this call freed is not its peak for the next


def start_worker(target, *args):
    """(this end of its pipe, the process) of a worker running ``target(pipe, *args)``: forked where the platform
    can (a worker starts in milliseconds, imports nothing again and re-runs no ``__main__``: spawn would run a
    caller's script without a main guard)."""
    import multiprocessing

    context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    mine, theirs = context.Pipe()
    proc = context.Process(target=target, args=(theirs, *args), daemon=True)
    proc.start()
    theirs.close()
    return mine, proc


def contiguous_shares(items: list, workers: int) -> list[list]:
    """``items`` cut into at most ``workers`` contiguous shares, in order, none empty (the first ones one longer
    where they do not divide evenly)."""
    import numpy as np

    return [[items[i] for i in share] for share in np.array_split(np.arange(len(items)), workers) if len(share)]


def release_heap_memory() -> None:
    """glibc keeps the freed parts (thousands of arrays under its mmap threshold) in its heap: trimmed, the
    process peak at 1,024 ranks goes from 1.29 to ~0.91 GB (the analyses reuse nothing of it). No-op elsewhere."""
    import ctypes
    import ctypes.util

    with contextlib.suppress(OSError, AttributeError, TypeError):  # not glibc (musl, macOS): nothing to trim
        ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim(0)
