"""``diag triage PATH``: explain a hang or an NCCL/gloo timeout. Never imports torch."""

from __future__ import annotations

import json
import sys

import click

from diag.commands._options import POLL_MAX_S, Seconds, poll_seconds, quiet_option, workers_option
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
@click.option(
    "--prometheus-port",
    type=click.IntRange(1, 65535),
    help="With --watch: serve the verdict as diag_triage_verdict on http://BIND:PORT/metrics (its labels: the "
    "verdict, the culprit ranks and what to do next), and keep serving it after the verdict until stopped, for "
    "the DiagTriageProblem alert (dashboards/alerts.yml).",
)
@click.option(
    "--bind",
    default="127.0.0.1",
    show_default=True,
    help="With --prometheus-port: the address to bind. 0.0.0.0 lets a Prometheus on another machine scrape it, "
    "and anyone who can reach the port read the verdict (there is no authentication).",
)
@click.option(
    "--pull",
    "pull_url",
    metavar="URL",
    help="Ask the running job's PyTorch debug server (torch.distributed.debug.start_debug_server; its frontend, "
    "e.g. http://node0:25999) for every rank's stacks and Flight Recorder dumps now, save them into PATH, and "
    "judge them.",
)
@workers_option
@quiet_option
def command(
    path: str,
    output_format: str,
    all_ranks: bool,
    watch: bool,
    stall_s: float,
    interval: float,
    prometheus_port: int | None,
    bind: str,
    pull_url: str | None,
    workers: int | None,
    quiet: bool,
) -> None:
    """Explain why a distributed job hung or timed out.

    PATH is a diag trace directory (written by diag.init, with the hang watchdog on) or a directory of
    PyTorch Flight Recorder dumps (files <prefix><rank> from TORCH_FR_DUMP_TEMP_FILE or
    TORCH_NCCL_DEBUG_INFO_TEMP_FILE, pickle or JSON; pickles are read with a restricted unpickler).

    The verdict is one of missing_ranks, deadlock, desync, dead_rank, collective_hang, step_error, slow,
    capture_stopped, incomplete, no_problem, with the culprit ranks, the collective (process group, sequence number, op,
    sizes) and the evidence.

    Exit status: 0 no hang (no_problem, slow), 1 a problem (missing_ranks, deadlock, desync, dead_rank,
    collective_hang, step_error, capture_stopped), 2 nothing to judge, a bad PATH, or ranks that could not be
    read while the others show no problem (incomplete).

    \b
    Examples:
      diag triage traces/run1
      diag triage /tmp/fr_dumps --format json
      diag triage --pull http://node0:25999 /tmp/now  (a job running PyTorch's debug server: its state now)
      diag triage --watch traces/run1  while the job runs: a verdict within about stall-s + 5 s of a hang
      diag triage traces/run16k --workers 1   (a busy machine: read every rank in this process)
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

    if prometheus_port is not None and not watch:
        raise click.UsageError("--prometheus-port serves the verdict of --watch: add --watch")
    if pull_url is not None:
        if watch:
            raise click.UsageError("--pull judges the job's state once, now: leave out --watch")
        _pull(pull_url, path)
    if watch:
        say = (lambda line: click.echo(line, err=True)) if output_format == "json" else click.echo
        sys.exit(_watch(path, stall_s, interval, say, show, prometheus_port, bind, workers))
    try:
        verdict = triage(read_input(path, progress=True, workers=workers))
    except TraceError as exc:
        raise InputError(str(exc)) from exc
    show(verdict)
    if verdict.evidence[:1] == [NOTHING_TO_JUDGE] or verdict.verdict == "incomplete":
        sys.exit(USAGE)
    sys.exit(PROBLEM if verdict.verdict in PROBLEM_VERDICTS else OK)


def _pull(url: str, path: str) -> None:
    """Every rank's state from the debug server, into ``path``; what was fetched said on stderr."""
    from diag.triage.debug_pull import PullError, pull

    try:
        pulled = pull(url, path)
    except (PullError, OSError) as exc:
        raise InputError(f"cannot pull from the debug server: {exc}") from exc
    for line in pulled.said():
        click.echo(line, err=True)


def _watch(path, stall_s, interval, say, show, prometheus_port, bind, workers) -> int:
    """--watch; with a port, the verdict is also served to Prometheus, until SIGTERM or Ctrl-C."""
    import time
    from pathlib import Path

    from diag.triage.watch import watch as watch_job

    if prometheus_port is None:
        try:
            return watch_job(path, stall_s=stall_s, interval_s=interval, say=say, on_verdict=show, workers=workers)
        except KeyboardInterrupt:
            return 130
    import signal

    from diag.metrics.prometheus import stop_serving
    from diag.metrics.verdict import VerdictMetrics, run_id_of, serve_verdict

    served = VerdictMetrics()
    try:
        server = serve_verdict(served, prometheus_port, bind)
    except OSError as exc:
        raise InputError(f"cannot serve on {bind}:{prometheus_port} ({exc}); choose another --prometheus-port") from exc
    say(f"Serving the verdict on http://{bind}:{prometheus_port}/metrics")

    def on_verdict(verdict) -> None:
        show(verdict)
        served.update(run_id_of(Path(path)), verdict.to_json(), time.time())

    def interrupt(*_) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)  # a launcher's stop ends the serving as Ctrl-C does
    code = 130
    try:
        code = watch_job(path, stall_s=stall_s, interval_s=interval, say=say, on_verdict=on_verdict, workers=workers)
        say("Verdict served until stopped (SIGTERM or Ctrl-C)")
        while True:
            time.sleep(1.0)
    except KeyboardInterrupt:
        return code  # the verdict's exit status once there was one
    finally:
        stop_serving(server)
