"""A device mesh as the process groups of a trace describe it: which mesh dimension each group is, and where each
rank sits.

torch's ``DeviceMesh`` makes one process group per slice of each dimension and describes it as
``mesh_<dimension>`` (``mesh_dp``, ``mesh_tp``; ``mesh_dim_0`` when the dimensions have no names), in every rank's
manifest and in Flight Recorder's ``pg_config``. Capture also records the dimension of the groups of a mesh it
found on an instrumented module (``ProcessGroupInfo.mesh_dim``), which names a group whatever its description.
torch lists a slice's ranks in mesh order, so a rank's coordinate along a dimension is its position in its group
of that dimension: on a dp=2 x tp=2 mesh, rank 3 is in the tp group [2, 3] at 1 and in the dp group [1, 3] at 1.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

MESH_DESC_PREFIX = "mesh_"
# the group a dimension spanning every rank is given when torch cannot reuse the default one: no slice of a mesh
WHOLE_WORLD_DESC = "mesh_default"


def dimension_of(desc: str | None, mesh_dim: str | None = None) -> str | None:
    """The mesh dimension a process group is: what capture recorded, else what torch's description says."""
    if mesh_dim:
        return mesh_dim
    if desc and desc.startswith(MESH_DESC_PREFIX) and desc != WHOLE_WORLD_DESC:
        return desc[len(MESH_DESC_PREFIX) :] or None
    return None


@dataclass
class MeshLayout:
    """The mesh's dimensions (in mesh order where a manifest recorded it) and its groups: name -> (dimension,
    ranks in mesh order)."""

    dims: list[str]
    groups: dict[str, tuple[str, tuple[int, ...]]]
    _group_by_rank: dict[tuple[str, int], str] = field(default_factory=dict, repr=False)

    @classmethod
    def from_groups(
        cls, described: Iterable[tuple[str, str | None, Sequence[int]]], dim_order: Sequence[str] = ()
    ) -> MeshLayout | None:
        """From (group name, dimension or None, ranks) triples; None without two dimensions: a one-dimensional
        mesh (FSDP2's over the world) places a rank nowhere its rank number does not."""
        groups: dict[str, tuple[str, tuple[int, ...]]] = {}
        for name, dim, ranks in described:
            if dim and ranks and name not in groups:
                groups[name] = (dim, tuple(int(r) for r in ranks))
        seen = list(dict.fromkeys(dim for dim, _ in groups.values()))
        if len(seen) < 2:
            return None
        dims = [d for d in dim_order if d in seen] + [d for d in seen if d not in dim_order]
        return cls(dims, groups)

    @classmethod
    def from_manifests(cls, manifests: Mapping) -> MeshLayout | None:
        """From every rank's manifest: each rank describes the groups it belongs to."""
        dim_order: list[str] = []
        described = []
        for manifest in manifests.values():
            mesh = manifest.device_mesh or {}
            names = mesh.get("dim_names") if isinstance(mesh, dict) else None
            if not dim_order and isinstance(names, list):
                dim_order = [str(n) for n in names]
            described += [
                (name, dimension_of(group.desc, group.mesh_dim), group.ranks)
                for name, group in manifest.process_groups.items()
            ]
        return cls.from_groups(described, dim_order)

    def dim_of(self, pg: str) -> str | None:
        group = self.groups.get(str(pg))
        return group[0] if group else None

    def ranks_of(self, pg: str) -> tuple[int, ...]:
        group = self.groups.get(str(pg))
        return group[1] if group else ()

    def size(self, dim: str) -> int:
        """Ranks in each of the dimension's groups."""
        return max((len(ranks) for d, ranks in self.groups.values() if d == dim), default=0)

    def group_of(self, rank: int, dim: str) -> str | None:
        """The group of ``dim`` that ``rank`` belongs to (None when no rank's manifest described it)."""
        if not self._group_by_rank:
            self._group_by_rank = {(d, r): name for name, (d, ranks) in self.groups.items() for r in ranks}
        return self._group_by_rank.get((dim, int(rank)))

    def coords(self, rank: int) -> dict[str, int]:
        """The rank's position along each dimension whose group it is known to be in."""
        out = {}
        for dim in self.dims:
            group = self.group_of(rank, dim)
            if group is not None:
                out[dim] = self.groups[group][1].index(int(rank))
        return out

    def where(self, rank: int) -> str:
        """'dp=1, tp=1': the rank's coordinates, or '' when none is known."""
        return ", ".join(f"{dim}={index}" for dim, index in self.coords(rank).items())

    def shape_text(self) -> str:
        """'dp=2 x tp=2'."""
        return " x ".join(f"{dim}={self.size(dim)}" for dim in self.dims)

    def group_text(self, pg: str) -> str:
        """'the tp group of ranks 2, 3', or '' for a group that is no mesh dimension's."""
        group = self.groups.get(str(pg))
        if group is None:
            return ""
        dim, ranks = group
        shown = ", ".join(str(r) for r in ranks[:8]) + (f" ... ({len(ranks)} ranks)" if len(ranks) > 8 else "")
        return f"the {dim} group of ranks {shown}"
