"""Renderings of a ``CompareReport`` (``diag.analysis.compare``): text, markdown, JSON and one self-contained
HTML file with figures. They format, never compute: every number comes from the report."""

from __future__ import annotations

import json

from diag.analysis.compare import machine_clause
from diag.views.format import ms_from_s
from diag.views.text import Block, blocks_to_markdown, blocks_to_text

TOP_ROWS = 12
WHOSE_STEADY = {False: "; the verdict's", True: ", all steps"}  # with repeats the verdict is the pairs'


def render_compare(report, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(report.to_dict(), indent=1, allow_nan=False)
    if fmt == "html":
        return render_compare_html(report)
    return render_markdown(report) if fmt == "markdown" else render_text(report)


def render_text(report) -> str:
    return blocks_to_text(blocks(report))


def render_markdown(report) -> str:
    return blocks_to_markdown(blocks(report), "diag compare")


# -- formatting ------------------------------------------------------------------------------------------------
def _ms(value_ms) -> str:
    return "-" if value_ms is None else f"{value_ms:.2f}"


def _signed_ms(value_ms) -> str:
    return "-" if value_ms is None else f"{value_ms:+.2f}"


def _pct(value) -> str:
    return "-" if value is None else f"{value:.0f}%"


def _signed_pct(value) -> str:
    return "-" if value is None else f"{value:+.1f}%"


def _ci(ci) -> str:
    return "-" if not ci else f"[{ci[0]:+.1f}%, {ci[1]:+.1f}%]"


def _bytes(nbytes) -> str:
    if nbytes is None:
        return "-"
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def _number(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        if value and (abs(value) >= 1e6 or abs(value) < 1e-2):
            return f"{value:.3g}"
        return f"{value:,.2f}".rstrip("0").rstrip(".")
    if isinstance(value, dict):
        return " ".join(f"{k}={_number(v)}" for k, v in value.items()) or "-"
    return str(value)


# -- blocks ----------------------------------------------------------------------------------------------------
def blocks(report) -> list[Block]:
    out = [_runs(report)]
    several = len(report.comparisons) > 1
    for c in report.comparisons:
        suffix = f": {c.base} -> {c.new}" if several else ""
        if c.config_differences:
            out.append(_config(c, suffix))
        out += [
            _verdict(c, suffix),
            _attribution(c, suffix),
            _metrics(c, suffix),
            _memory(c, suffix),
            _busbw(c, suffix),
            _findings(c, suffix),
            _stability(c, suffix),
        ]
    if report.scaling is not None:
        out.append(_scaling(report.scaling))
    return [b for b in out if b is not None]


def _runs(report) -> Block:
    block = Block("Runs")
    block.table = [["run", "ranks", "steps", "median step", "steady step (q10)", "waits in", "path"]]
    for r in report.runs:
        block.table.append(
            [
                r.label,
                str(r.world_size),
                str(r.steps_analysed),
                ms_from_s(r.step_s),
                ms_from_s(r.steady_step_s),
                (r.wait_phase or "-").replace("step_rest", "rest of body"),
                r.path,
            ]
        )
    block.lines.append(
        "waits in: the part of the step body whose time moves with the communication waits (taken out of it)"
    )
    return block


def _config(c, suffix: str) -> Block:
    block = Block(f"Configuration differences{suffix}")
    block.lines.append("these runs differ in configuration: the comparison below is across them")
    block.table = [["key", c.base, c.new]]
    block.table += [[d["key"], _number(d["base"]), _number(d["new"])] for d in c.config_differences]
    return block


def _verdict(c, suffix: str) -> Block:
    s = c.step_time
    block = Block(f"Verdict{suffix}")
    block.lines.append(c.summary)
    block.lines.append(
        f"median step: {ms_from_s(s.base_s)} -> {ms_from_s(s.new_s)}, {_signed_pct(s.change_pct)} "
        f"(95% interval {_ci(s.ci_pct)})"
    )
    block.lines.append(
        f"steady step (lower decile{WHOSE_STEADY[s.repeats is not None]}): {ms_from_s(s.steady_base_s)} -> "
        f"{ms_from_s(s.steady_new_s)}, {_signed_pct(s.steady_change_pct)} (95% interval {_ci(s.steady_ci_pct)})"
    )
    m = s.machine
    if m is not None:
        block.lines.append(
            f"machine: {machine_clause(m)}: {m.base_factor:.3g} -> {m.new_factor:.3g}; the step goes with it at a "
            f"share of {m.sensitivity:.2f} ({m.sensitivity_source})"
        )
        block.lines.append(
            f"the job's own change (the verdict's; {m.statistic} at the base run's machine speed): "
            f"{_signed_pct(m.own_change_pct)} (95% interval {_ci(m.own_ci_pct)})"
        )
    if s.repeats is not None:
        r = s.repeats
        block.lines.append(
            f"repeats (the verdict's): {r.pairs} pairs, steady change per pair "
            f"{', '.join(_signed_pct(x) for x in r.changes_pct)}; mean {_signed_pct(r.change_pct)} "
            f"(95% t interval {_ci(r.ci_pct)}); one run's level varies by {r.run_noise_pct:.1f}% between repeats"
        )
        block.lines.append(f"a change only when the pairs' whole interval lies beyond {s.threshold_pct:g}%")
    elif s.run_noise_source:  # empty: --interleaved without enough pairs (the note says so)
        floor = "-" if s.noise_floor_pct is None else f"{s.noise_floor_pct:.1f}%"
        drifts = " and ".join("-" if d is None else f"{d:.1f}%" for d in s.drift_pct)
        if m is not None and m.statistic.startswith("median of the intervals"):
            drifts = "the intervals' spread is in the interval instead"
        correction = (
            f", and the machine correction's uncertainty {m.correction_noise_pct:.1f}% (the share's, "
            f"{m.sensitivity_sd:.2f}, times how much the machines differed)"
            if m is not None
            else ""
        )
        block.lines.append(
            f"noise floor {floor}: run-to-run noise {s.run_noise_pct:.1f}% ({s.run_noise_source}), or a run's own "
            f"drift when larger ({drifts}: std over windows of its steps){correction}; a change under the floor is "
            "what runs of one job differ by"
        )
        block.lines.append(
            f"no change when the interval holds 0 or the change is under the floor or {s.threshold_pct:g}%; "
            f"{s.resamples} bootstrap resamples of {s.steps_base} and {s.steps_new} steps "
            f"(blocks of {s.block_steps[0]} and {s.block_steps[1]})"
        )
    block.lines += [f"note: {n}" for n in c.notes]
    return block


def _attribution(c, suffix: str) -> Block:
    block = Block(f"Where the time went{suffix}")
    if not c.attribution:
        block.lines.append("no steps to attribute")
        return block
    block.lines.append("ms per step, mean of the steps nearest each run's median; share of the median's change")
    block.table = [["component", "base", "new", "change", "share"]]
    shown = [a for a in c.attribution if max(abs(a.base_ms), abs(a.new_ms), abs(a.delta_ms)) >= 0.005]
    for a in shown[:TOP_ROWS]:
        block.table.append([a.label, _ms(a.base_ms), _ms(a.new_ms), _signed_ms(a.delta_ms), _pct(a.share_pct)])
    if len(c.attribution) > min(len(shown), TOP_ROWS):
        block.lines.append(f"({len(c.attribution) - min(len(shown), TOP_ROWS)} smaller rows in --format json)")
    groups = [g for g in c.groups if abs(g["delta_ms"]) >= 0.005]
    if groups:
        block.lines.append(
            "by group: "
            + ", ".join(
                f"{g['group']} {g['delta_ms']:+.2f} ms"
                + (f" ({g['share_pct']:.0f}%)" if g["share_pct"] is not None else "")
                for g in groups
            )
        )
    return block


METRIC_LABELS = {
    "mfu": ("MFU (median)", lambda v: "-" if v is None else f"{100 * v:.1f}%"),
    "tflops_per_gpu": ("TFLOP/s per GPU", lambda v: "-" if v is None else f"{v:.1f}"),
    "samples_per_s": ("samples/s", lambda v: "-" if v is None else f"{v:,.1f}"),
    "tokens_per_s": ("tokens/s", lambda v: "-" if v is None else f"{v:,.0f}"),
    "gpu_busy_pct": ("GPU busy share of the step", lambda v: "-" if v is None else f"{v:.1f}%"),
}


def _metrics(c, suffix: str) -> Block | None:
    if not c.metrics:
        return None
    block = Block(f"Throughput and MFU{suffix}")
    block.table = [["metric", "base", "new", "change"]]
    for name, m in c.metrics.items():
        label, fmt = METRIC_LABELS.get(name, (name, _number))
        block.table.append([label, fmt(m["base"]), fmt(m["new"]), _signed_pct(m["change_pct"])])
    return block


def _memory(c, suffix: str) -> Block:
    block = Block(f"Memory{suffix}")
    mem = c.memory
    rows = [
        ("peak allocated (CUDA)", "peak_allocated_bytes"),
        ("peak reserved (CUDA)", "peak_reserved_bytes"),
        ("peak RSS (host)", "peak_rss_bytes"),
        (
            f"spread between ranks ({'allocated' if mem.get('metric') == 'allocated_bytes' else 'RSS'})",
            "rank_spread_bytes",
        ),
    ]
    block.table = [["peak, largest rank", "base", "new", "change"]]
    for label, key in rows:
        m = mem.get(key) or {}
        if m.get("base") is None and m.get("new") is None:
            continue
        block.table.append([label, _bytes(m["base"]), _bytes(m["new"]), _signed_pct(m["change_pct"])])
    if len(block.table) == 1:
        block.table = None
        block.lines.append("no memory readings")
    return block


def _busbw(c, suffix: str) -> Block | None:
    if not c.busbw:
        return None
    block = Block(f"Collectives by size class{suffix}")
    block.table = [["op", "size", "calls base", "calls new", "busbw base GB/s", "busbw new GB/s", "change"]]
    for r in c.busbw[: 2 * TOP_ROWS]:
        block.table.append(
            [
                r["op"],
                r["size_class"],
                str(r["base_count"]),
                str(r["new_count"]),
                "-" if r["base_gbps"] is None else f"{r['base_gbps']:.3g}",
                "-" if r["new_gbps"] is None else f"{r['new_gbps']:.3g}",
                _signed_pct(r["change_pct"]),
            ]
        )
    if all(r["base_gbps"] is None and r["new_gbps"] is None for r in c.busbw):
        block.lines.append("no collective durations recorded (gloo DDP buckets carry issue times only): no bandwidth")
    return block


def _findings(c, suffix: str) -> Block:
    block = Block(f"Findings{suffix}")
    for word, found in (("appeared", c.findings_added), ("disappeared", c.findings_removed)):
        if not found:
            block.lines.append(f"{word}: none")
            continue
        block.lines.append(f"{word}:")
        block.lines += [
            f"  [{f['severity']}] {f['title']} ({f['time_lost_per_step_s'] * 1e3:.1f} ms/step)"
            for f in found[:TOP_ROWS]
        ]
    return block


STABILITY_ROWS = (
    ("mean loss (matched steps)", "mean_loss"),
    ("final loss (last matched step)", "final_loss"),
    ("last step recorded", "last_step"),
    ("loss at the last step", "last_loss"),
    ("steps with NaN/inf", "nonfinite_steps"),
    ("loss spikes", "loss_spikes"),
)


def _stability(c, suffix: str) -> Block | None:
    s = c.stability
    if s is None:
        return None
    block = Block(f"Training stability{suffix}")
    block.lines.append(s["summary"])
    if s["matched_steps"]:
        block.lines.append(
            f"loss difference (new - base) at matched steps: mean {s['loss_diff_mean']:+.4g}, "
            f"final {s['loss_diff_final']:+.4g}, largest {s['loss_diff_max_abs']:.4g} at step {s['loss_diff_max_step']}"
        )
    block.table = [["per run (loss: median over ranks)", c.base, c.new]]
    for label, key in STABILITY_ROWS:
        block.table.append([label, _value(s["base"][key]), _value(s["new"][key])])
    block.table.append(["replica divergence", _divergence(s["base"]), _divergence(s["new"])])
    block.table.append(["ranks departing from peers", _ranks(s["base"]), _ranks(s["new"])])
    return block


def _value(value) -> str:
    return "-" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)


def _divergence(run: dict) -> str:
    d = run["divergence"]
    return "none" if d is None else f"step {d['step']}, ranks {', '.join(map(str, d['ranks']))}"


def _ranks(run: dict) -> str:
    return ", ".join(map(str, run["departing_ranks"])) or "none"


def _scaling(scaling) -> Block:
    block = Block("Scaling")
    block.lines.append(
        f"{scaling.kind} scaling, throughput in {scaling.unit}/s at the median step; baseline: {scaling.baseline}"
    )
    block.lines += [f"note: {n}" for n in scaling.notes]
    block.lines += [f"- {r.summary}" for r in scaling.runs if r.summary]
    block.table = [["run", "ranks", "median step", "throughput/s", "per GPU", "speedup", "efficiency", "loss ms/step"]]
    for r in scaling.runs:
        block.table.append(
            [
                r.label,
                str(r.world_size),
                ms_from_s(r.step_s),
                "-" if r.throughput is None else f"{r.throughput:,.1f}",
                "-" if r.throughput_per_gpu is None else f"{r.throughput_per_gpu:,.1f}",
                "-" if r.speedup is None else f"{r.speedup:.2f}x",
                _pct(r.efficiency_pct),
                _signed_ms(r.loss_ms),
            ]
        )
    for r in scaling.runs:
        grew = [g for g in r.grew if abs(g.ms) >= 0.005]
        if grew:
            block.lines.append(
                f"grew at {r.world_size} ranks ({r.label}), ms/step beyond the baseline's scaled to the ideal step: "
                + ", ".join(
                    f"{g.label} {g.ms:+.2f}" + (f" ({g.share_pct:.0f}%)" if g.share_pct is not None else "")
                    for g in grew[:6]
                )
            )
    return block


# -- HTML ------------------------------------------------------------------------------------------------------
def render_compare_html(report) -> str:
    from diag.views.html import html_page

    figures = [components_figure(report), steps_figure(report), loss_figure(report), scaling_figure(report)]
    figures = [f for f in figures if f is not None]
    title = "diag compare: " + " vs ".join(r.label for r in report.runs)
    return html_page(title, blocks(report), figures, figure_height_px=420)


def components_series(report) -> tuple[list[str], dict[str, list[float]]]:
    """Run labels and, per component label, each run's ms per step (0 where a run lacks it): the stacked bars.
    Components are ordered as the first comparison's attribution lists them; 'unattributed' is left out."""
    from diag.analysis.compare import component_label

    labels = [r.label for r in report.runs]
    keys = list(dict.fromkeys(k for r in report.runs for k in r.components_ms))
    if report.comparisons:
        ranked = [a.component for a in report.comparisons[0].attribution if a.component in keys]
        keys = ranked + [k for k in keys if k not in ranked]
    series = {component_label(k): [r.components_ms.get(k, 0.0) for r in report.runs] for k in keys}
    return labels, series


def components_figure(report):
    """Each run's components side by side, stacked (ms per step); None without steps."""
    import plotly.graph_objects as go  # only the HTML view and the dashboard need plotly

    labels, series = components_series(report)
    if not series:
        return None
    fig = go.Figure()
    for name, values in series.items():
        fig.add_bar(name=name, x=labels, y=values, hovertemplate="%{x}: %{y:.2f} ms/step<extra>" + name + "</extra>")
    fig.update_layout(barmode="relative", title="Where the time goes (ms per step, steps nearest the median)")
    fig.update_yaxes(title="ms per step")
    return fig


def steps_figure(report):
    """The per-step step time of each run (box and points); None without steps."""
    import plotly.graph_objects as go

    if not any(r.per_step_ms for r in report.runs):
        return None
    fig = go.Figure()
    for r in report.runs:
        fig.add_box(y=r.per_step_ms, name=r.label, boxpoints="all", jitter=0.4, pointpos=0, boxmean=False)
    fig.update_layout(title="Step time per step (each point a step; box: quartiles and median)", showlegend=False)
    fig.update_yaxes(title="ms")
    return fig


def loss_figure(report):
    """Loss against step, one line per run that recorded it (median over ranks; steps without a finite loss left out), when a
    comparison has a stability section; None otherwise."""
    import plotly.graph_objects as go

    runs = [r for r in report.runs if r.loss_steps]
    if not runs or not any(c.stability for c in report.comparisons):
        return None
    fig = go.Figure()
    for r in runs:
        fig.add_scatter(
            x=r.loss_steps,
            y=r.loss,
            name=r.label,
            mode="lines+markers",
            marker={"size": 4},
            hovertemplate="step %{x}: loss %{y:.4g}<extra>" + r.label + "</extra>",
        )
    fig.update_layout(title="Loss per step (median over ranks)")
    fig.update_xaxes(title="step")
    fig.update_yaxes(title="loss")
    return fig


def scaling_figure(report):
    """Efficiency against world size, and the loss per component; None when world sizes agree."""
    scaling = report.scaling
    if scaling is None:
        return None
    from plotly.subplots import make_subplots

    runs = sorted(scaling.runs, key=lambda r: r.world_size)
    fig = make_subplots(
        rows=1, cols=2, subplot_titles=("Efficiency (throughput per GPU)", "Loss per step by component")
    )
    fig.add_scatter(
        x=[r.world_size for r in runs],
        y=[r.efficiency_pct for r in runs],
        mode="lines+markers+text",
        text=[r.label for r in runs],
        textposition="top center",
        name="efficiency %",
        row=1,
        col=1,
    )
    names = list(dict.fromkeys(g.label for r in runs for g in r.grew))
    for name in names:
        fig.add_bar(
            name=name,
            x=[f"{r.world_size} rank{'s' if r.world_size != 1 else ''}" for r in runs],
            y=[next((g.ms for g in r.grew if g.label == name), 0.0) for r in runs],
            row=1,
            col=2,
        )
    fig.update_layout(barmode="relative", title=f"Scaling ({scaling.kind}, baseline {scaling.baseline})")
    fig.update_xaxes(title="ranks", row=1, col=1)
    fig.update_yaxes(title="%", row=1, col=1)
    fig.update_yaxes(title="ms per step", row=1, col=2)
    return fig
