"""The dashboard's Compare page: the run being followed against a baseline run, given when the dashboard starts
(``diag dashboard RUN --baseline BASE``) or picked on the page: a list of the diag trace directories beside the
run, or a path typed in (relative to the run's parent directory). A path from the page must be a diag trace
directory (a ``rankN/manifest.json`` inside); anything else gets a message saying why, never a traceback. The
URL still never names a directory, and with a token (any non-loopback bind) only its holders can pick one. The
baseline is the dashboard's, not a viewer's: every open page compares with the last one picked.

The baseline is summarised once (``diag.analysis.compare``, through the caches ``diag compare`` uses); the live
run's summary comes from each snapshot's own trace and report, so the comparison follows the run as it grows.
Figures and text come from ``diag.views.compare``; nothing is computed here."""

from __future__ import annotations

import itertools
from pathlib import Path

import dash
from dash import Input, Output, State, dcc, html

from diag.dashboard import figures as f
from diag.dashboard.data import PRELIMINARY

GRAPHS = ("components", "steps")
TEXTS = ("body",)
INTRO = (
    "This run against a baseline run: the verdict, where the time went, and the per-step times. Pick the baseline "
    "below (a run beside this one, or a path), or give it with --baseline."
)
PICK_ID, PATH_ID, USE_ID, MESSAGE_ID = "compare-pick", "compare-path", "compare-use", "compare-pick-message"
MAX_SIBLINGS_SCANNED = 500  # directories beside the run looked at for the list (a parent of thousands: the first)

_baseline = None  # RunSummary
_baseline_path: Path | None = None
_version = itertools.count(1)
_baseline_version = 0  # changes with every baseline set: the page's content and memo key


def set_baseline(summary, path: Path | None = None) -> None:
    """The baseline's ``RunSummary`` (``diag.analysis.runs.load_summary``), or None for no baseline."""
    global _baseline, _baseline_path, _baseline_version
    _baseline = summary
    _baseline_path = Path(path).resolve() if path is not None else None
    _baseline_version = next(_version)


def baseline():
    return _baseline


def state_key() -> int:
    """Changes when the baseline does, so that an open page is drawn again."""
    return _baseline_version


# -- picking a baseline ----------------------------------------------------------------------------------------
def is_trace_dir(path: Path) -> bool:
    """A diag trace directory: at least one ``rankN`` directory with a manifest.json."""
    from diag.trace.loader import find_rank_dirs
    from diag.trace.schema import MANIFEST_FILE

    try:
        return any((d / MANIFEST_FILE).is_file() for d in find_rank_dirs(path).values())
    except (OSError, RuntimeError):  # RuntimeError: a symlink loop (pathlib's resolve)
        return False


def sibling_runs(run_dir: Path) -> list[Path]:
    """The diag trace directories beside ``run_dir`` (same parent), by name, ``run_dir`` left out; one that
    cannot be looked at (unreadable, a symlink loop) is left out too."""
    run_dir = Path(run_dir).resolve()
    try:
        children = sorted(itertools.islice(run_dir.parent.iterdir(), MAX_SIBLINGS_SCANNED))
    except OSError:
        return []
    return [c for c in children if _other_run(c, run_dir)]


def _other_run(child: Path, run_dir: Path) -> bool:
    try:
        return child.resolve() != run_dir and child.is_dir() and is_trace_dir(child)
    except (OSError, RuntimeError):  # RuntimeError: pathlib's "Symlink loop"
        return False


_pick_root: Path | None = None  # where a baseline may be picked from; None: the run's parent directory


def set_pick_root(root: Path | None) -> None:
    """``diag dashboard --baseline-root DIR``: allow baselines anywhere under DIR, not only beside the run."""
    global _pick_root
    _pick_root = Path(root).resolve() if root is not None else None


def pick_root(run_dir: Path) -> Path:
    return _pick_root if _pick_root is not None else Path(run_dir).resolve().parent


def resolve_baseline(text: str | None, run_dir: Path) -> tuple[Path | None, str | None]:
    """The directory a typed or picked baseline names, or why it cannot be one (a message for the page).
    Only directories under ``pick_root`` are looked at: of any other path the page says the same whether it
    exists or not, so that a viewer learns nothing about the server's files."""
    text = (text or "").strip()
    if not text:
        return None, "give a directory: a diag trace directory (the one diag.init wrote)"
    if "\x00" in text or not text.isprintable():
        return None, "that is not a path"
    root = pick_root(run_dir)
    path = Path(text).expanduser()
    if not path.is_absolute():
        path = Path(run_dir).resolve().parent / path
    try:
        inside = path.resolve().is_relative_to(root)
    except (OSError, RuntimeError):  # a symlink loop
        inside = False
    if not inside:
        return None, (
            f"only directories under {root} can be compared here (start the dashboard with --baseline-root DIR, "
            "or --baseline, for others)"
        )
    try:
        if not path.exists():
            return None, f"{path} does not exist"
        if not path.is_dir():
            return None, f"{path} is not a directory: give a diag trace directory"
        if path.resolve() == Path(run_dir).resolve():
            return None, f"{path} is this run itself: pick another run"
    except OSError as exc:
        return None, f"{path} cannot be read: {exc.strerror or exc}"
    if not is_trace_dir(path):
        return None, f"{path} is not a diag trace directory (no rankN/manifest.json inside)"
    return path, None


