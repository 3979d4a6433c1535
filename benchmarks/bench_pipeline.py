"""Capture overhead on a pipeline step: the same job with and without ``diag.instrument(schedule)``.

Two measurements:

* in-process: a one-stage ScheduleGPipe (one rank, gloo) with tiny compute and many micro-batches, so the
  per-action cost of the wrappers is not hidden by compute: median wall and training-thread CPU time of
  ``schedule.step()`` plain and instrumented, alternating blocks of steps;
* real job: ``tests/pipeline/pipeline_job.py`` (1F1B, gloo, separate processes, fixed-sleep stages) run with
  ``--capture off`` and ``--capture on`` alternately; the median step time over ranks and steps (first step
  left out) of each.

    python benchmarks/bench_pipeline.py                       # ~2 minutes on the 2-core box
    python benchmarks/bench_pipeline.py --ranks 4 --microbatches 16 --repeats 3

``--json PATH`` also saves the table (record.Table).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from record import Table, add_json_option  # noqa: E402


def in_process(microbatches: int, steps: int, blocks: int) -> dict:
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    import diag

    def make():
        stage = PipelineStage(torch.nn.Linear(16, 16), 0, 1, torch.device("cpu"))
        return ScheduleGPipe(stage, microbatches, loss_fn=lambda out, tgt: (out - tgt).square().mean())

    def time_steps(schedule) -> list[tuple[float, float]]:
        """Wall and this thread's CPU seconds of each step but the first."""
        x, target = torch.randn(2 * microbatches, 16), torch.randn(2 * microbatches, 16)
        out = []
        for _ in range(steps):
            start, start_cpu = time.perf_counter(), time.thread_time()
            with diag.step():
                schedule.step(x, target=target)
            out.append((time.perf_counter() - start, time.thread_time() - start_cpu))
        return out[1:]

    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
        plain_schedule = make()
        plain, captured = [], []
        diag.init(
            Path(tmp) / "trace",
            telemetry=False,
            watchdog=False,
            clock_sync=False,
            collectives=False,
            device=torch.device("cpu"),  # a CPU job even where a GPU exists: no CUDA events
        )
        instrumented = make()
        diag.instrument(instrumented)
        for _ in range(blocks):
            plain += time_steps(plain_schedule)  # diag.step() is a no-op cost on both: only the wrappers differ
            captured += time_steps(instrumented)
        diag.finish()
        rows = len(diag.load(Path(tmp) / "trace").microbatches)
        dist.destroy_process_group()
    plain_us, captured_us = (statistics.median(t[0] for t in times) * 1e6 for times in (plain, captured))
    plain_cpu_us, captured_cpu_us = (statistics.median(t[1] for t in times) * 1e6 for times in (plain, captured))
    actions = 2 * microbatches
    return {
        "microbatches": microbatches,
        "steps_timed": len(plain),
        "plain_step_us": round(plain_us, 1),
        "captured_step_us": round(captured_us, 1),
        "overhead_per_step_us": round(captured_us - plain_us, 1),
        "overhead_per_action_us": round((captured_us - plain_us) / actions, 2),
        "plain_step_cpu_us": round(plain_cpu_us, 1),
        "captured_step_cpu_us": round(captured_cpu_us, 1),
        "overhead_per_action_cpu_us": round((captured_cpu_us - plain_cpu_us) / actions, 2),
        "rows_written": rows,
    }


def real_job(ranks: int, microbatches: int, steps: int, repeats: int) -> dict:
    from diag.launch import run_ranks

    job = ROOT / "tests" / "pipeline" / "pipeline_job.py"
    medians: dict[str, list[float]] = {"off": [], "on": []}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(repeats):
            for capture in ("off", "on"):
                prefix = Path(tmp) / f"{capture}{repeat}"
                argv = [str(job), str(prefix) + ".trace", "1f1b", str(microbatches), str(steps)]
                argv += ["--forward-ms", "5", "--backward-ms", "10", "--capture", capture, "--step-times", str(prefix)]
                for result in run_ranks(argv, ranks, timeout_s=300):
                    if result.returncode != 0:
                        raise SystemExit(result.stderr[-3000:])
                times = []
                for rank in range(ranks):
                    times += json.loads(Path(f"{prefix}.rank{rank}.json").read_text())[1:]
                medians[capture].append(statistics.median(times))
    off_ms, on_ms = statistics.median(medians["off"]) * 1e3, statistics.median(medians["on"]) * 1e3
    return {
        "ranks": ranks,
        "microbatches": microbatches,
        "steps": steps,
        "repeats": repeats,
        "plain_step_ms": round(off_ms, 2),
        "captured_step_ms": round(on_ms, 2),
        "overhead_ms": round(on_ms - off_ms, 2),
        "overhead_pct": round(100 * (on_ms - off_ms) / off_ms, 2),
        "per_repeat_plain_ms": [round(m * 1e3, 2) for m in medians["off"]],
        "per_repeat_captured_ms": [round(m * 1e3, 2) for m in medians["on"]],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--inproc-microbatches", type=int, default=32)
    add_json_option(parser)
    args = parser.parse_args()
    table = Table("pipeline", ["measure", "plain step", "instrumented / captured", "overhead"])
    local = in_process(args.inproc_microbatches, 50, 5)
    name = f"in process: one-stage ScheduleGPipe, {local['microbatches']} micro-batches of a 16x16 Linear"
    table.add(
        f"{name}, wall",
        f"{local['plain_step_us'] / 1e3:.2f} ms",
        f"{local['captured_step_us'] / 1e3:.2f} ms",
        f"{local['overhead_per_action_us']:.1f} us per action",
    )
    table.add(
        f"{name}, training thread's CPU",
        f"{local['plain_step_cpu_us'] / 1e3:.2f} ms",
        f"{local['captured_step_cpu_us'] / 1e3:.2f} ms",
        f"{local['overhead_per_action_cpu_us']:.1f} us per action",
    )
    job = real_job(args.ranks, args.microbatches, args.steps, args.repeats)
    table.add(
        f"real job: 1F1B, {job['ranks']} ranks, {job['microbatches']} micro-batches, {job['steps']} steps",
        f"{job['plain_step_ms']:.2f} ms",
        f"{job['captured_step_ms']:.2f} ms",
        f"{job['overhead_ms']:+.2f} ms ({job['overhead_pct']:+.1f}%)",
    )
    table.note(
        f"in process: medians of {local['steps_timed']} steps each, plain and instrumented alternating in blocks "
        f"({local['rows_written']:,} micro-batch rows written)"
    )
    table.note(
        f"real job: medians over ranks and steps of each run, median of {job['repeats']} runs each, capture off "
        f"and on alternating; the runs: plain {', '.join(f'{m:.2f}' for m in job['per_repeat_plain_ms'])} ms, "
        f"captured {', '.join(f'{m:.2f}' for m in job['per_repeat_captured_ms'])} ms"
    )
    table.save(args.json)


if __name__ == "__main__":
    main()
