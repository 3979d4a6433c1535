import pytest
import torch

import diag
from diag._warn import DiagWarning
from diag.capture.identity import detect_identity


def test_flops_counted_once_with_flop_counter(tmp_path):
    batch, features_in, features_out = 32, 64, 16
    model = torch.nn.Linear(features_in, features_out, bias=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    diag.init(tmp_path, telemetry=False, count_flops=True)
    diag.instrument(model, optimizer)
    for _ in range(3):
        with diag.step():
            model(torch.randn(batch, features_in)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
    diag.finish()
    manifest = diag.load(tmp_path).manifest(0)
    # forward 2·B·I·O, backward only the weight gradient (the input needs none): 2·B·I·O
    assert manifest["flops_per_step"] == 4 * batch * features_in * features_out
    assert manifest["flops_source"] == "flop_counter"


def test_user_flops_are_not_recounted(tmp_path):
    diag.init(tmp_path, telemetry=False, count_flops=True, flops_per_step=123.0)
    for _ in range(3):
        with diag.step():
            torch.randn(8, 8) @ torch.randn(8, 8)
    diag.finish()
    manifest = diag.load(tmp_path).manifest(0)
    assert manifest["flops_per_step"] == 123.0 and manifest["flops_source"] == "user"


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


def test_no_gpu_means_telemetry_off_with_a_reason(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: telemetry is on")
    session = diag.init(tmp_path)
    diag.finish()
    status = diag.load(tmp_path).manifest(0)["capture"]
    assert status["telemetry"].startswith("off: no CUDA device") and status["device_time"].startswith("off")
    assert session.telemetry is None


def test_misspelt_option_is_an_error_but_a_failing_init_is_a_warning(tmp_path, monkeypatch):
    with pytest.raises(TypeError, match="flops_per_stpe"):
        diag.init(tmp_path, flops_per_stpe=1.0)

    def broken_identity():
        raise RuntimeError("launcher environment unreadable")

    monkeypatch.setattr("diag.capture.session.detect_identity", broken_identity)
    with pytest.warns(DiagWarning, match="launcher environment unreadable"):
        session = diag.init(tmp_path)
    assert not session.enabled
    with diag.step():  # the job runs on without capture
        pass
