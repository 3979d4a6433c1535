"""A real pipeline-parallel job on CPU/gloo with deterministic stage compute, for the pipeline tests, the
sample trace and the benchmark.

Each stage is a fixed sleep in forward and a fixed sleep in backward (a custom autograd Function), plus a tiny
Linear so the stage has weights: the time a stage computes does not depend on how busy the 2-core box is,
so the bubble is set by the schedule alone.

usage: pipeline_job.py TRACE_DIR SCHEDULE MICROBATCHES STEPS [options]
  SCHEDULE: gpipe, 1f1b, interleaved (2 chunks per rank), zbv (2 chunks per rank, split backward),
            manual (a hand-written GPipe over send/recv, marked with diag.pipeline_action)
  --forward-ms F --backward-ms B   per micro-batch on each rank (split over its chunks); default 20 / 40
  --slow-stage S --slow-factor K   rank S computes K times longer
  --capture off                    run the same job without diag (for the overhead benchmark)
  --step-times FILE                write this rank's wall time per schedule step (JSON list, seconds)

With capture on, each rank also writes torch's own plan for it (the schedule's ``pipeline_order``: compute
actions in order) to ``TRACE_DIR/truth/rankN.json``, an independent source the tests compare the rows with.
"""

import argparse
import json
import os
import time

import torch
import torch.distributed as dist

import diag

WIDTH = 16
ROWS_PER_MICROBATCH = 2


class SleepFn(torch.autograd.Function):
    """Identity whose forward and backward each take a fixed wall time."""

    @staticmethod
    def forward(ctx, x, forward_s, backward_s):
        ctx.backward_s = backward_s
        time.sleep(forward_s)
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        time.sleep(ctx.backward_s)
        return grad, None, None


class SleepStage(torch.nn.Module):
    def __init__(self, forward_s: float, backward_s: float):
        super().__init__()
        self.linear = torch.nn.Linear(WIDTH, WIDTH)
        self.forward_s, self.backward_s = forward_s, backward_s

    def forward(self, x):
        return SleepFn.apply(self.linear(x), self.forward_s, self.backward_s)


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("trace_dir")
    p.add_argument("schedule")
    p.add_argument("microbatches", type=int)
    p.add_argument("steps", type=int)
    p.add_argument("--forward-ms", type=float, default=20.0)
    p.add_argument("--backward-ms", type=float, default=40.0)
    p.add_argument("--slow-stage", type=int, default=-1)
    p.add_argument("--slow-factor", type=float, default=2.0)
    p.add_argument("--capture", default="on")
    p.add_argument("--step-times", default=None)
    return p.parse_args()


def loss_fn(output, target):
    return (output - target).square().mean()


def build_schedule(args, rank: int, world: int):
    from torch.distributed.pipelining import (
        PipelineStage,
        Schedule1F1B,
        ScheduleGPipe,
        ScheduleInterleaved1F1B,
        ScheduleZBVZeroBubble,
    )

    chunks = 2 if args.schedule in ("interleaved", "zbv") else 1
    factor = args.slow_factor if rank == args.slow_stage else 1.0
    forward_s = args.forward_ms * factor / 1000 / chunks
    backward_s = args.backward_ms * factor / 1000 / chunks
    num_stages = world * chunks
    # V shape for ZBV: rank 0 holds the first and the last stage; interleaved: rank, rank + p, ...
    v_shape = args.schedule == "zbv"
    indices = [rank, num_stages - 1 - rank] if v_shape else [rank + k * world for k in range(chunks)]
    stages = [PipelineStage(SleepStage(forward_s, backward_s), i, num_stages, torch.device("cpu")) for i in indices]
    kinds = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}
    if args.schedule in kinds:
        return kinds[args.schedule](stages[0], args.microbatches, loss_fn=loss_fn)
    multi = {"interleaved": ScheduleInterleaved1F1B, "zbv": ScheduleZBVZeroBubble}[args.schedule]
    return multi(stages, args.microbatches, loss_fn=loss_fn)


PLAN_ACTIONS = {"F": "forward", "B": "backward", "I": "backward_input", "W": "backward_weight"}


def write_plan(trace_dir: str, rank: int, schedule) -> None:
    """torch's plan for this rank: (action, microbatch, stage_index) of each compute action, in order."""
    plan = [
        (PLAN_ACTIONS[a.computation_type.value], a.microbatch_index, a.stage_index)
        for a in schedule.pipeline_order[rank]
        if a is not None and a.computation_type.value in PLAN_ACTIONS
    ]
    os.makedirs(os.path.join(trace_dir, "truth"), exist_ok=True)
    with open(os.path.join(trace_dir, "truth", f"rank{rank}.json"), "w") as f:
        json.dump(plan, f)


def run_schedule(args, rank: int, world: int, capture: bool) -> list[float]:
    torch.manual_seed(0)
    schedule = build_schedule(args, rank, world)
    if capture:
        diag.instrument(schedule)
        write_plan(args.trace_dir, rank, schedule)
    batch = torch.randn(args.microbatches * ROWS_PER_MICROBATCH, WIDTH)
    target = torch.randn(args.microbatches * ROWS_PER_MICROBATCH, WIDTH)
    first_rank, last_rank = (0, 0) if args.schedule == "zbv" else (0, world - 1)
    times = []
    for _ in range(args.steps):
        dist.barrier()  # every step starts together: step times compare across ranks and runs
        start = time.perf_counter()
        with diag.step():
            inputs = (batch,) if rank == first_rank else ()
            schedule.step(*inputs, target=target if rank == last_rank else None)
        times.append(time.perf_counter() - start)
    return times


def run_manual(args, rank: int, world: int) -> list[float]:
    """GPipe by hand: forward of every micro-batch, then backward in the same order, over send/recv."""
    factor = args.slow_factor if rank == args.slow_stage else 1.0
    forward_s, backward_s = args.forward_ms * factor / 1000, args.backward_ms * factor / 1000
    m = args.microbatches
    diag.pipeline_layout(schedule="manual-gpipe", stages=world, microbatches=m)
    buffer = torch.zeros(ROWS_PER_MICROBATCH, WIDTH)
    times = []
    for _ in range(args.steps):
        dist.barrier()
        start = time.perf_counter()
        with diag.step():
            for mb in range(m):
                if rank > 0:
                    with diag.pipeline_action("recv_wait", mb):
                        dist.recv(buffer, src=rank - 1)
                with diag.pipeline_action("forward", mb):
                    time.sleep(forward_s)
                if rank < world - 1:
                    dist.send(buffer, dst=rank + 1)
            for mb in range(m):
                if rank < world - 1:
                    with diag.pipeline_action("recv_wait", mb):
                        dist.recv(buffer, src=rank + 1)
                with diag.pipeline_action("backward", mb):
                    time.sleep(backward_s)
                if rank > 0:
                    dist.send(buffer, dst=rank - 1)
        times.append(time.perf_counter() - start)
    return times


def main():
    args = parse()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    capture = args.capture == "on"
    if capture:
        diag.init(args.trace_dir, telemetry=False, watchdog=False, device=torch.device("cpu"))
    manual = args.schedule == "manual"
    times = run_manual(args, rank, world) if manual else run_schedule(args, rank, world, capture)
    if capture:
        diag.finish()
    if args.step_times:
        with open(f"{args.step_times}.rank{rank}.json", "w") as f:
            json.dump(times, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
