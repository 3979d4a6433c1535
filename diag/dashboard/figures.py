"""Plotly figures of the dashboard, built from analysis results and the aggregations in ``data.py``.

Every figure is bounded in size whatever the run's: rank x step matrices are reduced to rank groups and step
windows, series over steps or time to fleet bands, and arrays are sent as float32. Points that stand for one
rank carry it in ``customdata`` so a click selects that rank on every page.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from diag.dashboard.data import FINISHED, LIVE, NO_DATA, STALE, Matrix
from diag.views.format import BYTES_PER_GIB, pct

HEIGHT_PX = 340
SELECTED_COLOR = "#d62728"
STRAGGLER_COLOR = "#ff7f0e"
FLEET_COLOR = "#1f77b4"
# A white look set by hand: plotly's "plotly_white" template costs ~40 ms of validation per figure.
_AXIS = {"gridcolor": "#e5e5e5", "zerolinecolor": "#cccccc", "linecolor": "#cccccc"}
PLAIN_STYLE = {"plot_bgcolor": "white", "paper_bgcolor": "white", "xaxis": _AXIS, "yaxis": _AXIS}
STATE_COLORS = {LIVE: "#2ca02c", FINISHED: "#1f77b4", STALE: "#d62728", NO_DATA: "#7f7f7f"}


def _f32(values) -> np.ndarray:
    return np.asarray(values, dtype="float32")


def _ranks(values) -> list:
    """customdata of rank ids as a plain list: dcc.Graph reads clickData's customdata from the figure's own
    arrays and cannot index the base64 form plotly sends numpy arrays in."""
    return np.asarray(values).tolist()


def _base(title: str, x_title: str = "", y_title: str = "", height_px: int = HEIGHT_PX) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(
        title={"text": title, "x": 0.01, "font": {"size": 14}},
        height=height_px,
        margin={"l": 60, "r": 20, "t": 40, "b": 45},
        xaxis_title=x_title,
        yaxis_title=y_title,
        uirevision="keep",  # live updates keep the user's zoom
        legend={"orientation": "h", "y": -0.22},
        **PLAIN_STYLE,
    )
    return fig


def message_figure(title: str, message: str) -> go.Figure:
    """An empty figure that says why there is nothing to draw."""
    fig = _base(title)
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper", font={"size": 13})
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig


def blank_figure() -> go.Figure:
    """A figure with nothing in it, drawn as a thin white band: where the page says once, in its text, why
    there is nothing to draw, rather than every figure repeating it."""
    fig = go.Figure()
    fig.update_layout(height=10, margin={"l": 0, "r": 0, "t": 0, "b": 0}, **PLAIN_STYLE)
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig


# -- overview ---------------------------------------------------------------------------------------------
def step_time_figure(per_step: pd.DataFrame, selected: pd.DataFrame) -> go.Figure:
    """Iteration time per step: the median rank's and the slowest rank's, and the selected rank's."""
    if per_step.empty:
        return message_figure("Step time", "no complete steps yet")
    fig = _base("Step time", "step", "ms")
    fig.add_scatter(
        x=per_step["step"].to_numpy(),
        y=_f32(per_step["iteration_median_ms"]),
        name="median rank",
        line={"color": FLEET_COLOR},
    )
    fig.add_scatter(
        x=per_step["step"].to_numpy(),
        y=_f32(per_step["iteration_max_ms"]),
        name="slowest rank",
        line={"color": STRAGGLER_COLOR},
        customdata=_ranks(per_step["slowest_rank"].to_numpy()),
        hovertemplate="step %{x}: %{y:.1f} ms (rank %{customdata})<extra></extra>",
    )
    _add_selected_line(fig, selected, "step", "iteration_us", 1e-3)
    return fig


