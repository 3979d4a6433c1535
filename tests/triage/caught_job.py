"""One rank of a small data-parallel gloo job whose slow rank computes past the collective timeout in one step,
wrapped in the error handling users write around their loops, for ``test_caught_errors.py``.

Run one process per rank (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set) as
``python caught_job.py SHAPE TRACE_DIR``, with CAUGHT_BAD_RANK, CAUGHT_PG_TIMEOUT_S (and optionally
CAUGHT_LATE_MARGIN_S, CAUGHT_HANG_THRESHOLD_S) in the environment.
In step BAD_STEP the bad rank computes (a busy loop: real CPU work) for the timeout and LATE_MARGIN_S more; the
others time out in the gradient all_reduce, and the bad rank then fails on the closed connection. Shapes:
  propagate  the exception leaves the script (the baseline: what the fault suite runs)
  caught     ``try: loop except Exception as e: print(e)`` then ``diag.finish()``; exits 0
  finally    ``try: loop finally: diag.finish()``; the exception still leaves the script
  exit       ``except Exception: diag.finish(); sys.exit(1)``
  continue   each step in its own ``try``: the error is logged and the loop goes on with the next step
  stopped    as ``caught``, but the bad rank does not compute: it writes ``ready`` and the driver SIGSTOPs it
             inside the step, then SIGCONTs it after the others' timeout
  trainer    ``diag.Trainer(...).fit`` inside ``try/except`` (the Trainer finishes the session it opened)
  killed     as ``propagate``, but the bad rank writes ``ready`` inside its compute, where the driver SIGKILLs it
             and then stops the others with SIGTERM, as torchrun does when a worker dies
  hung       as ``killed``, but the driver waits until the others' watchdogs saw the stall, then stops every
             rank with SIGTERM before any timeout (a launcher or an operator giving up on a hung job)
Under torchrun, an attempt after a restart (TORCHELASTIC_RESTART_COUNT > 0) has no slow rank and finishes.
"""

from __future__ import annotations

import datetime
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import diag

STEPS = 8
BAD_STEP = 5
# a restarted attempt (torchrun --max-restarts) runs healthy: the slow rank's fault was a one-off
RESTARTED = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") not in ("", "0")
BAD_RANK = -1 if RESTARTED else int(os.environ.get("CAUGHT_BAD_RANK", "1"))
PG_TIMEOUT_S = float(os.environ.get("CAUGHT_PG_TIMEOUT_S", "5"))
LATE_MARGIN_S = float(os.environ.get("CAUGHT_LATE_MARGIN_S", "4"))  # the bad rank arrives this long after the timeout
# diag's stall threshold; "default": diag.init's own (the reproduction)
SETUP_TIMEOUT_S = 300  # the default group's: rendezvous and the start barrier wait for ranks a loaded box starts late
HANG_THRESHOLD = os.environ.get("CAUGHT_HANG_THRESHOLD_S", "2")
SESSION_OPTIONS = {"telemetry": False, "heartbeat_interval_s": 0.5}
if HANG_THRESHOLD != "default":
    SESSION_OPTIONS["hang_threshold_s"] = float(HANG_THRESHOLD)


def busy_compute(seconds: float) -> None:
    """Real CPU work (matmuls), not a sleep: a busy neighbour slows it down as it would a real forward."""
    end = time.monotonic() + seconds
    a = torch.randn(128, 128)
    while time.monotonic() < end:
        a = torch.tanh(a @ a)


def mark(trace_dir: Path, name: str) -> None:
    tmp = trace_dir / f".{name}.tmp"
    tmp.write_text(str(os.getpid()))
    tmp.replace(trace_dir / name)


