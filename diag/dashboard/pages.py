"""The dashboard's pages: each is a static layout and an ``update(snapshot, selected_rank)`` that returns the
content of its figures and text blocks. The app wires them to callbacks; nothing here touches the file system.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd
from dash import dcc, html

from diag.analysis import grid
from diag.analysis.memory import category_series, memory_metric, oom_steps
from diag.analysis.stragglers import cost_text
from diag.dashboard import compare_page, live_pull
from diag.dashboard import data as d
from diag.dashboard import figures as f
from diag.triage.report import ACTION_WORDS
from diag.views.format import mib, ms_from_s, pct, pct_from_pct, rate

MAX_FINDINGS_SHOWN = 20
MAX_RANKS_LISTED = 40


@dataclass
class Page:
    path: str
    title: str
    graphs: tuple[str, ...]
    texts: tuple[str, ...]
    update: Callable  # (Snapshot, selected_rank) -> {name: figure or children}
    intro: str = ""
    controls: Callable | None = None  # () -> components above the page's content (the Compare page's picker)
    register: Callable | None = None  # (app, live, page) -> None: callbacks of those controls
    state: Callable | None = None  # () -> a value that changes when the page must be drawn again (its baseline)

    def graph_id(self, name: str) -> dict:
        return {"kind": "graph", "name": f"{self.key}-{name}"}

    def text_id(self, name: str) -> str:
        return f"{self.key}-{name}"

    @property
    def key(self) -> str:
        return self.path.strip("/") or "overview"

    @property
    def shown_id(self) -> str:
        return f"{self.key}-shown"

    @property
    def opened_id(self) -> str:
        """A store inside the page: as an input of the page's callback, it fires the callback the moment the
        page is inserted (inputs outside the page, like the interval, would wait for the next tick)."""
        return f"{self.key}-opened"

    def layout(self):
        children = [html.H2(self.title), html.P(self.intro, className="intro") if self.intro else None]
        children.append(self.controls() if self.controls else None)
        children += [html.Div(id=self.text_id(name), className="text-block") for name in self.texts]
        children += [
            dcc.Graph(id=self.graph_id(name), config={"displaylogo": False}, className="graph") for name in self.graphs
        ]
        children += [dcc.Store(id=self.shown_id), dcc.Store(id=self.opened_id, data=0)]
        return html.Div([c for c in children if c is not None], className="page", id=f"page-{self.key}")


# -- helpers ------------------------------------------------------------------------------------------------
def _missing_reason(snap: d.Snapshot) -> str | None:
    """Why a page that needs the analysis cannot be drawn, in words a user can act on."""
    if snap.error:
        return snap.error
    if snap.trace is None:
        return "the trace is still loading"
    if snap.report is None:
        return snap.analysis_error or "nothing to analyse yet"
    return None


def _pending_reason(snap: d.Snapshot, what: str) -> str | None:
    """Why a page drawn from the collectives, memory or telemetry waits while the preliminary report is shown."""
    if snap.report_source != d.PRELIMINARY:
        return None
    return f"{what} come with the full report: {snap.analysis_error}"


def _preliminary_banner(snap: d.Snapshot) -> html.Div | None:
    if snap.report_source != d.PRELIMINARY:
        return None
    return html.Div(
        "Preliminary report, from the step times alone (the waits each rank measured itself): the communication, "
        f"memory and GPU findings, and a straggler's final cause and cost, come with the full report. {snap.analysis_error}.",
        className="missing",
        id="preliminary-banner",
    )


def _table(header: list[str], rows: list[list], cls: str = "table") -> html.Table:
    return html.Table(
        [
            html.Thead(html.Tr([html.Th(h) for h in header])),
            html.Tbody([html.Tr([html.Td(str(c)) for c in row]) for row in rows]),
        ],
        className=cls,
    )


def _selected_steps(snap: d.Snapshot, rank: int | None) -> pd.DataFrame:
    return d.one_rank(snap.times, rank) if snap.times is not None else pd.DataFrame()


def _straggler_ranks(snap: d.Snapshot) -> set[int]:
    return {s.rank for s in snap.report.stragglers.stragglers} if snap.report is not None else set()


def unavailable(page: Page, reason: str) -> dict:
    """``page`` saying once, in its first text, that ``reason`` keeps it from being drawn; its figures blank
    (each repeating it buried the one sentence that matters)."""
    out = {name: f.blank_figure() for name in page.graphs}
    out.update({name: html.Div() for name in page.texts})
    if page.texts:
        out[page.texts[0]] = html.Div(f"Cannot draw this page: {reason}", className="missing")
    else:
        out = {name: f.message_figure(name, f"Cannot draw this page: {reason}") for name in page.graphs}
    return out


def said_once(page: Page, text: str, text_id: str | None = None) -> dict:
    """``page`` with nothing to draw for this run (not pipelined, no GPU): ``text`` once, its figures blank."""
    out = {name: f.blank_figure() for name in page.graphs}
    out.update({name: html.Div() for name in page.texts})
    out[page.texts[0]] = html.Div(text, className="missing", id=text_id)
    return out


# -- overview -----------------------------------------------------------------------------------------------
def update_overview(snap: d.Snapshot, rank: int | None) -> dict:
    out = {"ranks": f.rank_state_figure(snap.rank_states, rank), "problems": _problems(snap)}
    reason = _missing_reason(snap)
    if reason:
        head = "Analysis in progress" if snap.analysing else "Cannot analyse this trace"
        out["summary"] = html.Div(f"{head}: {reason}", className="missing")
        out["findings"] = html.Div()
        for name in ("steps", "mfu", "throughput", "health"):
            out[name] = f.message_figure(name, reason)
        return out
    report = snap.report
    per_step = snap.memo("per_step", lambda: d.downsample(pd.DataFrame(report.timeline.per_step)))
    mfu = snap.memo("mfu", lambda: d.downsample(pd.DataFrame(report.mfu.per_step)))
    tp = snap.memo("throughput", lambda: d.downsample(_throughput(snap)))
    banner = _preliminary_banner(snap)
    out["summary"] = html.Div([banner, _summary(snap)]) if banner is not None else _summary(snap)
    out["findings"] = _findings(report.findings)
    out["steps"] = f.step_time_figure(per_step, _selected_steps(snap, rank))
    out["mfu"] = f.mfu_figure(mfu, report.mfu.reason)
    out["throughput"] = f.throughput_figure(tp)
    health = snap.memo("health", lambda: d.downsample(pd.DataFrame(report.health.per_step)))
    out["health"] = f.health_figure(health, report.health.note)
    return out


def _throughput(snap: d.Snapshot) -> pd.DataFrame:
    """Tokens and samples per second of every recorded step, by the MFU analysis's rule."""
    from diag.analysis.mfu import per_step_throughput
    from diag.analysis.report import ranks_sharing_tokens

    return per_step_throughput(snap.trace.steps, snap.times, ranks_sharing_tokens(snap.trace))