def mfu_figure(per_step: pd.DataFrame, reason: str | None) -> go.Figure:
    if per_step.empty:
        return message_figure("MFU", f"MFU unknown: {reason}" if reason else "MFU unknown")
    fig = _base("MFU per step", "step", "MFU %")
    fig.add_scatter(
        x=per_step["step"].to_numpy(), y=_f32(100 * per_step["mfu"]), name="MFU", line={"color": FLEET_COLOR}
    )
    return fig


def throughput_figure(tp: pd.DataFrame) -> go.Figure:
    for column, label in (("tokens_per_s", "tokens/s"), ("samples_per_s", "samples/s")):
        if column in tp and tp[column].notna().any():
            fig = _base("Throughput", "step", label)
            fig.add_scatter(x=tp["step"].to_numpy(), y=_f32(tp[column]), name=label, line={"color": FLEET_COLOR})
            return fig
    return message_figure("Throughput", "no tokens or samples recorded per step")


def health_figure(per_step: pd.DataFrame, note: str | None) -> go.Figure:
    """The loss and gradient norm over steps (medians over ranks), as diag.record gave them."""
    if per_step.empty:
        return message_figure("Loss", note or "no loss recorded (diag.record)")
    fig = _base("Loss and gradient norm (median over ranks)", "step", "value")
    for column, label, color in (
        ("loss_median", "loss", FLEET_COLOR),
        ("grad_norm_median", "grad norm", STRAGGLER_COLOR),
    ):
        if column in per_step and per_step[column].notna().any():
            fig.add_scatter(x=per_step["step"].to_numpy(), y=_f32(per_step[column]), name=label, line={"color": color})
    return fig


def rank_state_figure(states: pd.DataFrame, selected_rank: int | None) -> go.Figure:
    """Every rank as one cell of a square grid, coloured by live / stale / finished / no data."""
    if states is None or states.empty:
        return message_figure("Ranks", "no ranks found")
    n = len(states)
    cols = int(np.ceil(np.sqrt(n)))
    rows = int(np.ceil(n / cols))
    order = list(STATE_COLORS)
    code = np.full(rows * cols, np.nan)
    code[:n] = [order.index(s) for s in states["state"]]
    rank = np.full(rows * cols, -1)
    rank[:n] = states["rank"].to_numpy()
    colorscale = []
    for i, state in enumerate(order):
        colorscale += [[i / len(order), STATE_COLORS[state]], [(i + 1) / len(order), STATE_COLORS[state]]]
    counts = states["state"].value_counts()
    title = "Ranks: " + ", ".join(f"{counts.get(s, 0)} {s}" for s in order if counts.get(s, 0))
    fig = _base(title, "", "", height_px=HEIGHT_PX)
    fig.add_heatmap(
        z=code.reshape(rows, cols),
        customdata=_ranks(rank.reshape(rows, cols)),
        zmin=0,
        zmax=len(order),
        colorscale=colorscale,
        showscale=False,
        xgap=1,
        ygap=1,
        hovertemplate="rank %{customdata}<extra></extra>",
    )
    if selected_rank is not None and selected_rank in set(states["rank"]):
        i = int(np.flatnonzero(states["rank"].to_numpy() == selected_rank)[0])
        fig.add_shape(
            type="rect",
            x0=i % cols - 0.5,
            x1=i % cols + 0.5,
            y0=i // cols - 0.5,
            y1=i // cols + 0.5,
            line={"color": "black", "width": 3},
        )
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False, autorange="reversed")
    for state in order:  # legend entries for the colours
        fig.add_scatter(
            x=[None], y=[None], mode="markers", marker={"color": STATE_COLORS[state], "symbol": "square"}, name=state
        )
    return fig


