"""``diag samples``: the sample runs installed with diag, listed and copied somewhere to try the commands on.
Never imports torch."""

from __future__ import annotations

import shutil
from pathlib import Path

import click

from diag.commands import samples_dir
from diag.commands.exit_codes import InputError

# what each sample shows, and the command that shows it
ABOUT = {
    "straggler": ("3 CPU ranks (gloo, DDP), rank 1 a compute straggler; diag analyze's default", "diag analyze"),
    "straggler-h100": ("the same job on one H100: CUDA timings, NVML telemetry, allocator statistics", "diag analyze"),
    "straggler-h200": ("the same job on one H200, columnar trace (schema 2), deep memory steps", "diag analyze"),
    "pipeline": ("4 pipeline stages (1F1B, 8 micro-batches), stage 2 twice as slow: the bubble", "diag analyze"),
    "hang": ("3 ranks, rank 1 never reaches an all_reduce: a hang with its dumps", "diag triage"),
}


def installed_samples() -> dict[str, Path]:
    root = samples_dir()
    if root is None:
        return {}
    return {p.name: p for p in sorted(root.iterdir()) if p.is_dir() and any(p.glob("rank*"))}


@click.group("samples", invoke_without_command=True)
@click.pass_context
def command(ctx):
    """List the sample runs installed with diag, or copy one to try the commands on.

    \b
    Examples:
      diag samples                       list them, with the command that shows each
      diag samples copy hang runs/hang   then: diag triage runs/hang
    """
    if ctx.invoked_subcommand is not None:
        return
    samples = installed_samples()
    if not samples:
        raise InputError("no sample runs are installed with this diag (reinstall it: pip install diag)")
    width = max(map(len, samples))
    for name, path in samples.items():
        about, how = ABOUT.get(name, ("", "diag analyze"))
        click.echo(f"{name:<{width}}  {about}" + (f"  ({how} {path})" if about else f"  ({path})"))


@command.command("copy")
@click.argument("name")
@click.argument("dest", type=click.Path(path_type=Path))
def copy(name: str, dest: Path):
    """Copy the sample run NAME to DEST (a new directory), where the commands may write their caches."""
    samples = installed_samples()
    if name not in samples:
        raise InputError(f"no sample run {name!r}: the samples are {', '.join(samples) or 'not installed'}")
    if dest.exists():
        raise InputError(f"{dest} exists already: give a new directory")
    try:
        shutil.copytree(samples[name], dest)
    except OSError as exc:
        raise InputError(f"cannot copy {name} to {dest}: {exc}") from exc
    how = ABOUT.get(name, ("", "diag analyze"))[1]
    click.echo(f"copied {name} to {dest}; try: {how} {dest}", err=True)