def _summary(snap: d.Snapshot) -> html.Div:
    r = snap.report
    run, mfu, w = r.run, r.mfu, r.run.window
    items = [
        ("run", f"{run.run_id or '-'} ({snap.run_state})"),
        ("ranks", f"{len(run.ranks_found)} of {run.world_size} on {run.hosts} hosts"),
        ("device", run.device_name or "-"),
        ("steps analysed", f"{w.steps_analysed} (steps {w.first_step}..{w.last_step} of {w.steps_recorded} recorded)"),
        ("step time (median)", ms_from_s(mfu.step_time_median_s)),
        ("MFU", pct(mfu.median) if mfu.median is not None else f"unknown ({mfu.reason})"),
        (
            "throughput",
            rate(mfu.tokens_per_s, "tokens")
            if mfu.tokens_per_s
            else rate(mfu.samples_per_s, "samples", 1)
            if mfu.samples_per_s
            else "-",
        ),
    ]
    return html.Div(
        [
            html.Div([html.Span(k, className="card-key"), html.Span(v, className="card-value")], className="card")
            for k, v in items
        ],
        className="cards",
    )


def _findings(findings: list) -> html.Div:
    if not findings:
        return html.Div("No findings: nothing in this run costs measurable time.", id="findings-none")
    rows = [
        [
            x.severity,
            x.title,
            ", ".join(map(str, x.ranks[:8])) + (" ..." if len(x.ranks) > 8 else ""),
            ms_from_s(x.time_lost_per_step_s),
            x.advice,  # whole: a cut mid-word lost the action
        ]
        for x in findings[:MAX_FINDINGS_SHOWN]
    ]
    return html.Div(
        [
            html.H3("Findings, by time lost"),
            _table(["severity", "finding", "ranks", "lost per step", "advice"], rows, "table findings"),
        ]
    )