# -- stragglers ---------------------------------------------------------------------------------------------
def heatmap_figure(
    matrix: Matrix, title: str, stragglers: list, selected_rank: int | None, zmax_ms: float | None = None
) -> dict:
    """Rank group x step window, each cell the largest value (ms) in it. Straggler rows are labelled.

    Returned as a plain dict: the per-cell ranks (customdata) are added after plotly's validation, which
    checks a nested list element by element (~0.5 s for 256 x 250 cells)."""
    z_ms = matrix.values / 1e3
    grouped = len(matrix.row_first_rank) and (matrix.row_last_rank != matrix.row_first_rank).any()
    windowed = len(matrix.col_first_step) and (matrix.col_last_step != matrix.col_first_step).any()
    what = "ranks %{y}.. " if grouped else "rank %{y} "
    fig = _base(
        title + (" (max per rank group and step window)" if grouped or windowed else ""), "step", "rank", height_px=420
    )
    fig.add_heatmap(
        z=_f32(z_ms),
        x=matrix.col_first_step,
        y=matrix.row_first_rank,
        colorscale="Viridis",
        zmin=0,
        zmax=zmax_ms,
        colorbar={"title": "ms", "x": 1.16},
        hovertemplate=what + "step %{x}: %{z:.1f} ms (rank %{customdata})<extra></extra>",
    )
    for s in stragglers:
        y = _row_of(matrix, s.rank)
        if y is not None:
            fig.add_annotation(
                x=1.005,
                xref="paper",
                xanchor="left",
                y=y,
                text=f"◀ rank {s.rank} ({s.cause})",
                showarrow=False,
                font={"color": STRAGGLER_COLOR, "size": 11},
            )
    y = _row_of(matrix, selected_rank)
    if y is not None:
        fig.add_hline(y=y, line={"color": SELECTED_COLOR, "width": 1, "dash": "dot"})
    fig.update_layout(margin={"r": 190})
    _rank_ticks(fig, matrix.row_first_rank, axis="y")
    out = fig.to_plotly_json()
    out["data"][0]["customdata"] = _ranks(matrix.argmax_rank)
    return out


def _row_of(matrix: Matrix, rank: int | None):
    if rank is None:
        return None
    inside = np.flatnonzero((matrix.row_first_rank <= rank) & (matrix.row_last_rank >= rank))
    return None if not len(inside) else matrix.row_first_rank[inside[0]]


def rank_distribution_figure(
    q: pd.DataFrame, title: str, straggler_ranks: set[int], selected_rank: int | None
) -> go.Figure:
    """Each rank's median over its steps, with whiskers from its 5th to its 95th percentile."""
    if q.empty:
        return message_figure(title, "no steps recorded")
    fig = _base(title, "rank", "ms")
    p50 = q["p50"].to_numpy() / 1e3
    colors = np.where(q["rank"].isin(straggler_ranks), STRAGGLER_COLOR, FLEET_COLOR)
    fig.add_scatter(
        x=q["rank"].to_numpy(),
        y=_f32(p50),
        mode="markers",
        name="median (p5..p95)",
        customdata=_ranks(q["rank"].to_numpy()),
        marker={"color": colors, "size": 6 if len(q) < 200 else 4},
        error_y={
            "type": "data",
            "array": _f32(q["p95"] / 1e3 - p50),
            "arrayminus": _f32(p50 - q["p5"] / 1e3),
            "thickness": 1,
            "width": 0,
        },
        hovertemplate="rank %{x}: median %{y:.1f} ms<extra></extra>",
    )
    _add_selected_marker(fig, q.rename(columns={"p50": "value"}).assign(value=p50), selected_rank)
    _rank_ticks(fig, q["rank"])
    return fig


def rank_vs_median_figure(median: pd.DataFrame, mine: pd.DataFrame, rank: int | None) -> go.Figure:
    """The selected rank's compute and wait per step (``mine``) against the median rank's (``median``,
    indexed by step)."""
    title = "Selected rank vs the median rank"
    if rank is None:
        return message_figure(
            title, "click a rank in any figure (or type one above) to compare it with the median rank"
        )
    if mine.empty:
        return message_figure(title, f"rank {rank} recorded no steps")
    fig = _base(f"Rank {rank} vs the median rank", "step", "ms")
    mine = mine.sort_values("step")
    for column, label, dash in (("compute_us", "compute", None), ("wait_us", "wait", "dot")):
        fig.add_scatter(
            x=median.index.to_numpy(),
            y=_f32(median[column] / 1e3),
            name=f"median {label}",
            line={"color": FLEET_COLOR, "dash": dash},
        )
        fig.add_scatter(
            x=mine["step"].to_numpy(),
            y=_f32(mine[column] / 1e3),
            name=f"rank {rank} {label}",
            line={"color": SELECTED_COLOR, "dash": dash},
        )
    return fig