def train_step(model, optimizer, batch, rank: int, step: int, shape: str, trace_dir: Path, group) -> None:
    with diag.phase("forward"):
        if rank == BAD_RANK and step == BAD_STEP:
            if shape == "stopped":
                mark(trace_dir, "ready")  # the driver SIGSTOPs this process here
                busy_compute(1.0)
            elif shape in ("killed", "hung"):
                mark(trace_dir, "ready")  # the driver ends this process in here
                busy_compute(PG_TIMEOUT_S + LATE_MARGIN_S)
            else:
                busy_compute(PG_TIMEOUT_S + LATE_MARGIN_S)
        loss = model(batch).pow(2).mean()
    loss.backward()
    with diag.phase("grad_sync"):
        for param in model.parameters():
            dist.all_reduce(param.grad, group=group)
            param.grad /= dist.get_world_size()
    optimizer.step()
    optimizer.zero_grad()


def loop(model, optimizer, rank: int, shape: str, trace_dir: Path, group) -> None:
    for step in range(STEPS):
        batch = torch.randn(16, 64)
        if shape == "continue":
            try:
                with diag.step():
                    train_step(model, optimizer, batch, rank, step, shape, trace_dir, group)
            except Exception as exc:  # noqa: BLE001 - the user's loop: log and go on
                print(f"rank {rank} step {step} failed, skipping it: {exc}", flush=True)
            continue
        with diag.step():
            train_step(model, optimizer, batch, rank, step, shape, trace_dir, group)


def run_trainer(rank: int, trace_dir: Path, group) -> None:
    """diag.Trainer's loop; the bad rank's loss computes past the timeout in step BAD_STEP."""
    model = torch.nn.Sequential(torch.nn.Linear(64, 64))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    calls = {"n": 0}

    def loss_fn(outputs, batch):
        if rank == BAD_RANK and calls["n"] == BAD_STEP:
            busy_compute(PG_TIMEOUT_S + LATE_MARGIN_S)
        calls["n"] += 1
        loss = outputs.pow(2).mean()
        return loss

    class Synced(torch.nn.Module):
        """Gradients all-reduced after backward through a hook, as a data-parallel wrapper does."""

        def __init__(self, inner):
            super().__init__()
            self.inner = inner
            for param in inner.parameters():
                param.register_post_accumulate_grad_hook(lambda p: dist.all_reduce(p.grad, group=group))

        def forward(self, x):
            return self.inner(x)

    trainer = diag.Trainer(
        Synced(model),
        optimizer,
        loss_fn,
        str(trace_dir),
        session_options=SESSION_OPTIONS,
    )
    try:
        trainer.fit([torch.randn(16, 64) for _ in range(STEPS)])
    except Exception as exc:  # noqa: BLE001 - the user's handler
        print(f"rank {rank}: training failed: {exc}", flush=True)


def main() -> None:
    shape, trace_dir = sys.argv[1], Path(sys.argv[2])
    torch.manual_seed(0)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=SETUP_TIMEOUT_S))
    # the training collectives' group, with the short timeout: only the planted delay may exceed it
    group = dist.new_group(timeout=datetime.timedelta(seconds=PG_TIMEOUT_S))
    rank = dist.get_rank()
    if shape == "trainer":
        dist.barrier()
        run_trainer(rank, trace_dir, group)
        return
    diag.init(trace_dir, **SESSION_OPTIONS)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    diag.instrument(model, optimizer)
    dist.barrier()  # every rank set up before the first step, however late a loaded box started it
    if shape in ("propagate", "continue", "killed", "hung"):
        loop(model, optimizer, rank, shape, trace_dir, group)
        diag.finish()
    elif shape == "finally":
        try:
            loop(model, optimizer, rank, shape, trace_dir, group)
        finally:
            diag.finish()
    elif shape == "exit":
        try:
            loop(model, optimizer, rank, shape, trace_dir, group)
        except Exception as exc:  # noqa: BLE001 - the user's handler
            print(f"rank {rank}: {exc}", flush=True)
            diag.finish()
            sys.exit(1)
        diag.finish()
    else:  # caught, stopped
        try:
            loop(model, optimizer, rank, shape, trace_dir, group)
        except Exception as exc:  # noqa: BLE001 - the user's handler
            print(f"rank {rank}: {exc}", flush=True)
        diag.finish()
    print(f"rank {rank} done", flush=True)


if __name__ == "__main__":
    main()
