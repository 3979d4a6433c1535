"""One self-contained HTML file: the markdown report's sections plus plotly figures, plotly.js inlined so it
reads offline. Figures draw the Report's own series; nothing is computed here."""

from __future__ import annotations

import html

from diag.views.format import BYTES_PER_MIB
from diag.views.text import blocks


def render_html(report) -> str:
    """The text's blocks, then each section's figures in the registry's order (report.SECTIONS)."""
    import plotly.graph_objects as go  # only the HTML view needs plotly

    from diag.analysis.report import SECTIONS

    drawn = (draw(go, report) for s in SECTIONS for draw in SECTION_FIGURES.get(s.name, ()))
    figures = [f for f in drawn if f is not None]
    title = f"diag analyze: {report.run.path}"
    return html_page(title, blocks(report), figures, figure_height_px=380)


def html_page(title: str, page_blocks: list, figures: list, figure_height_px: int) -> str:
    """One self-contained page: the text blocks as sections, then the figures (plotly.js embedded once)."""
    parts = []
    for i, fig in enumerate(figures):
        fig.update_layout(height=figure_height_px, margin={"l": 60, "r": 20, "t": 50, "b": 50})
        parts.append(fig.to_html(full_html=False, include_plotlyjs=i == 0, config={"displaylogo": False}))
    sections = "\n".join(_section(b) for b in page_blocks)
    title = html.escape(title)
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{title}</title>
<style>body{{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em}}
table{{border-collapse:collapse;font-size:13px}}td,th{{border:1px solid #ccc;padding:3px 6px;text-align:left}}
pre{{white-space:pre-wrap}}</style></head>
<body><h1>{title}</h1>
{sections}
<h2>Figures</h2>
{"".join(parts) if parts else "<p>No data to plot.</p>"}
</body></html>
"""


def _section(block) -> str:
    out = [f"<h2>{html.escape(block.heading)}</h2>"]
    if block.lines:
        out.append("<pre>" + html.escape("\n".join(block.lines)) + "</pre>")
    if block.table:
        head = "".join(f"<th>{html.escape(c)}</th>" for c in block.table[0])
        rows = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in block.table[1:])
        out.append(f"<table><tr>{head}</tr>{rows}</table>")
    return "\n".join(out)


def _pipeline_figure(go, report):
    if not report.pipeline_timeline:
        return None
    import pandas as pd

    from diag.views.pipeline import gantt_figure_from_rows

    return gantt_figure_from_rows(pd.DataFrame(report.pipeline_timeline))


def _gpu_time_figure(go, report):
    g = getattr(report, "gpu_time", None)
    if g is None or not g.per_rank:
        return None
    ranks = [f"rank {r.rank}" for r in g.per_rank]
    fig = go.Figure()
    for name, attr in (
        ("compute", "compute_us"),
        ("exposed communication", "exposed_communication_us"),
        ("memory", "memory_us"),
        ("other", "other_us"),
        ("idle", "idle_us"),
    ):
        fig.add_trace(go.Bar(x=ranks, y=[getattr(r, attr) / 1e3 for r in g.per_rank], name=name))
    fig.update_layout(barmode="stack", title="GPU time per rank (torch.profiler trace)", yaxis_title="ms")
    return fig


def _step_figure(go, report):
    steps = report.timeline.per_step
    if not steps:
        return None
    x = [s["step"] for s in steps]
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=x, y=[s["iteration_median_ms"] for s in steps], name="iteration (median rank)"))
    fig.add_trace(go.Scatter(x=x, y=[s["busy_median_ms"] for s in steps], name="work, median rank"))
    fig.add_trace(
        go.Scatter(
            x=x,
            y=[s["busy_max_ms"] for s in steps],
            name="work, slowest rank",
            text=[f"rank {s['slowest_rank']}" for s in steps],
        )
    )
    fig.update_layout(title="Step time and work per step", xaxis_title="step", yaxis_title="ms")
    return fig


def _rank_figure(go, report):
    ranks = report.timeline.per_rank
    if not ranks:
        return None
    x = [r["rank"] for r in ranks]
    fig = go.Figure()
    for key, name in (
        ("compute_ms", "compute"),
        ("data_wait_ms", "data wait"),
        ("comm_wait_ms", "blocked in communication"),
    ):
        fig.add_trace(go.Bar(x=x, y=[r[key] for r in ranks], name=name))
    fig.update_layout(
        barmode="stack",
        title="Median step per rank: compute, data wait, communication",
        xaxis_title="rank",
        yaxis_title="ms",
    )
    return fig


def _mfu_figure(go, report):
    per_step = report.mfu.per_step
    if not per_step:
        return None
    fig = go.Figure(go.Scatter(x=[p["step"] for p in per_step], y=[100 * p["mfu"] for p in per_step], name="MFU"))
    fig.update_layout(title="MFU per step", xaxis_title="step", yaxis_title="% of peak")
    return fig


def _comms_figure(go, report):
    colls = report.comms.collectives[:15]
    if not colls:
        return None
    labels = [f"{c.op} {c.pg} {c.size_bucket}" for c in colls]
    fig = go.Figure()
    fig.add_trace(
        go.Bar(
            x=labels,
            y=[max(c.total_time_s - c.wait_total_s, 0) if c.total_time_s is not None else 0 for c in colls],
            name="transfer",
        )
    )
    fig.add_trace(go.Bar(x=labels, y=[c.wait_total_s for c in colls], name="waiting for peers"))
    fig.update_layout(barmode="stack", title="Time in collectives (summed over ranks)", yaxis_title="s")
    return fig


def _memory_figure(go, report):
    ranks = report.memory.per_rank
    if not ranks:
        return None
    fig = go.Figure(
        go.Bar(
            x=[r.rank for r in ranks],
            y=[(r.growth_bytes_per_step or 0) / BYTES_PER_MIB for r in ranks],
            marker_color=["crimson" if r.leak_suspected else "steelblue" for r in ranks],
        )
    )
    fig.update_layout(
        title=f"Memory growth per step ({ranks[0].metric}); red: leak suspected",
        xaxis_title="rank",
        yaxis_title="MiB/step",
    )
    return fig


def _memory_categories_figure(go, report):
    """Per rank, stacked: parameters, gradients, optimizer state, activations (the largest step's), memory
    outside PyTorch; only for runs that recorded the categories."""
    ranks = [r for r in report.memory.per_rank if r.param_bytes is not None or r.non_pytorch_bytes is not None]
    if not ranks:
        return None
    fig = go.Figure()
    for name, label in (
        ("param_bytes", "parameters"),
        ("grad_bytes", "gradients"),
        ("optimizer_state_bytes", "optimizer state"),
        ("activation_peak_bytes", "activations and temporaries"),
        ("non_pytorch_bytes", "outside PyTorch"),
    ):
        values = [getattr(r, name) for r in ranks]
        if any(v is not None for v in values):
            fig.add_trace(go.Bar(x=[r.rank for r in ranks], y=[(v or 0) / BYTES_PER_MIB for v in values], name=label))
    fig.update_layout(barmode="stack", title="Memory by category per rank", xaxis_title="rank", yaxis_title="MiB")
    return fig


def _memory_deep_figure(go, report):
    """The deep mode's answer: live activations and temporaries at the peak by module, one bar per rank; only for
    runs that used it."""
    deep = [d for d in report.memory.deep if d.top_modules]
    if not deep:
        return None
    names = list(dict.fromkeys(m.module for d in deep for m in d.top_modules[:10]))[:15]
    fig = go.Figure()
    for d in deep[:8]:
        held = {m.module: m.total_bytes for m in d.top_modules}
        fig.add_trace(
            go.Bar(
                y=names,
                x=[held.get(n, 0) / BYTES_PER_MIB for n in names],
                orientation="h",
                name=f"rank {d.rank} (step {d.peak_step}, {d.phase})",
            )
        )
    fig.update_layout(
        barmode="group",
        title="At the memory peak (deep mode): live activations and temporaries by module",
        xaxis_title="MiB",
        yaxis={"autorange": "reversed"},
    )
    return fig


def _telemetry_figure(go, report):
    gpus = report.telemetry.gpus
    if not gpus:
        return None
    fig = go.Figure(
        go.Bar(
            x=[g.rank for g in gpus],
            y=[g.sm_clock_vs_max_pct for g in gpus],
            marker_color=["crimson" if g.throttled else "steelblue" for g in gpus],
        )
    )
    fig.update_layout(title="SM clock vs max per GPU (by rank); red: throttled", xaxis_title="rank", yaxis_title="%")
    return fig


# each section's figures, by its name in report.SECTIONS (a figure draws nothing where its series is empty)
SECTION_FIGURES = {
    "timeline": (_step_figure, _rank_figure),
    "mfu": (_mfu_figure,),
    "comms": (_comms_figure,),
    "memory": (_memory_figure, _memory_categories_figure, _memory_deep_figure),
    "telemetry": (_telemetry_figure,),
    "bubble": (_pipeline_figure,),
    "gpu_time": (_gpu_time_figure,),
}