# -- communication ------------------------------------------------------------------------------------------
def collectives_figure(collectives: list) -> go.Figure:
    """Duration (p50 and p99 over ranks) and transfer time per op, process group and size bucket."""
    collectives = [c for c in collectives if c.duration_p50_us is not None]  # the others have issue times only
    if not collectives:
        return message_figure("Collectives", "no collective with a recorded duration")
    labels = [f"{c.op} {c.size_bucket} pg{c.pg}" for c in collectives]
    fig = _base("Collective duration by op and size", "", "µs")
    fig.add_bar(x=labels, y=_f32([c.transfer_p50_us for c in collectives]), name="transfer p50 (last arrival)")
    fig.add_bar(x=labels, y=_f32([c.duration_p50_us for c in collectives]), name="duration p50 (incl. waiting)")
    fig.add_bar(x=labels, y=_f32([c.duration_p99_us for c in collectives]), name="duration p99")
    fig.update_layout(barmode="group")
    return fig


def bandwidth_figure(collectives: list) -> go.Figure:
    with_bw = [c for c in collectives if c.busbw_gbps is not None]
    if not with_bw:
        return message_figure("Bandwidth", "no collective with a measurable transfer time")
    fig = _base("Bus bandwidth by op and size (nccl-tests busbw)", "", "GB/s")
    fig.add_bar(
        x=[f"{c.op} {c.size_bucket} pg{c.pg}" for c in with_bw], y=_f32([c.busbw_gbps for c in with_bw]), name="busbw"
    )
    fig.add_bar(
        x=[f"{c.op} {c.size_bucket} pg{c.pg}" for c in with_bw], y=_f32([c.algbw_gbps for c in with_bw]), name="algbw"
    )
    fig.update_layout(barmode="group")
    return fig


def group_speed_figure(links) -> go.Figure:
    """Per process group: its busbw over its peers' (1 = as fast), the slow ones in red, the 0.6 threshold."""
    if links is None or not links.groups:
        return message_figure("Process groups", "fewer than two process groups with comparable collectives")
    groups = sorted(links.groups, key=lambda g: g.speed_ratio)
    fig = _base("Process groups: busbw over their peers' (same op, size, group size)", "process group", "ratio")
    fig.add_bar(
        x=[f"pg {g.pg}" for g in groups],
        y=_f32([g.speed_ratio for g in groups]),
        marker={"color": ["#d62728" if g.slow else "#1f77b4" for g in groups]},
        hovertext=[f"ranks {g.ranks}, hosts {g.hosts}, busbw {g.busbw_gbps:.3g} GB/s" for g in groups],
        name="speed",
    )
    fig.add_hline(y=0.6, line_dash="dot", annotation_text="slow below 0.6")
    return fig