def _problems(snap: d.Snapshot) -> html.Div:
    """What could not be read: skipped files, missing ranks, notes of the step window."""
    lines = []
    if snap.error:
        lines.append(snap.error)
    if snap.analysis_error and not snap.analysing:  # in progress is not a problem: the summary says so
        lines.append(snap.analysis_error)
    trace = snap.trace
    if trace is not None:
        if trace.ranks_missing:
            lines.append(
                f"{len(trace.ranks_missing)} ranks have no trace directory: {_ranks_text(trace.ranks_missing)}"
            )
        lines += [str(s) for s in trace.skipped[:20]]
        if len(trace.skipped) > 20:
            lines.append(f"... {len(trace.skipped) - 20} more files or rows skipped")
    if snap.report is not None:
        lines += snap.report.run.notes
    if not lines:
        return html.Div()
    return html.Div(
        [html.H3("What is missing or was left out"), html.Ul([html.Li(x) for x in lines])], className="problems"
    )


def _ranks_text(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks[:MAX_RANKS_LISTED])) + (
        f", ... ({len(ranks)} in all)" if len(ranks) > MAX_RANKS_LISTED else ""
    )


# -- stragglers ---------------------------------------------------------------------------------------------
def update_stragglers(snap: d.Snapshot, rank: int | None) -> dict:
    reason = _missing_reason(snap) or (None if snap.times is not None else "no steps recorded")
    if reason:
        return unavailable(PAGES["/stragglers"], reason)
    report, times = snap.report, snap.times
    stragglers = report.stragglers.stragglers

    compute = snap.memo("m_compute", lambda: d.rank_step_matrix(times, "compute_us"))
    wait = snap.memo("m_wait", lambda: d.rank_step_matrix(times, "wait_us"))

    def window_aggregates():  # the window's rows selected once per snapshot (16 M rank-steps at 16,384 ranks)
        rows = times[times["step"].between(report.run.window.first_step or 0, report.run.window.last_step or 0)]
        # colour range from the analysed window's rank medians, so warm-up steps and spikes do not wash it out
        return (
            _zmax_ms(rows, "compute_us"),
            _zmax_ms(rows, "wait_us"),
            d.per_rank_quantiles(rows if len(rows) else times, "busy_us"),
        )

    zmax_compute, zmax_wait, quantiles = snap.memo("window_aggregates", window_aggregates)
    banner = _preliminary_banner(snap)
    named = _stragglers_text(report)
    return {
        "named": html.Div([banner, named]) if banner is not None else named,
        "compute": f.heatmap_figure(compute, "Compute time per rank and step", stragglers, rank, zmax_compute),
        "wait": f.heatmap_figure(
            wait, "Wait time (blocked in communication) per rank and step", stragglers, rank, zmax_wait
        ),
        "distribution": f.rank_distribution_figure(
            quantiles, "Work per step (data wait + compute), per rank", _straggler_ranks(snap), rank
        ),
        "rank": f.rank_vs_median_figure(
            snap.memo("median_by_step", lambda: _median_by_step(times, ("compute_us", "wait_us"))),
            d.one_rank(times, rank),
            rank,
        ),
    }


def _zmax_ms(frame: pd.DataFrame, column: str) -> float | None:
    """Top of a heatmap's colour scale: 10% above the highest rank median, so a persistent straggler is near
    the top of the scale and the others below it, while spikes (and warm-up) saturate instead of flattening
    everything else."""
    if not len(frame):
        return None
    top_us = float(grid.per_rank(frame, column).max())  # the groupby's medians, as matrix rows where it is one
    return 1.1 * top_us / 1e3 if top_us > 0 else None


