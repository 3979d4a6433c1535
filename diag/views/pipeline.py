"""The pipeline timeline: stage x time for one step, a bar per forward/backward of each micro-batch.

Idle time is the grey bar behind each stage showing through. Kept small whatever the job's size: one step,
and one rank per stage (data-parallel replicas of the pipeline run the same schedule), so at most
stages x chunks x micro-batches x 3 bars. The rows come from ``diag.analysis.bubble.gantt_rows``.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from diag.analysis.bubble import gantt_rows

COLOURS = {
    "forward": "#4c78a8",
    "backward": "#f58518",
    "backward_input": "#e45756",
    "backward_weight": "#72b7b2",
}
IDLE_COLOUR = "#e5e5e5"


def gantt_figure(trace, step: int | None = None) -> go.Figure:
    return gantt_figure_from_rows(gantt_rows(trace, step))


def gantt_figure_from_rows(rows: pd.DataFrame) -> go.Figure:
    """The timeline from ``gantt_rows`` (or a Report's ``pipeline_timeline`` as a DataFrame)."""
    figure = go.Figure()
    if rows.empty:
        figure.update_layout(title="Pipeline timeline: no micro-batches recorded")
        return figure
    first_rank = rows.groupby("stage")["rank"].min()
    rows = rows[rows["rank"].to_numpy() == first_rank.reindex(rows["stage"]).to_numpy()]
    rows = rows.assign(label=[f"stage {s} (rank {r})" for s, r in zip(rows["stage"], rows["rank"])])
    order = sorted(set(rows["label"]), key=lambda label: int(label.split()[1]))
    span_ms = float((rows["start_ms"] + rows["duration_ms"]).max())
    figure.add_trace(
        go.Bar(
            y=order,
            x=[span_ms] * len(order),
            base=[0.0] * len(order),
            orientation="h",
            marker_color=IDLE_COLOUR,
            name="idle",
            hoverinfo="skip",
        )
    )
    for action, colour in COLOURS.items():
        part = rows[rows["action"] == action]
        if part.empty:
            continue
        figure.add_trace(
            go.Bar(
                y=part["label"],
                x=part["duration_ms"],
                base=part["start_ms"],
                orientation="h",
                marker_color=colour,
                name=action,
                text=[
                    f"{mb}" if chunk == stage else f"{mb}/c{chunk}"
                    for mb, chunk, stage in zip(part["microbatch"], part["virtual_stage"], part["stage"])
                ],
                textposition="inside",
                customdata=part[["microbatch", "virtual_stage"]].to_numpy(),
                hovertemplate=action + " micro-batch %{customdata[0]} (chunk %{customdata[1]}): "
                "%{base:.1f} ms + %{x:.1f} ms<extra></extra>",
            )
        )
    figure.update_layout(
        title="Pipeline timeline (one step; grey: idle)",
        barmode="overlay",
        xaxis_title="ms since the step's first action",
        yaxis={"categoryorder": "array", "categoryarray": order[::-1]},
        height=120 + 40 * len(order),
        legend={"orientation": "h"},
    )
    return figure
