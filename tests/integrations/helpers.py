"""Shared by the integration tests: running a framework job as real ranks, and checking its trace."""

import json
from pathlib import Path

from click.testing import CliRunner

from diag.cli import main
from diag.launch import run_ranks

HERE = Path(__file__).resolve().parent


def run_job(trace_dir: Path, script: str, world: int, *args) -> dict[int, dict]:
    """Run ``script`` as ``world`` ranks with torchrun's variables (TORCHELASTIC_RUN_ID included, so the
    framework sees a torchrun job); return each rank's truth file."""
    results = run_ranks(
        [str(HERE / script), str(trace_dir), *map(str, args)],
        world,
        env={"TORCHELASTIC_RUN_ID": "diag-test"},
        timeout_s=240,
    )
    for result in results:
        assert result.returncode == 0, result.stderr[-3000:]
    return {r: json.loads((trace_dir / "truth" / f"rank{r}.json").read_text()) for r in range(world)}


def analyze_json(trace_dir: Path) -> dict:
    result = CliRunner().invoke(
        main, ["analyze", str(trace_dir), "--format", "json", "--no-cache", "--fail-on", "never"]
    )
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def rank_steps(trace, rank: int):
    return trace.steps[trace.steps["rank"] == rank].sort_values("step")


def assert_phases_inside_steps(steps):
    assert (steps["forward_us"] > 0).all() and (steps["backward_us"] > 0).all() and (steps["optimizer_us"] > 0).all()
    inner = steps["forward_us"] + steps["backward_us"] + steps["optimizer_us"]
    assert (inner <= steps["duration_us"] + 5).all()  # rounding: 1 us each


def assert_same_collectives_on_every_rank(trace, world: int):
    """Every rank recorded the same collectives: the same number of each (op, bytes)."""
    colls = trace.collectives
    per_rank = [
        sorted(colls[colls["rank"] == r].groupby(["op", "bytes"], observed=True).size().items()) for r in range(world)
    ]
    assert all(p == per_rank[0] for p in per_rank)