def _median_by_step(times: pd.DataFrame, columns: tuple[str, ...]) -> pd.DataFrame:
    """``times.groupby("step")[columns].median()``, as ranks x steps matrix columns where the frame is rank by
    rank (diag.analysis.grid: ~1.5 s of grouping at 16,384 ranks x 1,000 steps)."""
    return pd.DataFrame({c: grid.per_step(times, c) for c in columns})


def _stragglers_text(report) -> html.Div:
    sr = report.stragglers
    if not sr.stragglers:
        note = f" ({sr.note})" if sr.note else ""
        return html.Div(f"No straggler found in {sr.steps} steps{note}.", id="stragglers-none")
    items = []
    for s in sr.stragglers:
        where = ", ".join(
            x for x in (f"host {s.host}" if s.host else "", f"GPU {s.gpu}" if s.gpu is not None else "") if x
        )
        kind = "persistent" if s.persistent else "transient"
        head = f"Rank {s.rank}{f' ({where})' if where else ''}: {kind} straggler, cause: {s.cause}; {pct(s.slowdown, 0, signed=True)} work vs the other ranks, {cost_text(s)}"
        items.append(
            html.Li(
                [html.B(head), html.Ul([html.Li(e) for e in s.evidence])],
                className=f"straggler straggler-{s.cause}",
                id=f"straggler-{s.rank}",
            )
        )
    return html.Div([html.H3("Stragglers"), html.Ul(items)])


# -- communication ------------------------------------------------------------------------------------------
def update_comms(snap: d.Snapshot, rank: int | None) -> dict:
    reason = _missing_reason(snap) or _pending_reason(snap, "the collectives' waits, sizes and links")
    if reason:
        return unavailable(PAGES["/communication"], reason)
    comms = snap.report.comms
    lines = []
    if comms.exposed_comm_per_step_s is not None:
        lines.append(
            f"Exposed communication (least any rank was blocked, median step): {ms_from_s(comms.exposed_comm_per_step_s)} per step"
        )
    if comms.note:
        lines.append(comms.note)
    if rank is not None:
        mine = next((r for r in comms.per_rank if r.rank == rank), None)
        if mine is not None:
            lines.append(
                f"Rank {rank}: waits for peers {pct_from_pct(mine.wait_share_pct)} of its step time, blocked in communication {pct_from_pct(mine.blocked_share_pct)}, arrived last at {pct(mine.last_arrival_fraction, 0)} of its collectives"
            )
    return {
        "summary": html.Ul([html.Li(x) for x in lines]),
        "links": _links_text(getattr(snap.report, "links", None)),
        "nccl": _nccl_text(getattr(snap.report, "nccl", None), rank),
        "collectives": f.collectives_figure(comms.collectives[:30]),
        "bandwidth": f.bandwidth_figure(comms.collectives[:30]),
        "wait": f.comm_wait_figure(comms.per_rank, rank),
        "groups": f.group_speed_figure(getattr(snap.report, "links", None)),
    }


def _links_text(links) -> html.Div:
    if links is None:
        return html.Div()
    items = [
        html.Li(
            f"{s.label()}: in {len(s.slow_groups)} of {s.slow_total} slow process groups ({s.groups_including} "
            f"include it), busbw {s.busbw_gbps:.3g} GB/s vs {s.peer_busbw_gbps or 0:.3g} GB/s for the others, "
            f"{s.lost_s:.2f} s lost"
        )
        for s in links.suspects
    ]
    slow = [g for g in links.groups if g.slow]
    head = f"Slow links: {len(slow)} of {len(links.groups)} process groups slower than their peers"
    return html.Div([html.H3(head), html.Ul(items) if items else None, html.P(links.note) if links.note else None])


