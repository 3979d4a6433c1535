"""diag's DDP communication hook must average gradients exactly as DDP's built-in path does."""

import json

import torch
import torch.distributed as dist

import diag
from diag.capture.collectives import install_ddp_hook
from diag.launch import run_ranks
from tests.conftest import JOBS

STEPS = 3


def test_hook_averages_gradients_like_ddp_builtin_path(tmp_path):
    results = run_ranks([str(JOBS / "ddp_average_job.py"), str(tmp_path), str(STEPS)], 2, timeout_s=120)
    for result in results:
        assert result.returncode == 0, result.stderr[-3000:]
        report = json.loads(result.stdout.strip().splitlines()[-1])
        assert report["worst_relative_difference"] < 1e-6, report
    trace = diag.load(tmp_path)
    buckets = trace.collectives[trace.collectives["source"] == "ddp"]
    assert sorted(buckets["rank"].unique()) == [0, 1]
    assert buckets["step"].min() == 0 and buckets["step"].max() == STEPS - 1
    assert buckets["duration_us"].notna().all()


class _GroupRefusingAverage:
    """A real one-rank gloo group that answers ReduceOp.AVG the way backends without it do, before issuing
    anything. It reports a size of 2 so that the hook's own division shows in the result."""

    def __init__(self, group):
        self.group = group
        self.refused = 0

    def size(self):
        return 2

    def allreduce(self, tensors, options=None):
        if options is not None and options.reduceOp == dist.ReduceOp.AVG:
            self.refused += 1
            raise RuntimeError("Cannot use ReduceOp.AVG with this backend")
        return self.group.allreduce(tensors)


class _Bucket:
    def __init__(self, tensor):
        self._tensor = tensor

    def buffer(self):
        return self._tensor


class _DDPStandIn:
    """What install_ddp_hook uses of a DDP model: its process group and register_comm_hook."""

    def __init__(self, group):
        self.process_group = group
        self.hook = None

    def register_comm_hook(self, state, hook):
        self.hook = hook


def test_hook_divides_itself_where_the_backend_refuses_average(monkeypatch):
    from diag.launch import free_port

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        group = _GroupRefusingAverage(dist.group.WORLD)
        ddp = _DDPStandIn(group)
        assert install_ddp_hook(ddp, lambda: None)
        for _ in range(2):
            gradients = torch.full((6,), 3.0)
            averaged = ddp.hook(None, _Bucket(gradients)).wait()
            assert torch.equal(averaged, torch.full((6,), 1.5))  # divided by the reported size, summed over one rank
        assert group.refused == 1  # asked once, then the hook remembers and divides itself
    finally:
        dist.destroy_process_group()
