"""A real training job for the capture tests. Each rank also writes what it really did, as seen by an
independent source (PyTorch's Flight Recorder and the model itself), to ``TRACE_DIR/truth/rankN.json``.

usage: capture_job.py TRACE_DIR MODE STEPS   (MODE: plain, ddp, ddp_hook, fsdp, explicit, accum)
  accum: DDP with gradient accumulation, ACCUM micro-batches an optimizer step, all but the last under
         ``no_sync``, in one ``diag.step()``
"""

import contextlib
import json
import os
import sys
import time

import torch
import torch.distributed as dist

import diag
from diag.capture.flight_recorder import own_dump

trace_dir, mode, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
distributed = mode != "plain"
if distributed:
    dist.init_process_group("gloo", timeout=__import__("datetime").timedelta(seconds=10))
rank = dist.get_rank() if distributed else 0
world = dist.get_world_size() if distributed else 1
torch.manual_seed(0)


class Wait(torch.nn.Module):
    """A forward that takes FORWARD_WAIT_S (a sleep: the same on a loaded machine)."""

    def forward(self, x):
        time.sleep(FORWARD_WAIT_S)
        return x


FORWARD_WAIT_S = 0.01
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))
if mode == "accum":  # each micro-batch's forward long enough to tell four from one
    model.append(Wait())
param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())

session = diag.init(
    trace_dir, telemetry=False, flops_per_step=1e9, ddp_buckets="hook" if mode == "ddp_hook" else "auto"
)
init_done_ns = time.time_ns()
ACCUM = 4
if mode in ("ddp", "ddp_hook", "accum"):
    model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.01)
elif mode == "fsdp":
    from torch.distributed.fsdp import fully_shard

    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
diag.instrument(model, optimizer)

if mode == "failing":  # rank 1 leaves; rank 0's next all_reduce fails: it must still be in rank 0's trace
    dist.all_reduce(torch.ones(4))
    if rank == 1:
        diag.finish()
        os._exit(0)
    time.sleep(1)
    try:
        dist.all_reduce(torch.ones(8))
    except RuntimeError as exc:
        print("all_reduce failed:", type(exc).__name__, flush=True)
    diag.finish()
    sys.exit(0)

explicit_ops = []
forward_s = []  # accum: each step's forwards, timed around the model's calls
if mode == "accum":
    for micro_batches in diag.wrap_loader([torch.randn(ACCUM, 16, 64) for _ in range(steps)]):
        with diag.step(samples=16 * ACCUM):
            forward_s.append(0.0)
            for index, batch in enumerate(micro_batches):
                last = index == ACCUM - 1
                with contextlib.nullcontext() if last else model.no_sync():
                    start = time.perf_counter()
                    loss = model(batch).square().mean() / ACCUM
                    forward_s[-1] += time.perf_counter() - start
                    loss.backward()
            optimizer.step()
            optimizer.zero_grad()
batches = [] if mode == "accum" else [torch.randn(16, 64) for _ in range(steps)]
for batch in diag.wrap_loader(batches):
    with diag.step(samples=16):
        with diag.phase("compute"):
            loss = model(batch).square().mean()
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if mode == "explicit":
            t = torch.full((250,), float(rank))
            dist.all_reduce(t)
            explicit_ops.append(("all_reduce", 1000, None))
            b = torch.zeros(10, dtype=torch.float64)
            dist.broadcast(b, src=0)
            explicit_ops.append(("broadcast", 80, None))
            out = torch.zeros(world * 4)
            dist.all_gather_into_tensor(out, torch.ones(4))
            explicit_ops.append(("all_gather", 16, None))
            rs_out = torch.zeros(2)
            dist.reduce_scatter_tensor(rs_out, torch.ones(2 * world))
            explicit_ops.append(("reduce_scatter", 8 * world, None))
            work = dist.all_reduce(torch.ones(5, dtype=torch.bfloat16), async_op=True)
            work.wait()
            explicit_ops.append(("all_reduce", 10, None))
            peer = rank ^ 1
            if rank % 2 == 0:
                dist.send(torch.ones(3), dst=peer)
                dist.recv(torch.zeros(3), src=peer)
                explicit_ops += [("send", 12, peer), ("recv", 12, peer)]
            else:
                dist.recv(torch.zeros(3), src=peer)
                dist.send(torch.ones(3), dst=peer)
                explicit_ops += [("recv", 12, peer), ("send", 12, peer)]
            works = [dist.isend(torch.ones(6), dst=peer), dist.irecv(torch.zeros(6), src=peer)]
            for work in works:
                work.wait()
            explicit_ops += [("send", 24, peer), ("recv", 24, peer)]
            dist.barrier()
            explicit_ops.append(("barrier", 0, None))

truth = {
    "rank": rank,
    "world": world,
    "steps": steps,
    "param_bytes": param_bytes,
    "init_done_ns": init_done_ns,
    "explicit_ops": explicit_ops,
    "forward_s": forward_s,
    "fr_entries": [],
}
if distributed:
    dump = own_dump()  # Flight Recorder of our own process: trusted
    truth["fr_entries"] = [
        {
            "pg": str(e["process_group"][0]),
            "seq": e["collective_seq_id"],
            "p2p_seq": e["p2p_seq_id"],
            "time_created_ns": e["time_created_ns"],
            "name": e["profiling_name"],
            "sizes": e["input_sizes"],
            "dtypes": e["input_dtypes"],
            "is_p2p": e["is_p2p"],
        }
        for e in dump["entries"]
    ]
diag.finish()
os.makedirs(os.path.join(trace_dir, "truth"), exist_ok=True)
with open(os.path.join(trace_dir, "truth", f"rank{rank}.json"), "w") as f:
    json.dump(truth, f)
if distributed:
    dist.destroy_process_group()
