"""Preemption-aware DDP training on gloo, diag adopted as the README says, then the user's own SIGTERM
handler installed AFTER diag.init (what Slurm / Kubernetes jobs do): it sets a flag, the loop saves a 4 s
checkpoint and exits 0. Prints "step N TIME" after each step (TIME: wall clock at the step's end).

usage: preempt_job.py TRACE_DIR CHECKPOINT_PATH [handler|none]   (none: no user handler, SIGTERM's default)
"""

import signal
import sys
import time

import torch
import torch.distributed as dist

import diag

trace_dir, checkpoint_path = sys.argv[1], sys.argv[2]
install_handler = len(sys.argv) < 4 or sys.argv[3] == "handler"
dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
diag.init(trace_dir, telemetry=False)
model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.01)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
diag.instrument(model, optimizer)

preempted = False


def on_sigterm(signum, frame):
    global preempted
    preempted = True


if install_handler:
    signal.signal(signal.SIGTERM, on_sigterm)


def every_rank_stops() -> bool:
    """Stop when any rank was signalled, all at the same step, as preemption-aware loops do (Lightning, torchtitan):
    the signal reaches the ranks a little apart, and a rank that stopped alone would leave the others inside
    DDP's all_reduce ("Connection closed by peer")."""
    flag = torch.tensor([1.0 if preempted else 0.0])
    dist.all_reduce(flag)
    return bool(flag.item())


step = 0
while not every_rank_stops():
    with diag.step():
        model(torch.randn(8, 64)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        time.sleep(0.02)
    print(f"step {step} {time.time()}", flush=True)
    step += 1
time.sleep(4)  # a realistic checkpoint save
torch.save(model.state_dict(), checkpoint_path)
print("checkpoint saved", flush=True)
sys.exit(0)
