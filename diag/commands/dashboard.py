"""``diag dashboard``: follow a run (or look at a finished one) in the browser. Dash is imported only here,
inside the command, so ``diag --help`` and ``diag analyze`` never load it."""

from __future__ import annotations

import ipaddress
import secrets
import time
from pathlib import Path

import click

from diag.commands import sample_run
from diag.commands._options import POLL_MAX_S, Seconds, workers_option
from diag.commands.exit_codes import InputError, require_extra

REFRESH_MIN_S = 0.5  # a page's own reloads come this often at most: faster would only load the browser and server


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@click.command("dashboard")
@click.argument("trace_dir", required=False, type=click.Path(path_type=Path, file_okay=False))
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to bind. Anything but loopback exposes the traces: a token is then required.",
)
@click.option("--port", default=8050, show_default=True, type=click.IntRange(1, 65535))
@click.option(
    "--token",
    envvar="DIAG_DASHBOARD_TOKEN",
    help="Secret every request must carry (env DIAG_DASHBOARD_TOKEN). Generated when binding beyond loopback without one.",
)
@click.option(
    "--refresh-s",
    default=3.0,
    show_default=True,
    type=Seconds(REFRESH_MIN_S, POLL_MAX_S),
    help="How often pages re-read what the run appended.",
)
@click.option(
    "--baseline",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="A run to compare this one with on the Compare page (as diag compare BASELINE TRACE_DIR).",
)
@click.option(
    "--no-cache",
    is_flag=True,
    help="Above 64 ranks, neither read the report diag analyze cached in TRACE_DIR/.diag-cache for these files "
    "nor cache the one computed here.",
)
@click.option(
    "--baseline-root",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="Let the Compare page pick baselines anywhere under this directory (default: only beside TRACE_DIR).",
)
@click.option(
    "--debug-server",
    metavar="URL",
    help="The job's PyTorch debug server (torch.distributed.debug.start_debug_server; its frontend, e.g. "
    "http://node0:25999): the Triage page then pulls every rank's stacks on demand, and profiles chosen ranks.",
)
@click.option(
    "--debug-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="With --debug-server: where pulls and profiles are saved (default: a new temporary directory).",
)
@workers_option
@click.option("-v", "--verbose", is_flag=True, help="Log every request (method, path, status, time) on stderr.")
def command(
    trace_dir,
    host,
    port,
    token,
    refresh_s,
    baseline,
    no_cache,
    baseline_root,
    debug_server,
    debug_dir,
    workers,
    verbose,
):
    """Serve a live dashboard of TRACE_DIR: findings, stragglers, communication, memory, GPU telemetry,
    pipeline and triage pages, updated while the job writes.

    Above 64 ranks the collectives are reduced rank by rank; from 512 ranks the first read is done by
    worker processes forked before the server starts, and the later analyses run in this process beside
    the server's threads (a fork there could copy a lock one of them holds) unless --workers asks for
    worker processes.

    \b
    Examples:
      diag dashboard traces/run1                    then open http://127.0.0.1:8050
      diag dashboard traces/run1 --port 9000
      diag dashboard traces/run1 --host 0.0.0.0     (prints a URL with a token)
      diag dashboard traces/run2 --baseline traces/run1   (a Compare page against run1)
      diag dashboard traces/run1 --debug-server http://node0:25999   (pull every rank's state now)
      diag dashboard                                (the bundled sample run)
    """
    if trace_dir is None:
        trace_dir = sample_run("showing")
    if not trace_dir.is_dir():
        raise InputError(f"{trace_dir} is not a directory; give the trace directory diag.init wrote")
    if not is_loopback(host):
        if not token:
            token = secrets.token_urlsafe(18)
        click.echo(
            f"WARNING: binding {host}: anyone who can reach this port can read the traces; requests need the token.",
            err=True,
        )
    require_extra("dashboard", "diag dashboard")
    from diag.dashboard.app import create_app
    from diag.dashboard.data import LiveTrace

    if baseline_root is not None:
        from diag.dashboard.compare_page import set_pick_root

        set_pick_root(baseline_root)
    if debug_dir is not None and debug_server is None:
        raise click.UsageError("--debug-dir says where --debug-server's pulls go: add --debug-server")
    if debug_server is not None:
        from diag.dashboard.live_pull import set_debug_server
        from diag.triage.debug_pull import PullError

        try:
            set_debug_server(debug_server, debug_dir)
        except (PullError, OSError) as exc:
            raise InputError(f"--debug-server: {exc}") from exc
    if baseline is not None:
        from diag.commands.compare import load_summary
        from diag.dashboard.compare_page import set_baseline

        set_baseline(load_summary(baseline, baseline.resolve().name or str(baseline)), baseline)

    started = time.perf_counter()
    live = LiveTrace(trace_dir, poll_interval_s=refresh_s, cache=not no_cache, workers=workers)
    if _many_ranks(trace_dir):
        # the first load takes minutes at thousands of ranks (the report: the collectives reduced rank by rank):
        # serve at once; the poll thread loads, and publishes the ranks, then the report (pages say what is coming)
        click.echo(f"Loading {trace_dir} in the background: the pages fill in as it is read and analysed", err=True)
    else:
        live.refresh()
        snap = live.snapshot
        loaded = (
            f"{len(snap.trace.ranks_found)} ranks" if snap.trace is not None else f"nothing usable yet ({snap.error})"
        )
        click.echo(f"Loaded {trace_dir}: {loaded} in {time.perf_counter() - started:.1f} s", err=True)
    app = create_app(trace_dir, token=token, refresh_ms=int(refresh_s * 1000), live=live)
    if is_loopback(host):
        from diag.dashboard.app import require_local_host_header

        require_local_host_header(app.server, port)
    from diag.dashboard.server import create_server

    try:
        server = create_server(app, host, port, verbose)
    except OSError as exc:
        raise InputError(f"cannot serve on {host}:{port} ({exc}); choose another --port") from exc
    shown_host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    url = f"http://{shown_host}:{port}/" + (f"?token={token}" if token else "")
    click.echo(f"Serving on {url}  (Ctrl-C to stop)", err=True)  # the one line that shows the token
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
        live.stop()  # the poll thread ends its read here, not inside pyarrow while the interpreter exits


def _many_ranks(trace_dir: Path) -> bool:
    from diag.processes import PARTITIONED_MIN_RANKS
    from diag.trace.loader import find_rank_dirs

    return len(find_rank_dirs(trace_dir)) > PARTITIONED_MIN_RANKS
