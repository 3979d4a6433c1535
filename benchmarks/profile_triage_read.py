"""What one rank costs ``diag triage`` to read: stage 1 of its read (``sources.TailRead.first``: its side files,
then its steps and collectives tails, as of a trace whose heartbeats decide no rank) run in this one process over
``--ranks`` ranks of a trace, CPU per rank (user and system apart); ``--profile``: where it goes (cProfile, by own
time); ``--pool system``: glibc's allocator for Arrow's buffers instead of pyarrow's default (mimalloc here);
``--rows``: rows a rank (default 64, what triage reads at 16,384 ranks); ``--all-columns``: every column decoded,
as before triage decoded only its own.

    python benchmarks/profile_triage_read.py /tmp/triage3/old16384 --ranks 1000 --first 3000 [--pool default]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import resource
from pathlib import Path

import pyarrow as pa

from diag.analysis.engine import RankSource
from diag.trace.loader import TraceReader
from diag.triage.sources import TailRead


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace", type=Path)
    parser.add_argument("--ranks", type=int, default=1000)
    parser.add_argument("--first", type=int, default=0, help="the first rank read (pages of others not cached)")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--pool", choices=("system", "default"), default="default")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--all-columns", action="store_true", help="decode every column (before: no pruning)")
    args = parser.parse_args()
    share = list(TraceReader(args.trace).rank_dirs().items())[args.first : args.first + args.ranks]
    if args.pool == "system":
        pa.set_memory_pool(pa.system_memory_pool())
    if args.all_columns:
        from diag.triage import tail

        tail.tail_columns = lambda table: None
    before = resource.getrusage(resource.RUSAGE_SELF)
    profile = cProfile.Profile() if args.profile else None
    if profile is not None:
        profile.enable()
    TailRead(str(args.trace), args.rows, use_heartbeats=False).first(
        [RankSource(str(args.trace), rank, str(rank_dir), None) for rank, rank_dir in share]
    )
    if profile is not None:
        profile.disable()
    after = resource.getrusage(resource.RUSAGE_SELF)
    n = len(share)
    user_ms = (after.ru_utime - before.ru_utime) / n * 1e3
    sys_ms = (after.ru_stime - before.ru_stime) / n * 1e3
    pool = pa.default_memory_pool().backend_name
    print(f"{n} ranks, pool {pool}: {user_ms + sys_ms:.2f} ms CPU a rank (user {user_ms:.2f}, system {sys_ms:.2f})")
    if profile is not None:
        pstats.Stats(profile).sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
    main()
