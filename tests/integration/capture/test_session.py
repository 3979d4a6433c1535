import pytest

from diag.capture.identity import detect_identity


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}, (5, 1, 8, 4, "torchrun")),
        (
            {"SLURM_PROCID": "9", "SLURM_LOCALID": "1", "SLURM_NTASKS": "16", "SLURM_NTASKS_PER_NODE": "8(x2)"},
            (9, 1, 16, 8, "slurm"),
        ),
        (
            {
                "OMPI_COMM_WORLD_RANK": "3",
                "OMPI_COMM_WORLD_LOCAL_RANK": "3",
                "OMPI_COMM_WORLD_SIZE": "4",
                "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
            },
            (3, 3, 4, 4, "mpi"),
        ),
        ({}, (0, 0, 1, 1, "none")),
    ],
)
def test_rank_identity_from_launcher_environment(monkeypatch, env, expected):
    for name in (
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "SLURM_PROCID",
        "SLURM_NTASKS",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "PMI_RANK",
        "PMI_SIZE",
    ):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    identity = detect_identity()
    assert (
        identity.rank,
        identity.local_rank,
        identity.world_size,
        identity.local_world_size,
        identity.launcher,
    ) == expected
