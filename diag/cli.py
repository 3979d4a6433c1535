"""The ``diag`` command. Subcommands live in ``diag/commands/`` and are imported only when used, so that
``diag --help`` stays fast and never imports torch, dash or pynvml."""

from __future__ import annotations

import importlib
import importlib.util

import click

# name -> module in diag.commands defining a click command called ``command``
SUBCOMMANDS = {
    "analyze": "analyze",
    "compare": "compare",
    "triage": "triage",
    "doctor": "doctor",
    "dashboard": "dashboard",
    "demo": "demo",
    "export": "export",
    "telemetry": "telemetry",
    "memory-plan": "memory_plan",
    "samples": "samples",
    "docs": "docs",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        available = []
        for name, module in SUBCOMMANDS.items():
            if importlib.util.find_spec(f"diag.commands.{module}") is not None:
                available.append(name)
        return sorted(available)

    def get_command(self, ctx, name):
        module = SUBCOMMANDS.get(name)
        if module is None or importlib.util.find_spec(f"diag.commands.{module}") is None:
            return None
        return importlib.import_module(f"diag.commands.{module}").command


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="diag")
def main():
    """Profile and diagnose distributed PyTorch training jobs.

    \b
    Examples:
      diag demo traces/demo            run a small 2-rank CPU job with capture on
      diag analyze traces/run1         find what slows the job down
      diag compare traces/a traces/b   what changed between two runs (and scaling efficiency)
      diag triage traces/run1          explain a hang or NCCL timeout
      diag doctor                      would a hang of a job launched from here be diagnosable
      diag dashboard traces/run1       follow a run in the browser
      diag export traces/run1 --perfetto run1.json   one timeline for ui.perfetto.dev
      diag analyze profiler_traces/    torch.profiler (Kineto) traces of every rank
      diag telemetry --prometheus-port 9401   Prometheus node agent (NVML, live traces)
      diag memory-plan --params 7e9 --dp 8 --zero 2 --gpu-gib 80   will a layout fit a GPU
      diag samples                     the sample runs installed with diag (copy one to try them)
      diag docs analyze                a page of the documentation

    Exit status: 0 no problem found, 1 a problem found (analyze: a finding at or above --fail-on; triage: a
    hang; compare: a regression), 2 a usage or input error. Shell completion: see diag docs cli.
    """


if __name__ == "__main__":
    main()