def use_baseline(text: str | None, run_dir: Path) -> tuple[bool, str]:
    """Validate, load and set the baseline ``text`` names; (done, message for the page)."""
    from diag.analysis.runs import RunError, load_summary

    path, error = resolve_baseline(text, run_dir)
    if error is not None:
        return False, error
    if _baseline is not None and _baseline_path == path.resolve():
        return True, f"baseline: {path} ({len(_baseline.step_ms)} steps)"
    try:
        summary = load_summary(path, path.name or str(path))
    except RunError as exc:
        return False, f"{path} cannot be compared: {exc}"
    except Exception as exc:  # noqa: BLE001 - a page shows why, the server carries on
        return False, f"{path} cannot be compared: {type(exc).__name__}: {exc}"
    set_baseline(summary, path)
    return True, f"baseline: {path} ({len(summary.step_ms)} steps)"


def controls():
    """The baseline picker, above the page's content (its options are filled when the page opens)."""
    return html.Div(
        [
            html.Label("baseline: "),
            dcc.Dropdown(id=PICK_ID, placeholder="a run beside this one", style={"width": "420px"}),
            dcc.Input(
                id=PATH_ID, type="text", placeholder="or a path to a diag trace directory", style={"width": "420px"}
            ),
            html.Button("compare", id=USE_ID),
            html.Div(id=MESSAGE_ID),
        ],
        style={"display": "flex", "gap": "8px", "alignItems": "center", "flexWrap": "wrap"},
    )


def register(app, live, page) -> None:
    """The picker's callbacks: the list of runs beside this one when the page opens, and a pick or a typed
    path (the button or Enter) sets the baseline and draws the page again."""
    run_dir = Path(live.trace_dir)

    @app.callback(Output(PICK_ID, "options"), Output(PICK_ID, "value"), Input(page.opened_id, "data"))
    def options(_opened):
        runs = sibling_runs(run_dir)
        chosen = str(_baseline_path) if _baseline_path is not None and _baseline_path in runs else None
        return [{"label": p.name, "value": str(p)} for p in runs], chosen

    @app.callback(
        Output(MESSAGE_ID, "children"),
        Output(page.opened_id, "data"),
        Input(PICK_ID, "value"),
        Input(USE_ID, "n_clicks"),
        Input(PATH_ID, "n_submit"),
        State(PATH_ID, "value"),
        prevent_initial_call=True,
    )
    def pick(picked, _clicks, _submitted, typed):
        text = picked if dash.ctx.triggered_id == PICK_ID else typed
        if dash.ctx.triggered_id == PICK_ID and not picked:
            return dash.no_update, dash.no_update
        done, message = use_baseline(text, run_dir)
        if not done:
            return html.Div(message, className="missing"), dash.no_update
        return html.Div(message), state_key()


def update_compare(snap, rank: int | None) -> dict:
    from diag.analysis.compare import compare_runs, summarize_run
    from diag.dashboard.data import with_step_components
    from diag.views.compare import blocks, components_figure, steps_figure

    base, version = _baseline, _baseline_version  # one baseline throughout, whatever a pick does meanwhile
    if base is None:
        return _message(
            "No baseline: pick a run above, or start the dashboard with --baseline DIR to compare this run with another."
        )
    if snap.error or snap.trace is None or snap.report is None:
        return _message(snap.error or snap.analysis_error or "the run is still loading")
    if snap.report_source == PRELIMINARY:  # summarising reads every rank's steps again: once, for the full report
        return _message(f"The comparison comes with the full report: {snap.analysis_error}")
    # this run's summary, once per snapshot whatever the baseline; above 64 ranks it reads the steps' components
    # again rank by rank (data.with_step_components: the server does not hold them)
    summary = snap.memo(
        "compare-summary", lambda: summarize_run(with_step_components(snap.trace), snap.report, "this run")
    )
    report = snap.memo(f"compare-{version}", lambda: compare_runs([base, summary]))
    return {
        "body": html.Div(
            [_block(b) for b in blocks(report)[1:] if b.heading.split(":")[0] != "Collectives by size class"]
        ),
        "components": components_figure(report) or f.message_figure("components", "no steps yet"),
        "steps": steps_figure(report) or f.message_figure("steps", "no steps yet"),
    }


def _message(text: str) -> dict:
    """``text`` once, the figures blank."""
    out = {name: f.blank_figure() for name in GRAPHS}
    out["body"] = html.Div(text, className="missing")
    return out


def _block(block) -> html.Div:
    children = [html.H3(block.heading)]
    if block.lines:
        children.append(html.Pre("\n".join(block.lines)))
    if block.table:
        children.append(
            html.Table(
                [
                    html.Thead(html.Tr([html.Th(c) for c in block.table[0]])),
                    html.Tbody([html.Tr([html.Td(c) for c in row]) for row in block.table[1:]]),
                ],
                className="table",
            )
        )
    return html.Div(children)