def comm_wait_figure(per_rank: list, selected_rank: int | None) -> go.Figure:
    """Per rank: share of its step time waiting for peers in collectives, and blocked in communication."""
    if not per_rank:
        return message_figure("Wait per rank", "no steps recorded")
    frame = pd.DataFrame(
        [
            {"rank": r.rank, "wait": r.wait_share_pct, "blocked": r.blocked_share_pct, "last": r.last_arrival_fraction}
            for r in per_rank
        ]
    )
    fig = _base("Communication wait per rank", "rank", "% of step time")
    small = len(frame) < 200
    fig.add_scatter(
        x=frame["rank"].to_numpy(),
        y=_f32(frame["blocked"]),
        mode="markers",
        name="blocked in communication",
        customdata=_ranks(frame["rank"].to_numpy()),
        marker={"size": 6 if small else 3},
    )
    fig.add_scatter(
        x=frame["rank"].to_numpy(),
        y=_f32(frame["wait"]),
        mode="markers",
        name="waiting for the last rank",
        customdata=_ranks(frame["rank"].to_numpy()),
        marker={"size": 6 if small else 3},
        text=[f"arrived last at {pct(v, 0)}" for v in frame["last"]],
        hovertemplate="rank %{x}: %{y:.1f}% waiting, %{text}<extra></extra>",
    )
    _add_selected_marker(fig, frame.rename(columns={"blocked": "value"}), selected_rank)
    _rank_ticks(fig, frame["rank"])
    return fig


# -- memory -------------------------------------------------------------------------------------------------
def memory_figure(
    band: pd.DataFrame, metric: str, selected: pd.DataFrame, reserved_selected: pd.DataFrame, ooms: pd.DataFrame
) -> go.Figure:
    """Memory in use at each step's end: the fleet's min..max band and median, the selected rank's
    allocated and reserved, and OOM markers."""
    title = (
        "CUDA memory allocated"
        if metric == "allocated_bytes"
        else "Process memory (RSS; no CUDA allocator on this run)"
    )
    if band.empty:
        return message_figure(title, "no memory readings recorded")
    fig = _base(title, "step", "GiB")
    x = band["x"].to_numpy()
    fig.add_scatter(
        x=x,
        y=_f32(band["max"] / BYTES_PER_GIB),
        name="max over ranks",
        line={"width": 0},
        showlegend=False,
        hoverinfo="skip",
    )
    fig.add_scatter(
        x=x,
        y=_f32(band["min"] / BYTES_PER_GIB),
        name="min..max over ranks",
        fill="tonexty",
        line={"width": 0},
        fillcolor="rgba(31,119,180,0.2)",
    )
    fig.add_scatter(x=x, y=_f32(band["median"] / BYTES_PER_GIB), name="median rank", line={"color": FLEET_COLOR})
    if len(selected):
        rank = int(selected["rank"].iloc[0])
        fig.add_scatter(
            x=selected["step"].to_numpy(),
            y=_f32(selected[metric] / BYTES_PER_GIB),
            name=f"rank {rank}",
            line={"color": SELECTED_COLOR},
        )
        if len(reserved_selected) and reserved_selected["reserved_bytes"].notna().any():
            fig.add_scatter(
                x=reserved_selected["step"].to_numpy(),
                y=_f32(reserved_selected["reserved_bytes"].astype("float64") / BYTES_PER_GIB),
                name=f"rank {rank} reserved",
                line={"color": SELECTED_COLOR, "dash": "dot"},
            )
    for step in sorted(set(ooms["step"]))[:50]:
        ranks = ooms.loc[ooms["step"] == step, "rank"].tolist()
        fig.add_vline(
            x=step,
            line={"color": "black", "dash": "dash"},
            annotation_text=f"OOM rank {ranks[0]}" + (f" +{len(ranks) - 1}" if len(ranks) > 1 else ""),
        )
    return fig


