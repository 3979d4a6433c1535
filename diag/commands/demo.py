import click

from diag.commands.exit_codes import USAGE, require_extra


@click.command()
@click.argument("trace_dir", default="traces/demo", type=click.Path(file_okay=False))
@click.option("--ranks", default=2, show_default=True, help="Number of CPU ranks (gloo).")
@click.option("--steps", default=40, show_default=True)
@click.option("--slow-rank", default=-1, help="Plant a compute straggler at this rank.")
@click.option("--slow-data-rank", default=-1, help="Plant a slow data loader at this rank.")
def command(trace_dir, ranks, steps, slow_rank, slow_data_rank):
    """Run a small multi-rank CPU training job with capture on, then print what was recorded.

    \b
    Example:
      diag demo traces/demo --ranks 4 --slow-rank 2
    """
    import shutil
    from pathlib import Path

    from diag.launch import run_ranks
    from diag.trace.loader import load

    require_extra("capture", "diag demo (a training job with capture on)")
    if Path(trace_dir).exists():
        shutil.rmtree(trace_dir)
    argv = ["-m", "diag.demo", trace_dir, "--steps", str(steps), "--slow-rank", str(slow_rank)]
    argv += ["--slow-data-rank", str(slow_data_rank)]
    click.echo(f"running {ranks} ranks x {steps} steps (gloo, CPU) into {trace_dir} ...")
    results = run_ranks(argv, ranks, timeout_s=300)
    failed = [r for r in results if r.returncode != 0]
    for result in failed:
        click.echo(f"rank {result.rank} failed (exit {result.returncode}):\n{result.stderr[-2000:]}", err=True)
    trace = load(trace_dir)
    click.echo(recorded_summary(trace))
    if failed:
        raise SystemExit(USAGE)  # the job could not run: not a finding (docs/cli.md)
    click.echo(f"\nnext: diag analyze {trace_dir}")


def recorded_summary(trace) -> str:
    lines = [f"recorded {len(trace.ranks_found)} ranks of run {trace.run_id} in {trace.path}:"]
    for rank in trace.ranks_found:
        steps = trace.steps[trace.steps["rank"] == rank]
        colls = trace.collectives[trace.collectives["rank"] == rank]
        median_ms = steps["duration_us"].median() / 1000 if len(steps) else float("nan")
        lines.append(
            f"  rank {rank}: {len(steps)} steps (median {median_ms:.1f} ms), {len(colls)} collectives "
            f"({colls['bytes'].sum() / 2**20:.1f} MiB), {len(trace.memory[trace.memory['rank'] == rank])} memory rows"
        )
    for skipped in trace.skipped:
        lines.append(f"  skipped: {skipped}")
    return "\n".join(lines)
