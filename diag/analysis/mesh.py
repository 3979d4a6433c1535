"""Communication per device-mesh dimension, and which of its groups a slow rank holds up.

A straggler on a dp x tp mesh slows its tp group first: the tp peers wait for it in every tensor-parallel
collective, while the dp groups see the delay only once it has spread. So a rank is placed (``place_rank``) by
the waits in its own group of each dimension against the typical group of that dimension (the median of the
others): the dimension where its own group waits most beyond that is the one it stalls. Reads the communication
report's per-group totals, which every way of analysing the collectives gives, and the mesh from the manifests
(``diag.trace.mesh``).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from diag.analysis.section import Section
from diag.trace.mesh import MeshLayout

if TYPE_CHECKING:  # stragglers imports this module, and comms imports stragglers
    from diag.analysis.comms import CommsReport

MIN_EXCESS_SHARE = 0.25  # a group stalled by the rank waits at least this much more than its dimension's median


@dataclass
class MeshDimension:
    name: str
    size: int  # ranks in each of its groups
    groups: int  # its groups with collectives in the window
    collectives: int
    bytes_total: int
    time_s: float | None  # summed durations of its timed collectives (None: none was timed)
    wait_s: float  # time its ranks waited in them for a peer


@dataclass
class MeshPlacement:
    """Where a rank sits in the mesh and the group of one dimension it holds up most."""

    coords: dict[str, int]
    where: str  # "dp=1, tp=1"
    stalls_dim: str | None = None  # None: no group of it waits much beyond its dimension's typical group
    stalls_ranks: list[int] = field(default_factory=list)
    group_wait_s: float = 0.0  # waits in that group over the window
    typical_wait_s: float = 0.0  # the median over the dimension's other groups

    def text(self) -> str:
        if self.stalls_dim is None:
            return f"in the mesh at {self.where}"
        ranks = ", ".join(str(r) for r in self.stalls_ranks[:8])
        return (
            f"in the mesh at {self.where}: stalls its {self.stalls_dim} group (ranks {ranks}) most, where the "
            f"ranks waited {self.group_wait_s:.2f} s in collectives against {self.typical_wait_s:.2f} s in the "
            f"other {self.stalls_dim} groups (median)"
        )


@dataclass
class MeshReport:
    shape: str  # "dp=2 x tp=2"
    dims: list[MeshDimension]


def analyze_mesh(layout: MeshLayout | None, comms: CommsReport) -> MeshReport | None:
    """Communication per dimension; None for a run without a device mesh."""
    if layout is None:
        return None
    by_dim: dict[str, list] = defaultdict(list)
    for stats in comms.collectives:
        dim = layout.dim_of(stats.pg)
        if dim is not None:
            by_dim[dim].append(stats)
    dims = []
    for dim in layout.dims:
        stats = by_dim.get(dim, [])
        timed = [s.total_time_s for s in stats if s.total_time_s is not None]
        dims.append(
            MeshDimension(
                name=dim,
                size=layout.size(dim),
                groups=len({s.pg for s in stats}),
                collectives=sum(s.count for s in stats),
                bytes_total=sum(s.bytes_total for s in stats),
                time_s=float(sum(timed)) if timed else None,
                wait_s=float(sum(s.wait_total_s for s in stats)),
            )
        )
    return MeshReport(layout.shape_text(), dims)


def group_waits_s(comms: CommsReport) -> dict[str, float]:
    """Per process group: the time its ranks waited in its collectives for a peer, over the window."""
    out: dict[str, float] = defaultdict(float)
    for stats in comms.collectives:
        out[str(stats.pg)] += stats.wait_total_s
    return dict(out)


def place_rank(layout: MeshLayout, waits_s: dict[str, float], rank: int) -> MeshPlacement | None:
    """The rank's coordinates and the dimension whose group it stalls most; None when the mesh does not know it."""
    coords = layout.coords(rank)
    if not coords:
        return None
    placement = MeshPlacement(coords, layout.where(rank))
    best_excess = 0.0
    for dim in coords:
        own = layout.group_of(rank, dim)
        others = [waits_s.get(pg, 0.0) for pg, (d, _) in layout.groups.items() if d == dim and pg != own]
        own_wait = waits_s.get(own, 0.0)
        typical = float(np.median(others)) if others else 0.0
        excess = own_wait - typical
        if own_wait > 0 and excess > MIN_EXCESS_SHARE * own_wait and excess > best_excess:
            best_excess = excess
            placement.stalls_dim, placement.stalls_ranks = dim, list(layout.ranks_of(own))
            placement.group_wait_s, placement.typical_wait_s = own_wait, typical
    return placement


SECTION = Section("mesh", in_json="when_present")  # its findings are the stragglers' and links'