def memory_per_rank_figure(per_rank: list, selected_rank: int | None) -> go.Figure:
    """Per rank: fragmentation (reserved but unallocated), headroom before OOM, and suspected leaks."""
    if not per_rank:
        return message_figure("Memory per rank", "no memory readings recorded")
    frame = pd.DataFrame(
        [
            {
                "rank": r.rank,
                "frag": r.fragmentation_pct,
                "headroom": r.headroom_pct,
                "leak": r.leak_suspected,
                "growth": r.growth_bytes_per_step,
            }
            for r in per_rank
        ]
    )
    fig = _base("Memory per rank", "rank", "%")
    small = len(frame) < 200
    if frame["frag"].notna().any():
        fig.add_scatter(
            x=frame["rank"].to_numpy(),
            y=_f32(frame["frag"]),
            mode="markers",
            name="fragmentation %",
            customdata=_ranks(frame["rank"].to_numpy()),
            marker={"size": 6 if small else 3},
        )
    if frame["headroom"].notna().any():
        fig.add_scatter(
            x=frame["rank"].to_numpy(),
            y=_f32(frame["headroom"]),
            mode="markers",
            name="headroom before OOM %",
            customdata=_ranks(frame["rank"].to_numpy()),
            marker={"size": 6 if small else 3},
        )
    leaks = frame[frame["leak"]]
    if len(leaks):
        fig.add_scatter(
            x=leaks["rank"].to_numpy(),
            y=np.zeros(len(leaks), dtype="float32"),
            mode="markers+text",
            name="leak suspected",
            text=[f"leak rank {r}" for r in leaks["rank"]],
            textposition="top center",
            customdata=_ranks(leaks["rank"].to_numpy()),
            marker={"color": STRAGGLER_COLOR, "size": 10, "symbol": "triangle-up"},
        )
    if len(fig.data) == 0:
        return message_figure(
            "Memory per rank", "no CUDA allocator statistics on this run (CPU): fragmentation and headroom unknown"
        )
    _rank_ticks(fig, frame["rank"])
    return fig


CATEGORY_TRACES = (  # (series column, label, colour)
    ("param_bytes", "parameters", "#1f77b4"),
    ("grad_bytes", "gradients", "#ff7f0e"),
    ("optimizer_state_bytes", "optimizer state", "#2ca02c"),
    ("activation_bytes", "activations and temporaries", "#9467bd"),
)
MAX_CATEGORY_RANKS = 64


def memory_categories_figure(series: pd.DataFrame, per_rank: list, rank: int | None) -> go.Figure:
    """Where the memory went: one rank's categories stacked per step (the selected rank, else the one holding
    most), and every rank's latest stacked side by side (the spread; the 64 holding most on large runs)."""
    title = "Memory by category"
    known = [r for r in per_rank if r.param_bytes is not None]
    if series.empty or not known:
        return message_figure(title, "no categories recorded (diag.instrument(model, optimizer) records them)")
    held = {r.rank: (r.param_bytes or 0) + (r.grad_bytes or 0) + (r.optimizer_state_bytes or 0) for r in known}
    shown = rank if rank in held else max(held, key=held.get)
    one = series[series["rank"] == shown].sort_values("step")
    top = sorted(known, key=lambda r: held[r.rank], reverse=True)[:MAX_CATEGORY_RANKS]
    top.sort(key=lambda r: r.rank)
    fig = make_subplots(rows=1, cols=2, column_widths=[0.6, 0.4], subplot_titles=(f"rank {shown} per step", "per rank"))
    for name, label, color in CATEGORY_TRACES:
        values = one[name].astype("float64")
        if values.notna().any():
            fig.add_scatter(
                x=one["step"].to_numpy(),
                y=_f32(values.fillna(0) / BYTES_PER_GIB),
                name=label,
                stackgroup="one",
                legendgroup=label,
                line={"width": 0.5, "color": color},
                row=1,
                col=1,
            )
        column = "activation_peak_bytes" if name == "activation_bytes" else name
        bars = [getattr(r, column) for r in top]
        if any(v is not None for v in bars):
            fig.add_bar(
                x=[r.rank for r in top],
                y=_f32([(v or 0) / BYTES_PER_GIB for v in bars]),
                name=label,
                legendgroup=label,
                showlegend=False,
                customdata=_ranks([r.rank for r in top]),
                marker={"color": color},
                row=1,
                col=2,
            )
    outside = [r.non_pytorch_bytes for r in top]
    if any(v is not None for v in outside):  # NVML's memory of the process beyond PyTorch's reservation
        fig.add_bar(
            x=[r.rank for r in top],
            y=_f32([(v or 0) / BYTES_PER_GIB for v in outside]),
            name="outside PyTorch",
            customdata=_ranks([r.rank for r in top]),
            marker={"color": "#7f7f7f"},
            row=1,
            col=2,
        )
    fig.update_layout(
        barmode="stack",
        title={"text": title, "x": 0.01, "font": {"size": 14}},
        height=HEIGHT_PX,
        margin={"l": 60, "r": 20, "t": 50, "b": 45},
        uirevision="keep",
        legend={"orientation": "h", "y": -0.22},
        **PLAIN_STYLE,
    )
    fig.update_yaxes(title_text="GiB", row=1, col=1)
    _rank_ticks(fig, [r.rank for r in top], row=1, col=2)
    return fig