def _nccl_text(nccl, rank: int | None) -> html.Div:
    """NCCL's own view: the ranks unlike most first (and the selected rank), with transport, version, GDR."""
    if nccl is None:
        return html.Div(
            "No nccl.log in the trace: NCCL's view needs diag.init before NCCL's first collective, with "
            "NCCL_DEBUG unset (see the manifests' capture.nccl_log).",
            className="missing",
        )

    def row(v):
        return [
            v.version or "-",
            v.net_kind or "-",
            "/".join(v.intra_node) or "-",
            {True: "on", False: "off", None: "-"}[v.gdr],
            v.channels if v.channels is not None else "-",
            "yes" if v.nvls else "no",
        ]

    rows = [row(v) for v in nccl.ranks]
    common = max(rows, key=rows.count) if rows else None
    ordered = sorted(nccl.ranks, key=lambda v: (v.rank != rank, row(v) == common, v.rank))[:MAX_RANKS_LISTED]
    versions = ", ".join(f"{v} ({len(r)} ranks)" for v, r in nccl.versions.items()) or "-"
    groups = [
        html.Li(f"group {g.pg}: {', '.join(g.transports) or '-'}, {g.channels or '-'} channels") for g in nccl.groups
    ]
    return html.Div(
        [
            html.H3("NCCL"),
            html.P(f"NCCL versions: {versions}; {len(nccl.ranks)} ranks with an nccl.log"),
            *(html.P(n) for n in nccl.notes),
            html.Ul(groups[:MAX_RANKS_LISTED]) if groups else None,
            _table(
                ["rank", "host", "version", "net", "intra-node", "GDR", "channels", "NVLS"],
                [[v.rank, v.host or "-", *row(v)] for v in ordered],
            ),
        ]
    )


# -- memory -------------------------------------------------------------------------------------------------
def _views_reason(snap: d.Snapshot) -> str | None:
    """Many ranks: why the memory and telemetry views are not there yet (read after the report is published)."""
    if snap.views_pending:
        ranks = len(snap.trace.ranks_found) if snap.trace is not None else 0
        return f"the memory readings and GPU telemetry of {ranks:,} ranks are being read rank by rank; drawn when done"
    return snap.views_error


def update_memory(snap: d.Snapshot, rank: int | None) -> dict:
    reason = _missing_reason(snap) or _pending_reason(snap, "memory readings and leaks") or _views_reason(snap)
    if reason:
        return unavailable(PAGES["/memory"], reason)
    report = snap.report.memory
    mem = snap.memory_view if snap.memory_view is not None else snap.trace.memory  # many ranks: compact view
    metric = memory_metric(mem) if len(mem) else "rss_bytes"
    band = snap.memo("mem_band", lambda: d.fleet_band(mem, "step", metric))
    ooms = snap.memo("ooms", lambda: oom_steps(snap.trace.events, mem))
    selected = d.one_rank(mem, rank)
    lines = []
    if report.note:
        lines.append(report.note)
    leaks = [r for r in report.per_rank if r.leak_suspected]
    for r in leaks[:10]:
        lines.append(
            f"Rank {r.rank}: memory grows {mib(r.growth_bytes_per_step, 1)} per step (r² {r.growth_r2:.2f}): leak suspected"
        )
    if report.closest_to_oom:
        lines.append(f"Closest to OOM: ranks {', '.join(map(str, report.closest_to_oom))}")
    if len(ooms):
        lines.append(f"Out-of-memory errors: {len(ooms)} (ranks {_ranks_text(sorted(set(ooms['rank'])))})")
    lines += _oom_lines(report.ooms) + _plan_lines(report.plan)
    lines += _deep_memory_lines(report.deep, rank)
    return {
        "summary": html.Ul([html.Li(x) for x in lines]) if lines else html.Div("No leak suspected, no OOM recorded."),
        "timeline": f.memory_figure(band, metric, selected, selected, ooms),
        "per_rank": f.memory_per_rank_figure(report.per_rank, rank),
        "categories": f.memory_categories_figure(_category_series(snap, rank), report.per_rank, rank),
    }


def _category_series(snap: d.Snapshot, rank: int | None) -> pd.DataFrame:
    """Every rank's memory categories per step; with many ranks (no memory table held) only the rank the figure
    shows (the selected one, else the one holding most), read from its own files when asked."""
    if snap.memory_view is None:
        return snap.memo("mem_categories", lambda: category_series(snap.trace.memory))
    held = {
        r.rank: (r.param_bytes or 0) + (r.grad_bytes or 0) + (r.optimizer_state_bytes or 0)
        for r in snap.report.memory.per_rank
        if r.param_bytes is not None
    }
    if not held:
        return category_series(snap.trace.memory)  # empty: the figure says nothing was recorded
    shown = rank if rank in held else max(held, key=held.get)
    return snap.memo(
        ("mem_categories", shown), lambda: category_series(d.one_rank_table(snap.trace_dir, shown, "memory"))
    )


