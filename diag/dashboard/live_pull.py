"""The Triage page's pull from the job's PyTorch debug server (``diag dashboard RUN --debug-server URL``): every
rank's stacks and Flight Recorder dumps now, judged as ``diag triage --pull`` judges them, and a short
torch.profiler window on chosen ranks (diag/triage/debug_pull.py does the fetching).

The server's address is the dashboard's, given when it starts; a page only presses the buttons, never names an
address or a directory, and with a token (any non-loopback bind) only its holders can. What is pulled is saved
under a directory of the dashboard's own (``--debug-dir``, or a new temporary one), one ``pull-<n>`` directory
a pull, so ``diag triage`` can read it again later."""

from __future__ import annotations

import tempfile
import threading
from pathlib import Path

from dash import Input, Output, State, dcc, html

PULL_ID, PROFILE_ID, RANKS_ID, SECONDS_ID, RESULT_ID = (
    "live-pull",
    "live-profile",
    "live-profile-ranks",
    "live-profile-s",
    "live-pull-result",
)
MAX_PROFILED_RANKS = 8  # torch.profiler on each, at once: a look at a few ranks, not the job
PROFILE_S = (0.1, 30.0)  # a profiler window's shortest and longest

_url: str | None = None
_directory: Path | None = None
_busy = threading.Lock()  # one pull or profile at a time: each asks every rank's worker


def set_debug_server(url: str | None, directory: Path | None = None) -> None:
    """The debug server's frontend (checked by ``debug_pull.frontend_url``) and where pulls are saved."""
    global _url, _directory
    if url is None:
        _url = _directory = None
        return
    from diag.triage.debug_pull import frontend_url

    _url = frontend_url(url)
    _directory = Path(directory) if directory is not None else Path(tempfile.mkdtemp(prefix="diag-debug-pull-"))
    _directory.mkdir(parents=True, exist_ok=True)


def controls():
    if _url is None:
        return html.P(
            "A job running PyTorch's debug server (torch.distributed.debug.start_debug_server) can be asked for "
            "every rank's state now: start the dashboard with --debug-server http://HOST:PORT.",
            className="intro",
            id="live-pull-off",
        )
    return html.Div(
        [
            html.Div(
                [
                    html.Button("Pull every rank's state now", id=PULL_ID),
                    html.Span(f"from {_url}", className="intro"),
                    html.Span(" | profile ranks "),
                    dcc.Input(id=RANKS_ID, type="text", placeholder="e.g. 0, 7", style={"width": "120px"}),
                    html.Span(" for "),
                    dcc.Input(
                        id=SECONDS_ID,
                        type="number",
                        value=2,
                        min=PROFILE_S[0],
                        max=PROFILE_S[1],
                        style={"width": "60px"},
                    ),
                    html.Span(" s "),
                    html.Button("Profile", id=PROFILE_ID),
                ],
                style={"display": "flex", "gap": "8px", "alignItems": "center", "flexWrap": "wrap"},
            ),
            dcc.Loading(html.Div(id=RESULT_ID)),
            html.Hr(),
            html.H3("From the trace"),
        ]
    )


def register(app, live, page) -> None:
    if _url is None:
        return

    @app.callback(
        Output(RESULT_ID, "children"),
        Input(PULL_ID, "n_clicks"),
        Input(PROFILE_ID, "n_clicks"),
        State(RANKS_ID, "value"),
        State(SECONDS_ID, "value"),
        State("selected-rank", "data"),
        prevent_initial_call=True,
    )
    def act(_pulled, _profiled, ranks_text, seconds, rank):
        import dash

        if not _busy.acquire(blocking=False):
            return html.Div("A pull or a profile is still running: wait for it.", className="missing")
        try:
            if dash.ctx.triggered_id == PROFILE_ID:
                return _profile_result(ranks_text, seconds)
            return _pull_result(rank)
        finally:
            _busy.release()


def pull_and_judge() -> tuple[dict, list[str]]:
    """Every rank's state now, judged: (the verdict's JSON, what the pull said). Raises PullError."""
    from diag.triage.analysis import triage
    from diag.triage.debug_pull import pull
    from diag.triage.sources import read_input

    pulled = pull(_url, _next_pull_directory(_directory))
    return triage(read_input(pulled.directory)).to_json(), pulled.said()


def _next_pull_directory(directory: Path) -> Path:
    """``pull-<n>``, one more than the highest there (a --debug-dir kept from an earlier dashboard too)."""
    numbers = [int(p.name[5:]) for p in directory.glob("pull-*") if p.name[5:].isdigit()]
    return directory / f"pull-{max(numbers, default=0) + 1}"


def _pull_result(rank: int | None):
    from diag.dashboard.pages import triage_body
    from diag.trace.loader import TraceError
    from diag.triage.debug_pull import PullError

    try:
        verdict, said = pull_and_judge()
    except (PullError, TraceError, OSError) as exc:
        return html.Div(f"Could not pull: {exc}", className="missing", id="live-pull-error")
    heading = html.H3("Now, from the debug server")
    return html.Div([heading, html.P("; ".join(said)), triage_body(verdict, rank, "live")])


def _profile_result(ranks_text: str | None, seconds) -> html.Div:
    from diag.triage.debug_pull import PullError, profile

    ranks, problem = parse_ranks(ranks_text)
    if problem:
        return html.Div(problem, className="missing", id="live-profile-error")
    try:
        duration_s = min(max(float(seconds or 2), PROFILE_S[0]), PROFILE_S[1])
        results = profile(_url, ranks, duration_s, _directory / "profiles")
    except (PullError, OSError, ValueError) as exc:
        return html.Div(f"Could not profile: {exc}", className="missing", id="live-profile-error")
    rows = [html.Li(f"rank {r}: {result}") for r, result in results.items()]
    return html.Div(
        [html.H3(f"torch.profiler, {duration_s:g} s"), html.Ul(rows, id="live-profiles")]
        + [html.P("Open a trace in Perfetto (ui.perfetto.dev) or chrome://tracing.", className="intro")]
    )


def parse_ranks(text: str | None) -> tuple[list[int], str | None]:
    """'0, 7 12' -> [0, 7, 12]; (ranks, why not) when it is not a short list of ranks."""
    from diag.trace.schema import MAX_RANK

    words = (text or "").replace(",", " ").split()
    if not words:
        return [], "Give the ranks to profile, e.g. 0, 7."
    if not all(w.isdigit() for w in words):
        return [], f"Not a list of ranks: {text!r}."
    ranks = sorted({int(w) for w in words})
    if len(ranks) > MAX_PROFILED_RANKS or ranks[-1] > MAX_RANK:
        return [], f"At most {MAX_PROFILED_RANKS} ranks, each at most {MAX_RANK}."
    return ranks, None
