"""Collectives of 8 ranks on 4 hosts with chosen links made slow, for the slow-link analysis and its page."""

from __future__ import annotations

import numpy as np
import pandas as pd

from diag.analysis.collective_waits import loaded_waits
from diag.analysis.links import analyze_links

HOSTS = {r: f"node{r // 2}" for r in range(8)}  # 4 hosts x 2 ranks
TRANSFER_US = 800.0  # 1 MiB all_reduce between two ranks at about 1.3 GB/s busbw
STEPS = 10


def layout() -> dict[str, list[int]]:
    """Intra-host pairs (tp0..tp3) and every cross-host pair of ranks with the same local rank (x*)."""
    groups = {f"tp{h}": [2 * h, 2 * h + 1] for h in range(4)}
    for local in (0, 1):
        for a in range(4):
            for b in range(a + 1, 4):
                groups[f"x{local}_{a}{b}"] = [2 * a + local, 2 * b + local]
    return groups


def collectives(groups: dict[str, list[int]], slowdown, seed: int = 0) -> pd.DataFrame:
    """``slowdown(pg, ranks) -> factor`` on each group's transfer; every collective of every group, per step."""
    rng = np.random.default_rng(seed)
    rows = []
    for step in range(STEPS):
        for pg, ranks in groups.items():
            intra = len({HOSTS[r] for r in ranks}) == 1
            transfer = TRANSFER_US * (0.25 if intra else 1.0) * slowdown(pg, ranks) * rng.lognormal(0, 0.05)
            last = ranks[step % len(ranks)]
            for rank in ranks:
                wait = 0.0 if rank == last else rng.uniform(50, 500)
                rows.append(
                    {
                        "rank": rank,
                        "step": step,
                        "pg": pg,
                        "seq": step,
                        "op": "all_reduce",
                        "bytes": 1 << 20,
                        "dtype": "float32",
                        "peer": pd.NA,
                        "start_us": 1_000_000 * step,
                        "duration_us": transfer + wait,
                        "blocking": 1,
                        "source": "py",
                    }
                )
    frame = pd.DataFrame(rows)
    frame["pg"] = frame["pg"].astype("category")
    frame["op"] = frame["op"].astype("category")
    frame["duration_us"] = frame["duration_us"].astype("Float64")
    return frame


def links_of(groups, slowdown):
    return analyze_links(loaded_waits(collectives(groups, slowdown), None), groups, HOSTS)