def _oom_lines(ooms: list) -> list[str]:
    """The first OOM's explanation and its advice, most freed first (the report's, as the text view has it)."""
    from diag.analysis.memory import oom_evidence
    from diag.views.format import size

    if not ooms:
        return []
    advice = [
        a.action + (f" (frees ~{size(a.frees_bytes)})" if a.frees_bytes is not None else "") for a in ooms[0].advice
    ]
    return oom_evidence(ooms[0]) + ([f"Advice, most freed first: {'; '.join(advice[:3])}"] if advice else [])


def _plan_lines(plan) -> list[str]:
    """diag memory-plan's prediction for the run's own layout against the measured categories (median rank)."""
    from diag.views.format import size

    if plan is None or not plan.rows:
        return []
    labels = {"param_bytes": "parameters", "grad_bytes": "gradients", "optimizer_state_bytes": "optimizer state"}
    parts = [
        f"{labels.get(r.category, 'activations')} {size(r.predicted_bytes)} / {size(r.measured_bytes)}"
        for r in plan.rows
        if r.predicted_bytes is not None or r.measured_bytes is not None
    ]
    return [f"Memory plan ({plan.layout}), predicted / measured per GPU: " + ", ".join(parts)]


def _deep_memory_lines(deep: list, rank: int | None) -> list[str]:
    """The deep mode's answer (what was behind the peak), for the selected rank or the first few that ran it."""
    from diag.analysis.memory_deep import deep_lines
    from diag.views.format import size

    chosen = [x for x in deep if x.rank == rank] if rank is not None else deep[:2]
    return [line for x in chosen for line in deep_lines(x, size)]


# -- telemetry ----------------------------------------------------------------------------------------------
def update_telemetry(snap: d.Snapshot, rank: int | None) -> dict:
    reason = _missing_reason(snap) or _pending_reason(snap, "GPU telemetry and throttling") or _views_reason(snap)
    if reason:
        return unavailable(PAGES["/telemetry"], reason)
    tel = (
        snap.telemetry_view
        if snap.telemetry_view is not None
        else snap.memo("tel", lambda: d.telemetry_frame(snap.trace))
    )
    # one window per sampling interval (about one sample of every GPU in each): finer windows would hold
    # only some GPUs and the band would jump between them
    windows = snap.memo("tel_windows", lambda: int(min(500, tel.groupby("rank").size().median())) if len(tel) else 1)
    bands = snap.memo(
        "tel_bands", lambda: {c: d.fleet_band(tel, "t_s", c, max_points=windows) for c, _ in f.TELEMETRY_PANELS}
    )
    report = snap.report.telemetry
    if not len(tel) and not report.gpus:
        return said_once(PAGES["/telemetry"], _no_telemetry_text(snap), "telemetry-none")
    lines = [report.note] if report.note else []
    for g in [g for g in report.gpus if g.throttled or g.hot or g.ecc_uncorrected or g.xids][:10]:
        what = [x for x, on in (("throttled", g.throttled), ("hot", g.hot)) if on]
        reasons = ", ".join(f"{k} {pct(v, 0)}" for k, v in sorted(g.throttle_share.items()))
        lines.append(
            f"Rank {g.rank} (host {g.host}, GPU {g.gpu}): {' and '.join(what) or 'errors'}; max {g.temp_max_c} °C; reasons: {reasons or 'none'}"
            + (f"; XIDs {g.xids}" if g.xids else "")
        )
    return {
        "summary": html.Ul([html.Li(x) for x in lines]) if lines else html.Div("No GPU throttled, hot or with errors."),
        "timeline": f.telemetry_figure(bands, d.one_rank(tel, rank, 2000), rank),
        "gpus": f.gpu_summary_figure(report.gpus, rank),
    }


