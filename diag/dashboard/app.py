"""The Dash app of ``diag dashboard``: a fixed set of pages over one trace directory, refreshed on an interval.

Safety: URLs only select one of the pages below (never a path on disk); with a token, every request must carry
it (``?token=`` once, then a cookie, or an ``X-Diag-Token`` header); a page that cannot be drawn says why.
"""

from __future__ import annotations

import hmac
import traceback
from pathlib import Path

import dash
from dash import ALL, Input, Output, State, dcc, html
from dash.exceptions import PreventUpdate

from diag.dashboard import figures as f
from diag.dashboard.data import PRELIMINARY, LiveTrace, group_options, rank_options
from diag.dashboard.pages import PAGES, Page, prepare, unavailable

REFRESH_MS = 3000
TOKEN_COOKIE = "diag_dashboard_token"
TOKEN_HEADER = "X-Diag-Token"
PLOTLY_JS = "_dash-component-suites/plotly/package_data/plotly.min.js"

CSS = """
body { font-family: system-ui, sans-serif; margin: 0; color: #222; }
.header { background: #24292f; color: white; padding: 8px 16px; display: flex; gap: 16px; align-items: center; flex-wrap: wrap; }
.header a { color: #c9d1d9; text-decoration: none; } .header a:hover { color: white; }
.header .title { font-weight: bold; font-size: 18px; } .header .picker { color: #222; font-size: 13px; }
.status { padding: 4px 16px; background: #f6f8fa; border-bottom: 1px solid #ddd; font-size: 13px; }
.page { padding: 0 16px 24px 16px; overflow-wrap: break-word; } .intro { color: #555; }
.page pre { white-space: pre-wrap; overflow-wrap: anywhere; }
.cards { display: flex; flex-wrap: wrap; gap: 8px; } .card { border: 1px solid #ddd; border-radius: 6px; padding: 6px 10px; }
.card-key { display: block; font-size: 11px; color: #666; } .card-value { font-weight: 600; }
.table { border-collapse: collapse; font-size: 13px; margin: 8px 0; } .table td, .table th { border: 1px solid #ddd; padding: 3px 6px; text-align: left; vertical-align: top; }
.missing { background: #fff8c5; border: 1px solid #d4a72c; padding: 8px 12px; border-radius: 6px; margin: 8px 0; }
.problems { font-size: 13px; color: #6a4a00; } .straggler { margin-bottom: 6px; }
"""


def create_app(
    trace_dir: str | Path, token: str | None = None, refresh_ms: int = REFRESH_MS, live: LiveTrace | None = None
) -> dash.Dash:
    """The Dash app over ``trace_dir``. Loads the trace once (``live`` may be given already loaded) and starts
    the background poller; ``app.live`` is the ``LiveTrace``."""
    if live is None:
        live = LiveTrace(trace_dir, poll_interval_s=max(refresh_ms / 1000, 0.5))
        live.refresh()
    live.prepare = prepare
    prepare(live.snapshot)
    live.start()
    app = dash.Dash(__name__, title="diag dashboard", suppress_callback_exceptions=True, update_title=None)
    # plotly.js (4.7 MB) is fetched by the first figure; preloading it saves that round trip on the first page
    # (Dash's eager_loading would also fetch every other async chunk: mathjax, markdown, tables, 9.6 MB)
    preload = f'<link rel="preload" as="script" href="{app.config.requests_pathname_prefix}{PLOTLY_JS}">'
    app.index_string = app.index_string.replace("{%css%}", "{%css%}" + preload + "<style>" + CSS + "</style>")
    app.layout = _layout(refresh_ms)
    app.live = live
    _register_callbacks(app, live)
    if token:
        _require_token(app.server, token)
    return app


def _layout(refresh_ms: int):
    links = [dcc.Link(p.title, href=p.path, id=f"nav-{p.key}") for p in PAGES.values()]
    return html.Div(
        [
            dcc.Location(id="url"),
            dcc.Store(id="selected-rank"),
            dcc.Interval(id="tick", interval=refresh_ms),
            html.Div(
                [
                    html.Span("diag dashboard", className="title"),
                    *links,
                    html.Span(
                        [
                            "rank ",
                            dcc.Input(
                                id="rank-input",
                                type="number",
                                min=0,
                                debounce=True,
                                placeholder="select",
                                style={"width": "80px"},
                            ),
                        ]
                    ),
                    # thousands of ranks: pick a group (a node, or a block of ranks), then one of its ranks
                    dcc.Dropdown(
                        id="group-select", placeholder="rank group", className="picker", style={"width": "320px"}
                    ),
                    dcc.Dropdown(
                        id="group-rank-select",
                        placeholder="rank in group",
                        className="picker",
                        style={"width": "300px"},
                    ),
                    dcc.Store(id="groups-version"),
                ],
                className="header",
            ),
            html.Div(id="status", className="status"),
            html.Div(id="page"),
        ]
    )


