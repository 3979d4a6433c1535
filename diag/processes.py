"""Worker processes that read a large trace's ranks, each a contiguous share, and talk to this process through a
pipe: what the partitioned analysis (``diag.analysis.partitioned.ProcessEngine``) and ``diag triage``
(``diag.triage.workers``) share. Reading a rank is mostly Python and pyarrow calls on small files, which threads
run one at a time under the GIL; processes use every core.

A worker sends ``("tick", n)`` as it goes (n more ranks done), ``("error", traceback)`` when it fails, and its
results as any other message."""

from __future__ import annotations

import numpy as np


def start_worker(target, *args):
    """(this end of its pipe, the process) of a worker running ``target(pipe, *args)``. Forked where the platform
    can: a worker starts in milliseconds, imports nothing again and re-runs no ``__main__`` (spawn would run a
    caller's script without a main guard)."""
    import multiprocessing

    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    mine, theirs = context.Pipe()
    proc = context.Process(target=target, args=(theirs, *args), daemon=True)
    proc.start()
    theirs.close()
    return mine, proc


def contiguous_shares(items: list, workers: int) -> list[list]:
    """``items`` cut into at most ``workers`` contiguous shares, in order, none empty (the first ones one longer
    where they do not divide evenly)."""
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
