"""The device mesh read from the process groups a trace describes (diag.trace.mesh), and a slow rank placed in it
(diag.analysis.mesh): coordinates, the dimension it stalls, communication per dimension."""

from diag.analysis.comms import CollectiveStats, CommsReport
from diag.analysis.mesh import analyze_mesh, group_waits_s, place_rank
from diag.trace.manifest import Manifest, ProcessGroupInfo
from diag.trace.mesh import MeshLayout, dimension_of

# dp=2 x tp=2 as torch 2.13 names it on gloo: dp groups "1" [0, 2] and "2" [1, 3], tp groups "3" [0, 1], "4" [2, 3]
GROUPS = {"1": ("dp", (0, 2)), "2": ("dp", (1, 3)), "3": ("tp", (0, 1)), "4": ("tp", (2, 3))}


def _manifests(with_mesh_dim: bool) -> dict[int, Manifest]:
    out = {}
    for rank in range(4):
        groups = {"0": ProcessGroupInfo("0", (0, 1, 2, 3), 4, "gloo", "default_pg")}
        for name, (dim, ranks) in GROUPS.items():
            if rank in ranks:
                groups[name] = ProcessGroupInfo(
                    name, ranks, 2, "gloo", f"mesh_{dim}", mesh_dim=dim if with_mesh_dim else None
                )
        out[rank] = Manifest(rank, process_groups=groups, device_mesh={"dim_names": ["dp", "tp"]})
    return out


def test_dimension_from_what_capture_recorded_else_from_torchs_description():
    assert dimension_of("mesh_tp") == "tp"
    assert dimension_of("mesh_dim_1") == "dim_1"  # a mesh without dimension names
    assert dimension_of("mesh_default") is None  # a whole-world group: no slice of a mesh
    assert dimension_of("default_pg") is None and dimension_of(None) is None
    assert dimension_of("my_group", mesh_dim="dp_shard") == "dp_shard"


def test_coordinates_are_positions_in_each_dimensions_group_in_mesh_order():
    for with_mesh_dim in (True, False):  # the descriptions alone give the same mesh
        mesh = MeshLayout.from_manifests(_manifests(with_mesh_dim))
        assert mesh.dims == ["dp", "tp"] and mesh.shape_text() == "dp=2 x tp=2"
        assert [mesh.where(r) for r in range(4)] == ["dp=0, tp=0", "dp=0, tp=1", "dp=1, tp=0", "dp=1, tp=1"]
        assert mesh.dim_of("4") == "tp" and mesh.dim_of("0") is None
        assert mesh.group_text("2") == "the dp group of ranks 1, 3"
        assert mesh.where(7) == ""  # a rank no group lists


def test_no_mesh_without_a_group_that_is_a_mesh_slice():
    manifests = {0: Manifest(0, process_groups={"0": ProcessGroupInfo("0", (0, 1), 2, "gloo", "default_pg")})}
    assert MeshLayout.from_manifests(manifests) is None


def test_a_one_dimensional_mesh_places_no_rank():
    """FSDP2's mesh over the world (unnamed: dim0): a coordinate there is the rank number again."""
    one_dim = ProcessGroupInfo("0", (0, 1, 2, 3), 4, "gloo", "default_pg", mesh_dim="dim0")
    assert MeshLayout.from_manifests({0: Manifest(0, process_groups={"0": one_dim})}) is None


def _stats(pg: str, wait_s: float, count: int = 10) -> CollectiveStats:
    return CollectiveStats(
        op="all_reduce", pg=pg, size_bucket="1KiB-2KiB", size_bucket_min_bytes=1024, pg_size=2, count=count,
        rows=2 * count, bytes_total=1024 * count, bytes_median=1024, timed_count=count, duration_p50_us=1.0,
        duration_p99_us=1.0, transfer_p50_us=1.0, transfer_p99_us=1.0, algbw_gbps=1.0, busbw_gbps=1.0,
        wait_total_s=wait_s, wait_from="durations", total_time_s=0.01 * count,
    )  # fmt: skip


def test_a_slow_rank_stalls_the_group_that_waits_most_beyond_its_dimensions_others():
    mesh = MeshLayout.from_manifests(_manifests(True))
    # rank 3 slow: its tp peer waits 2 s for it, the dp groups both wait about as long (the delay spread to rank 2)
    comms = CommsReport(collectives=[_stats("4", 2.0), _stats("3", 0.1), _stats("2", 0.9), _stats("1", 0.8)])
    placement = place_rank(mesh, group_waits_s(comms), 3)
    assert placement.coords == {"dp": 1, "tp": 1}
    assert placement.stalls_dim == "tp" and placement.stalls_ranks == [2, 3]
    assert (placement.group_wait_s, placement.typical_wait_s) == (2.0, 0.1)
    assert "stalls its tp group (ranks 2, 3) most" in placement.text()
    # every group waits alike: the rank holds none up more than the others; only where it sits is said
    even = place_rank(mesh, group_waits_s(CommsReport(collectives=[_stats(pg, 1.0) for pg in GROUPS])), 3)
    assert even.stalls_dim is None and even.text() == "in the mesh at dp=1, tp=1"


def test_communication_per_dimension():
    mesh = MeshLayout.from_manifests(_manifests(False))
    comms = CommsReport(collectives=[_stats("4", 2.0, 5), _stats("3", 0.1, 5), _stats("1", 0.5, 20), _stats("0", 9.0)])
    report = analyze_mesh(mesh, comms)
    dims = {d.name: d for d in report.dims}
    assert report.shape == "dp=2 x tp=2"
    assert (dims["tp"].groups, dims["tp"].collectives, dims["tp"].wait_s) == (2, 10, 2.1)
    assert (dims["dp"].groups, dims["dp"].collectives, dims["dp"].bytes_total) == (1, 20, 20 * 1024)
    assert analyze_mesh(None, comms) is None  # the world group "0" is no dimension's


def test_a_three_dimensional_mesh_gives_each_rank_three_coordinates():
    """pp=2 x dp=2 x tp=2 over 8 ranks, the groups as init_device_mesh lays them out (mesh = arange(8) reshaped
    (2, 2, 2)): tp groups of consecutive ranks, dp groups 2 apart, pp groups 4 apart."""
    mesh_ranks = [[[4 * p + 2 * d + t for t in range(2)] for d in range(2)] for p in range(2)]
    described = []
    for p in range(2):
        for d in range(2):
            described.append((f"tp{p}{d}", "tp", mesh_ranks[p][d]))
        for t in range(2):
            described.append((f"dp{p}{t}", "dp", [mesh_ranks[p][d][t] for d in range(2)]))
    for d in range(2):
        for t in range(2):
            described.append((f"pp{d}{t}", "pp", [mesh_ranks[p][d][t] for p in range(2)]))
    mesh = MeshLayout.from_groups(described, dim_order=["pp", "dp", "tp"])
    assert mesh.shape_text() == "pp=2 x dp=2 x tp=2"
    assert mesh.where(5) == "pp=1, dp=0, tp=1" and mesh.where(6) == "pp=1, dp=1, tp=0"
    assert mesh.group_text("pp11") == "the pp group of ranks 3, 7"