def _register_callbacks(app: dash.Dash, live: LiveTrace) -> None:
    @app.callback(Output("page", "children"), Input("url", "pathname"))
    def route(pathname):
        page = PAGES.get(pathname or "/")
        if page is None:  # only the fixed pages exist: a URL never names a file
            return html.Div([html.H2("No such page"), html.P("Pages: " + ", ".join(PAGES))], className="page missing")
        return page.layout()

    @app.callback(Output("status", "children"), Input("tick", "n_intervals"), Input("selected-rank", "data"))
    def status(_, rank):
        return _status_text(live, rank)

    @app.callback(
        Output("group-select", "options"),
        Output("groups-version", "data"),
        Input("tick", "n_intervals"),
        State("groups-version", "data"),
    )
    def groups(_, version):
        snap = live.snapshot
        if version == snap.version:
            raise PreventUpdate  # the options the browser has are this snapshot's
        return group_options(snap), snap.version

    @app.callback(Output("group-rank-select", "options"), Input("group-select", "value"))
    def ranks_of_group(group_key):
        return rank_options(live.snapshot, group_key)

    @app.callback(
        Output("selected-rank", "data"),
        Output("rank-input", "value"),
        Input({"kind": "graph", "name": ALL}, "clickData"),
        Input("rank-input", "value"),
        Input("group-rank-select", "value"),
        prevent_initial_call=True,
    )
    def select(_clicks, typed, picked):
        trigger = dash.ctx.triggered_id
        if trigger == "rank-input":
            return (int(typed), dash.no_update) if typed is not None else (None, dash.no_update)
        if trigger == "group-rank-select":
            if picked is None:
                raise PreventUpdate
            return int(picked), int(picked)
        rank = rank_from_click(dash.ctx.triggered[0]["value"] if dash.ctx.triggered else None)
        if rank is None:
            raise PreventUpdate
        return rank, rank

    for page in PAGES.values():
        _register_page(app, live, page)
        if page.register:
            page.register(app, live, page)


def rank_from_click(click: dict | None) -> int | None:
    """The rank a clicked point stands for: its customdata (every per-rank point carries it)."""
    if not click or not click.get("points"):
        return None
    value = click["points"][0].get("customdata")
    if isinstance(value, list):
        value = value[0] if value else None
    try:
        rank = int(value)
    except (TypeError, ValueError):
        return None
    return rank if rank >= 0 else None


def _register_page(app: dash.Dash, live: LiveTrace, page: Page) -> None:
    outputs = [Output(page.graph_id(g), "figure") for g in page.graphs]
    outputs += [Output(page.text_id(t), "children") for t in page.texts]
    outputs.append(Output(page.shown_id, "data"))

    @app.callback(
        outputs,
        Input(page.opened_id, "data"),
        Input("tick", "n_intervals"),
        Input("selected-rank", "data"),
        State(page.shown_id, "data"),
    )
    def update(_opened, _tick, rank, shown):
        snap = live.snapshot
        key = [snap.version, rank, page.state() if page.state else None]
        if shown == key:
            raise PreventUpdate  # nothing new since this page was drawn
        content = render_page(page, snap, rank)
        return [content[g] for g in page.graphs] + [content[t] for t in page.texts] + [key]


def render_page(page: Page, snap, rank: int | None) -> dict:
    """The page's content; a failure becomes a message on the page rather than a broken page."""
    try:
        content = page.update(snap, rank)
    except Exception as exc:
        traceback.print_exc()
        content = unavailable(page, f"this page could not be drawn from the trace ({exc!r})")
    for name in page.graphs:  # not setdefault: it would build a figure (~60 ms of plotly) for every graph drawn
        if name not in content:
            content[name] = f.message_figure(name, "no data")
    for name in page.texts:
        if name not in content:
            content[name] = html.Div()
    return content


def _status_text(live: LiveTrace, rank: int | None) -> str:
    snap = live.snapshot
    if snap.error:
        return f"{live.trace_dir}: {snap.error}"
    parts = [str(live.trace_dir), f"run {snap.run_state}"]
    if snap.rank_states is not None:
        counts = snap.rank_states["state"].value_counts()
        parts.append(", ".join(f"{n} {s}" for s, n in counts.items()))
        stale = snap.rank_states.loc[snap.rank_states["state"] == "stale", "rank"].tolist()
        if stale:
            parts.append("stale ranks: " + ", ".join(map(str, stale[:20])) + (" ..." if len(stale) > 20 else ""))
    if snap.trace is not None and len(snap.trace.steps):
        parts.append(f"last step {int(snap.trace.steps['step'].max())}")
    if snap.report_source == "cache":  # the step times' waits are then the ranks' own (data.partitioned_report)
        parts.append("report read from diag analyze's cache (.diag-cache)")
    elif snap.report_source == PRELIMINARY:
        parts.append("preliminary report from the step times; the full report is being computed")
    parts.append(f"selected rank: {rank if rank is not None else '-'}")
    return " · ".join(parts)


LOCAL_HOST_NAMES = ("localhost", "127.0.0.1", "[::1]")


def require_local_host_header(server, port: int) -> None:
    """Bound to loopback without a token, the only protection is that requests come from this machine; a web
    page on another site can still reach 127.0.0.1 through a DNS name it rebinds to it (DNS rebinding). Such
    requests carry that name in the Host header: accept only localhost, 127.0.0.1 and [::1] (with the port)."""
    allowed = {name for host in LOCAL_HOST_NAMES for name in (host, f"{host}:{port}")}

    @server.before_request
    def _check_host():
        from flask import abort, request

        if request.host.lower() not in allowed:
            abort(403, description="Host header not allowed: open the dashboard as http://127.0.0.1:PORT/")


def _require_token(server, token: str) -> None:
    """Every request must carry ``token``: as ``?token=`` (then remembered in a cookie), a cookie or a header."""
    from flask import abort, request

    def given() -> str:
        return request.args.get("token") or request.headers.get(TOKEN_HEADER) or request.cookies.get(TOKEN_COOKIE) or ""

    @server.before_request
    def check():
        if not hmac.compare_digest(given().encode(), token.encode()):
            abort(403, "diag dashboard: this server needs its token (open the URL with ?token=... printed at start)")

    @server.after_request
    def remember(response):
        if request.args.get("token") and hmac.compare_digest(request.args["token"].encode(), token.encode()):
            response.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="Strict")
        return response