# -- telemetry ----------------------------------------------------------------------------------------------
TELEMETRY_PANELS = (
    ("util_pct", "utilisation %"),
    ("sm_clock_mhz", "SM clock MHz"),
    ("power_w", "power W"),
    ("temp_c", "temperature °C"),
    ("throttled", "throttled (0/1)"),
)


def telemetry_figure(bands: dict[str, pd.DataFrame], selected: pd.DataFrame, rank: int | None) -> go.Figure:
    """One panel per metric over time (s since the first sample): fleet band, median, and the selected GPU."""
    if all(b.empty for b in bands.values()):
        return message_figure("GPU telemetry", "no GPU telemetry (CPU run, or NVML unavailable)")
    fig = make_subplots(
        rows=len(TELEMETRY_PANELS),
        cols=1,
        shared_xaxes=True,
        subplot_titles=[t for _, t in TELEMETRY_PANELS],
        vertical_spacing=0.04,
    )
    for i, (column, _) in enumerate(TELEMETRY_PANELS, start=1):
        band = bands[column]
        if band.empty:
            continue
        x = _f32(band["x"])
        fig.add_scatter(x=x, y=_f32(band["max"]), line={"width": 0}, showlegend=False, hoverinfo="skip", row=i, col=1)
        fig.add_scatter(
            x=x,
            y=_f32(band["min"]),
            fill="tonexty",
            line={"width": 0},
            fillcolor="rgba(31,119,180,0.2)",
            name="min..max over GPUs",
            showlegend=i == 1,
            row=i,
            col=1,
        )
        fig.add_scatter(
            x=x, y=_f32(band["median"]), line={"color": FLEET_COLOR}, name="median GPU", showlegend=i == 1, row=i, col=1
        )
        if len(selected) and column in selected:
            fig.add_scatter(
                x=_f32(selected["t_s"]),
                y=_f32(selected[column]),
                line={"color": SELECTED_COLOR},
                name=f"rank {rank}'s GPU",
                showlegend=i == 1,
                row=i,
                col=1,
            )
    fig.update_layout(
        height=200 * len(TELEMETRY_PANELS),
        margin={"l": 60, "r": 20, "t": 40, "b": 40},
        uirevision="keep",
        plot_bgcolor="white",
        title={"text": "GPU telemetry over time", "x": 0.01, "font": {"size": 14}},
        legend={"orientation": "h", "x": 0.35, "y": 1.06, "yanchor": "bottom"},
    )
    fig.update_xaxes(**_AXIS)
    fig.update_yaxes(**_AXIS)
    fig.update_xaxes(title_text="s since the first sample", row=len(TELEMETRY_PANELS), col=1)
    return fig