# -- pipeline -----------------------------------------------------------------------------------------------
def update_pipeline(snap: d.Snapshot, rank: int | None) -> dict:
    page = PAGES["/pipeline"]
    reason = _missing_reason(snap)
    if reason:
        return unavailable(page, reason)
    from diag.views.pipeline import gantt_figure_from_rows

    report = snap.report.bubble
    if report is None:
        pp = d.pipeline_degree(snap.trace)
        why = "This run is not pipelined: it has no pipeline micro-batch records (microbatches.csv), so there is no stage x time Gantt or bubble to show."
        if pp > 1:
            why = f"The manifests give {pp} pipeline stages, but no rank recorded pipeline micro-batches (microbatches.csv): instrument the schedule with diag.instrument(schedule) to see its Gantt and bubbles."
        return said_once(page, why, "pipeline-none")
    theory = (
        pct(report.theoretical_fraction, 0) if report.theoretical_fraction is not None else "unknown for this schedule"
    )
    lines = [
        f"{report.schedule or 'unknown schedule'}: {report.stages} stages x {report.virtual_stages} chunks, {report.microbatches} micro-batches, {report.steps_analysed} steps analysed",
        f"Bubble: {pct(report.measured_fraction, 0)} of the step measured, {theory} in theory ({report.theory})",
        f"Slowest stage {report.slowest_stage}: {pct(report.slowest_stage_excess_fraction, 0, signed=True)} busy vs the others{'' if report.imbalanced else ' (within noise)'}, costs {ms_from_s(report.slowest_stage_time_lost_per_step_s)} per step",
        *report.notes,
    ]
    gantt = snap.memo("gantt", lambda: gantt_figure_from_rows(pd.DataFrame(snap.report.pipeline_timeline)))
    return {
        "body": html.Ul([html.Li(x) for x in lines], id="pipeline-summary"),
        "gantt": gantt,
        "bubbles": f.bubble_figure(report),
    }


def _no_telemetry_text(snap: d.Snapshot) -> str:
    device = snap.report.run.device_name
    if device and device.lower().startswith("cpu"):
        why = f"this run is on the CPU (device {device}): there is no GPU to sample"
    else:
        why = "no rank recorded any: NVML could not be read, or capture ran with diag.init(telemetry=False)"
    return f"No GPU telemetry: {why}. Utilisation, clocks, power, temperature and throttling need NVML on a GPU."


# -- triage -------------------------------------------------------------------------------------------------
def update_triage(snap: d.Snapshot, rank: int | None) -> dict:
    if snap.error:
        return {"body": html.Div(f"Cannot draw this page: {snap.error}", className="missing")}
    verdict = snap.triage
    if verdict is None:
        return {"body": html.Div(snap.triage_note or "no triage data", className="missing", id="triage-none")}
    return {"body": triage_body(verdict, rank)}


def triage_body(verdict: dict, rank: int | None, id_prefix: str = "triage") -> html.Div:
    """A verdict (``Verdict.to_json()``) drawn: the verdict, culprits, action, evidence and the ranks' states."""
    ranks = verdict.get("ranks", {})
    culprits = set(verdict.get("culprit_ranks", []))
    counts = pd.Series([r.get("state") for r in ranks.values()]).value_counts()
    shown = _triage_ranks_listed(ranks, culprits, rank)
    rows = [
        [
            r,
            ranks[str(r)].get("state"),
            ranks[str(r)].get("last_step"),
            ranks[str(r)].get("last_phase") or "",
            ranks[str(r)].get("detail", "")[:200],
            "culprit" if r in culprits else "",
        ]
        for r in shown
    ]
    coll = verdict.get("collective")
    body = [
        html.H3(f"Verdict: {verdict['verdict']}", id=f"{id_prefix}-verdict"),
        html.P(f"Culprit ranks: {', '.join(map(str, sorted(culprits))) or '-'}", id=f"{id_prefix}-culprits"),
        html.P(f"Collective: {coll['op']} seq {coll['seq']} in process group {coll['pg']}") if coll else None,
        _triage_action(verdict, id_prefix),
        html.H4("Evidence"),
        html.Ul([html.Li(e) for e in verdict.get("evidence", [])]),
        html.H4("Ranks by state"),
        html.P(", ".join(f"{n} {s}" for s, n in counts.items())),
        html.P(
            f"{len(shown)} of {len(ranks)} ranks listed: the culprits, the selected rank and one of each state, "
            "then by rank",
            id=f"{id_prefix}-listed",
        )
        if len(shown) < len(ranks)
        else None,
        _table(["rank", "state", "last step", "phase", "detail", ""], rows),
    ]
    if verdict.get("skipped"):
        body += [html.H4("Skipped"), html.Ul([html.Li(s) for s in verdict["skipped"][:20]])]
    return html.Div([b for b in body if b is not None])


