"""A user's DDP communication hook registered after diag.instrument runs, in diag's hook mode (the default on
NCCL, forced here on gloo), with the same training result as without diag, and its collectives recorded
(issue 12 item 3). Real 2-rank gloo jobs."""

import pytest
import torch

import diag
from diag.launch import run_ranks
from tests.conftest import JOBS


def _train(trace_dir, hook: str, out_path):
    results = run_ranks([str(JOBS / "ddp_user_hook_job.py"), str(trace_dir), hook, str(out_path)], 2, timeout_s=180)
    for result in results:
        assert result.returncode == 0, result.stderr[-3000:]
        assert "second registration accepted" not in result.stdout
        assert "can only be called once" not in result.stderr
    return torch.load(out_path)


@pytest.mark.parametrize("hook, dtype", [("allreduce", "float32"), ("fp16", "float16"), ("builtin_fp16", "float16")])
def test_a_user_hook_after_instrument_trains_as_without_diag(tmp_path, hook, dtype):
    with_diag = _train(tmp_path / "trace", hook, tmp_path / "with.pt")
    without = _train("none", hook, tmp_path / "without.pt")
    for name, value in without.items():
        assert torch.equal(with_diag[name], value), name
    rows = diag.load(tmp_path / "trace").collectives
    buckets = rows[(rows["source"] == "ddp") & (rows["step"] >= 0)]
    assert sorted(buckets["step"].unique()) == [0, 1, 2, 3, 4]
    assert set(buckets["dtype"]) == {dtype}  # the user's hook's own collectives: fp16 is really sent as fp16
    assert set(buckets["rank"]) == {0, 1}