def gpu_summary_figure(gpus: list, selected_rank: int | None) -> go.Figure:
    """Per GPU: mean SM clock as a share of its max; throttled GPUs in orange with their reasons."""
    if not gpus:
        return message_figure("GPUs", "no GPU telemetry (CPU run, or NVML unavailable)")
    frame = pd.DataFrame(
        [
            {
                "rank": g.rank,
                "value": g.sm_clock_vs_max_pct,
                "temp": g.temp_max_c,
                "throttled": g.throttled,
                "reasons": ", ".join(sorted(g.throttle_share)) or "none",
            }
            for g in gpus
        ]
    )
    fig = _base("SM clock vs max per GPU (orange: throttled)", "rank", "% of max SM clock")
    fig.add_scatter(
        x=frame["rank"].to_numpy(),
        y=_f32(frame["value"]),
        mode="markers",
        name="GPUs",
        customdata=_ranks(frame["rank"].to_numpy()),
        marker={
            "color": np.where(frame["throttled"], STRAGGLER_COLOR, FLEET_COLOR),
            "size": 6 if len(frame) < 200 else 4,
        },
        text=[
            f"max {t:.0f} °C, reasons: {r}" if t == t and t is not None else f"reasons: {r}"
            for t, r in zip(frame["temp"], frame["reasons"], strict=True)
        ],
        hovertemplate="rank %{x}: %{y:.0f}% of max clock, %{text}<extra></extra>",
    )
    _add_selected_marker(fig, frame, selected_rank)
    _rank_ticks(fig, frame["rank"])
    return fig


# -- pipeline -----------------------------------------------------------------------------------------------
def bubble_figure(report) -> go.Figure:
    """Per stage and step: busy time and idle time split into warm-up, steady and cool-down (a BubbleReport)."""
    fig = _base("Pipeline stages: busy and idle per step", "stage", "ms per step")
    stages = [f"stage {s.stage}" for s in report.per_stage]
    for attr, label, color in (
        ("busy_s", "busy", FLEET_COLOR),
        ("warmup_idle_s", "idle: warm-up", "#bbbbbb"),
        ("steady_idle_s", "idle: steady", STRAGGLER_COLOR),
        ("cooldown_idle_s", "idle: cool-down", "#888888"),
    ):
        fig.add_bar(
            x=stages, y=_f32([1e3 * getattr(s, attr) for s in report.per_stage]), name=label, marker_color=color
        )
    fig.update_layout(barmode="stack")
    for s in report.per_stage:
        fig.add_annotation(
            x=f"stage {s.stage}",
            y=1e3 * (s.busy_s + s.idle_s),
            text=f"{pct(s.bubble_fraction, 0)} idle",
            showarrow=False,
            yshift=10,
        )
    return fig


# -- shared -------------------------------------------------------------------------------------------------
MAX_RANK_TICKS = 32  # up to this many ranks on an axis, one tick per rank; beyond, plotly's (integer) spacing


def _rank_ticks(fig: go.Figure, ranks, axis: str = "x", **where) -> None:
    """A tick at each rank drawn, and nowhere else: plotly's own ticks on a few ranks fall between them
    (-0.5, 0.5) or on ranks that do not exist (-1 beside a single rank 0)."""
    ranks = sorted({int(r) for r in ranks})
    if 0 < len(ranks) <= MAX_RANK_TICKS:
        update = fig.update_xaxes if axis == "x" else fig.update_yaxes
        update(tickmode="array", tickvals=ranks, ticktext=[str(r) for r in ranks], **where)


def _add_selected_marker(fig: go.Figure, frame: pd.DataFrame, rank: int | None) -> None:
    if rank is None:
        return
    row = frame[frame["rank"] == rank]
    if len(row) and pd.notna(row["value"].iloc[0]):
        fig.add_scatter(
            x=[rank],
            y=[float(row["value"].iloc[0])],
            mode="markers",
            name=f"rank {rank} (selected)",
            customdata=[rank],
            marker={"color": SELECTED_COLOR, "size": 14, "symbol": "circle-open", "line": {"width": 3}},
        )


def _add_selected_line(fig: go.Figure, selected: pd.DataFrame, x: str, column: str, scale: float) -> None:
    if len(selected):
        rank = int(selected["rank"].iloc[0])
        fig.add_scatter(
            x=selected[x].to_numpy(),
            y=_f32(selected[column] * scale),
            name=f"rank {rank}",
            line={"color": SELECTED_COLOR, "width": 1},
        )
