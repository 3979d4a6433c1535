"""``diag triage PATH``: explain a hang or an NCCL/gloo timeout. Never imports torch."""

from __future__ import annotations

import json
import sys

import click

from diag.commands._options import POLL_MAX_S, Seconds, poll_seconds, quiet_option
from diag.commands.exit_codes import OK, PROBLEM, USAGE, InputError
from diag.trace.loader import TraceError


@click.command("triage")
@click.argument("path", type=click.Path())  # --watch may start before the job writes it
@click.option("--format", "output_format", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--all-ranks", is_flag=True, help="List every rank in text output, not only the ones that matter.")
@click.option(
    "--watch",
    is_flag=True,
    help="Follow a running job: re-judge as heartbeats and dumps arrive, print the verdict as soon as there is "
    "one (exit 1), or when every rank ended (exit 0 if it went well).",
)
@click.option(
    "--stall-s",
    type=Seconds(0.5, POLL_MAX_S),
    default=20.0,
    show_default=True,
    help="With --watch: a collective pending this long in a rank's heartbeat, or a rank silent this long, is a "
    "stall to judge (the watchdog's own dump comes only after hang_threshold_s, 120 s by default).",
)
@click.option(
    "--interval",
    type=poll_seconds(),
    default=2.0,
    show_default=True,
    help="With --watch: seconds between reads.",
)
@quiet_option
def command(
    path: str, output_format: str, all_ranks: bool, watch: bool, stall_s: float, interval: float, quiet: bool
) -> None:
    """Explain why a distributed job hung or timed out.

    PATH is a diag trace directory (written by diag.init, with the hang watchdog on) or a directory of
    PyTorch Flight Recorder dumps (files <prefix><rank> from TORCH_FR_DUMP_TEMP_FILE or
    TORCH_NCCL_DEBUG_INFO_TEMP_FILE, pickle or JSON; pickles are read with a restricted unpickler).

    The verdict is one of missing_ranks, deadlock, desync, dead_rank, collective_hang, step_error, slow,
    capture_stopped, no_problem, with the culprit ranks, the collective (process group, sequence number, op,
    sizes) and the evidence.

    Exit status: 0 no hang (no_problem, slow), 1 a problem (missing_ranks, deadlock, desync, dead_rank,
    collective_hang, step_error, capture_stopped), 2 nothing to judge or a bad PATH.

    \b
    Examples:
      diag triage traces/run1
      diag triage /tmp/fr_dumps --format json
      diag triage --watch traces/run1  while the job runs: a verdict within about stall-s + 5 s of a hang
    """
    from diag.progress import set_quiet
    from diag.triage.analysis import NOTHING_TO_JUDGE, triage
    from diag.triage.report import format_text
    from diag.triage.sources import read_input
    from diag.triage.watch import PROBLEM_VERDICTS
    from diag.views.colour import colour_wanted, paint_verdict

    set_quiet(quiet)

    def show(verdict) -> None:
        if output_format == "json":
            json.dump(verdict.to_json(), sys.stdout, indent=1)
            sys.stdout.write("\n")
            return
        text = format_text(verdict, all_ranks=all_ranks)
        if colour_wanted():
            text = paint_verdict(text, problem=verdict.verdict in PROBLEM_VERDICTS)
        click.echo(text)

    if watch:
        from diag.triage.watch import watch as watch_job

        say = (lambda line: click.echo(line, err=True)) if output_format == "json" else click.echo
        try:
            code = watch_job(path, stall_s=stall_s, interval_s=interval, say=say, on_verdict=show)
        except KeyboardInterrupt:
            code = 130
        sys.exit(code)
    try:
        verdict = triage(read_input(path, progress=True))
    except TraceError as exc:
        raise InputError(str(exc)) from exc
    show(verdict)
    if verdict.evidence[:1] == [NOTHING_TO_JUDGE]:
        sys.exit(USAGE)
    sys.exit(PROBLEM if verdict.verdict in PROBLEM_VERDICTS else OK)