def _triage_action(verdict: dict, id_prefix: str = "triage"):
    """What to do next (diag/triage/action.py), with the hosts and GPUs it concerns; nothing when nothing."""
    action = verdict.get("action")
    if action in (None, "none"):
        return None
    where = ", ".join([*verdict.get("hosts", []), *verdict.get("gpus", [])])
    text = f"Next: {ACTION_WORDS.get(action, action)}{f' ({where})' if where else ''}: {verdict.get('action_why', '')}"
    return html.P(text, id=f"{id_prefix}-action", className="advice")


def _triage_ranks_listed(ranks: dict, culprits: set[int], selected: int | None) -> list[int]:
    """Every rank the counts above the table count, up to MAX_RANKS_LISTED: then the culprits, the selected
    rank and one rank of each state first, the others by rank."""
    every = sorted(int(r) for r in ranks)
    if len(every) <= MAX_RANKS_LISTED:
        return every
    first = {r for r in every if r in culprits or r == selected}
    example = {}
    for r, info in ranks.items():
        example.setdefault(info.get("state"), int(r))
    first |= set(example.values())
    rest = [r for r in every if r not in first]
    return sorted([*sorted(first)[:MAX_RANKS_LISTED], *rest][:MAX_RANKS_LISTED])


PAGES: dict[str, Page] = {
    p.path: p
    for p in (
        Page(
            "/",
            "Overview",
            ("steps", "mfu", "throughput", "health", "ranks"),
            ("summary", "problems", "findings"),
            update_overview,
            "Findings ranked by the time they cost, step time, MFU, throughput and loss over steps, and which ranks are live.",
        ),
        Page(
            "/stragglers",
            "Stragglers",
            ("compute", "wait", "distribution", "rank"),
            ("named",),
            update_stragglers,
            "Compute and wait time of every rank in every step. Click a cell or a point to select that rank on every page.",
        ),
        Page(
            "/communication",
            "Communication",
            ("collectives", "bandwidth", "wait", "groups"),
            ("summary", "links", "nccl"),
            update_comms,
            "Collective durations and bandwidth by op and size, how long each rank waits for its peers, process "
            "groups slower than their peers and what they share, and NCCL's own view (transport, version, GDR).",
        ),
        Page(
            "/memory",
            "Memory",
            ("timeline", "per_rank", "categories"),
            ("summary",),
            update_memory,
            "Memory at the end of each step over all ranks, the selected rank's allocated and reserved, OOMs, "
            "and where it went: parameters, gradients, optimizer state and activations per step and per rank.",
        ),
        Page(
            "/telemetry",
            "GPU telemetry",
            ("timeline", "gpus"),
            ("summary",),
            update_telemetry,
            "Utilisation, clocks, power, temperature and throttling of every GPU over time.",
        ),
        Page(
            "/pipeline",
            "Pipeline",
            ("gantt", "bubbles"),
            ("body",),
            update_pipeline,
            "One step of the pipeline schedule per stage, and how long each stage idles in warm-up, steady state and cool-down.",
        ),
        Page(
            "/triage",
            "Triage",
            (),
            ("body",),
            update_triage,
            "For a hung or dead job: the verdict of diag triage and the state of each rank.",
            controls=live_pull.controls,
            register=live_pull.register,
        ),
        Page(
            "/compare",
            "Compare",
            compare_page.GRAPHS,
            compare_page.TEXTS,
            compare_page.update_compare,
            compare_page.INTRO,
            controls=compare_page.controls,
            register=compare_page.register,
            state=compare_page.state_key,
        ),
    )
}


def prepare(snap: d.Snapshot) -> None:
    """Compute every page's aggregations into the snapshot's memo (on the poll thread, before publication),
    so that a page's callback only draws. A page that fails here fails again, visibly, in its callback."""
    for page in PAGES.values():
        with contextlib.suppress(Exception):
            page.update(snap, None)
    with contextlib.suppress(Exception):
        d.group_options(snap)  # the rank groups and their labels
