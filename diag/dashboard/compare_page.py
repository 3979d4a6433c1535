"""The dashboard's Compare page: the run being followed against a baseline run chosen when the dashboard starts
(``diag dashboard RUN --baseline BASE``; never from a URL or a form, so a request cannot name a directory).

The baseline is summarised once (``diag.analysis.compare``, through the caches ``diag compare`` uses); the live
run's summary comes from each snapshot's own trace and report, so the comparison follows the run as it grows.
Figures and text come from ``diag.views.compare``; nothing is computed here."""

from __future__ import annotations

from dash import html

from diag.dashboard import figures as f

GRAPHS = ("components", "steps")
TEXTS = ("body",)
INTRO = "This run against the baseline given with --baseline: the verdict, where the time went, and the per-step times."

_baseline = None  # RunSummary


def set_baseline(summary) -> None:
    """The baseline's ``RunSummary`` (``diag.commands.compare.load_summary``), or None for no baseline."""
    global _baseline
    _baseline = summary


def baseline():
    return _baseline


def update_compare(snap, rank: int | None) -> dict:
    from diag.analysis.compare import compare_runs, summarize_run
    from diag.views.compare import blocks, components_figure, steps_figure

    if _baseline is None:
        return _message("No baseline: start the dashboard with --baseline DIR to compare this run with another.")
    if snap.error or snap.trace is None or snap.report is None:
        return _message(snap.error or snap.analysis_error or "the run is still loading")
    report = snap.memo("compare", lambda: compare_runs([_baseline, summarize_run(snap.trace, snap.report, "this run")]))
    return {
        "body": html.Div(
            [_block(b) for b in blocks(report)[1:] if b.heading.split(":")[0] != "Collectives by size class"]
        ),
        "components": components_figure(report) or f.message_figure("components", "no steps yet"),
        "steps": steps_figure(report) or f.message_figure("steps", "no steps yet"),
    }


def _message(text: str) -> dict:
    out = {name: f.message_figure(name, text) for name in GRAPHS}
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
