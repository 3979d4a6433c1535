"""Capture overhead on a pipeline step: the same job with and without ``diag.instrument(schedule)``.

Two measurements:

* in-process: a one-stage ScheduleGPipe (one rank, gloo) with tiny compute and many micro-batches, so the
  per-action cost of the wrappers is not hidden by compute: median time of ``schedule.step()`` plain and
  instrumented, alternating blocks of steps;
* real job: ``tests/pipeline/pipeline_job.py`` (1F1B, gloo, separate processes, fixed-sleep stages) run with
  ``--capture off`` and ``--capture on`` alternately; the median step time over ranks and steps (first step
  left out) of each.

    python benchmarks/bench_pipeline.py                       # ~2 minutes on the 2-core box
    python benchmarks/bench_pipeline.py --ranks 4 --microbatches 16 --repeats 3
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


def in_process(microbatches: int, steps: int, blocks: int) -> dict:
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    import diag

    def make():
        stage = PipelineStage(torch.nn.Linear(16, 16), 0, 1, torch.device("cpu"))
        return ScheduleGPipe(stage, microbatches, loss_fn=lambda out, tgt: (out - tgt).square().mean())

    def time_steps(schedule) -> list[float]:
        x, target = torch.randn(2 * microbatches, 16), torch.randn(2 * microbatches, 16)
        out = []
        for _ in range(steps):
            start = time.perf_counter()
            with diag.step():
                schedule.step(x, target=target)
            out.append(time.perf_counter() - start)
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
    plain_us, captured_us = statistics.median(plain) * 1e6, statistics.median(captured) * 1e6
    actions = 2 * microbatches
    return {
        "microbatches": microbatches,
        "steps_timed": len(plain),
        "plain_step_us": round(plain_us, 1),
        "captured_step_us": round(captured_us, 1),
        "overhead_per_step_us": round(captured_us - plain_us, 1),
        "overhead_per_action_us": round((captured_us - plain_us) / actions, 2),
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
    args = parser.parse_args()
    print(json.dumps({"in_process": in_process(args.inproc_microbatches, 50, 5)}, indent=1), flush=True)
    print(json.dumps({"real_job": real_job(args.ranks, args.microbatches, args.steps, args.repeats)}, indent=1))


if __name__ == "__main__":
    main()
