"""Writes the Grafana dashboards of this directory from one description, so that every panel uses the same
variables, filters and units. Regenerate with ``python dashboards/make_dashboards.py``; a test checks the JSON
files are current and that every metric they query is one diag exports."""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
RANKS = 'run=~"$run", host=~"$host", rank=~"$rank"'
# GPU series of a node agent carry no run or rank until a rank's manifest names their GPU: keep those too
GPUS = 'run=~"($run)|", host=~"$host", rank=~"($rank)|"'
RATE = "[$__rate_interval]"
# The fleet dashboard selects GPUs by host and index only, never by run or rank: GPUs no rank has claimed show too
FLEET = 'host=~"$host", gpu=~"$gpu"'
GPU = "host, gpu"
# Clock-event reasons (diag.trace.schema.THROTTLE_REASONS, the `reason` label) that slow a GPU for heat or a
# hardware signal. The power cap (sw_power_cap) is routine at full load and is shown apart; idle, clock settings
# and sync boost are not faults.
THERMAL = "sw_thermal_slowdown|hw_thermal_slowdown"
HARDWARE = "hw_slowdown|hw_power_brake_slowdown"
POWER_CAP = "sw_power_cap"
HOT_CELSIUS = 85  # where datacenter GPUs (A100, H100) near their slowdown temperature
BUSY = 0.5  # utilisation above which a GPU runs at its boost clock unless something holds it back
LEGEND_TABLE = {"options": {"legend": {"displayMode": "table", "placement": "right", "calcs": ["mean", "max"]}}}


def step_time(by: str = "") -> str:
    group = f" by ({by})" if by else ""
    return (
        f"sum{group} (rate(diag_step_duration_seconds_sum{{{RANKS}}}{RATE})) / "
        f"sum{group} (rate(diag_step_duration_seconds_count{{{RANKS}}}{RATE}))"
    )


def target(expr: str, legend: str = "", ref: str = "A") -> dict:
    return {"datasource": DATASOURCE, "expr": expr, "legendFormat": legend, "refId": ref, "range": True}


class Layout:
    """Places panels left to right, rows of 24 grid units, and numbers them."""

    def __init__(self):
        self.panels: list[dict] = []
        self.x = self.y = 0
        self.row_height = 0

    def row(self, title: str) -> None:
        self._newline()
        self.panels.append(
            {"type": "row", "title": title, "collapsed": False, "gridPos": self._place(24, 1), "panels": []}
        )
        self._newline()

    def add(
        self, kind: str, title: str, targets: list[dict], unit: str, width: int = 12, height: int = 8, **extra
    ) -> None:
        if self.x + width > 24:
            self._newline()
        panel = {
            "type": kind,
            "title": title,
            "datasource": DATASOURCE,
            "gridPos": self._place(width, height),
            "targets": [dict(t, refId=chr(ord("A") + i)) for i, t in enumerate(targets)],
            "fieldConfig": {
                "defaults": {"unit": unit, **extra.pop("defaults", {})},
                "overrides": extra.pop("overrides", []),
            },
            "options": extra.pop("options", {}),
        }
        panel.update(extra)
        self.panels.append(panel)

    def _place(self, width: int, height: int) -> dict:
        pos = {"h": height, "w": width, "x": self.x, "y": self.y}
        self.x += width
        self.row_height = max(self.row_height, height)
        return pos

    def _newline(self) -> None:
        if self.x:
            self.y += self.row_height
        self.x, self.row_height = 0, 0

    def numbered(self) -> list[dict]:
        return [dict(panel, id=i + 1) for i, panel in enumerate(self.panels)]


def variable(name: str, label: str, query: str) -> dict:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "query": {"query": query, "refId": f"{name}-values"},
        "definition": query,
        "refresh": 2,
        "includeAll": True,
        "multi": True,
        "allValue": ".*",
        "current": {"text": "All", "value": "$__all"},
        "sort": 3,
    }


def thresholds(*steps: tuple[str, float | None]) -> dict:
    """Colours from each value up, the first from minus infinity (None)."""
    return {"mode": "absolute", "steps": [{"color": color, "value": value} for color, value in steps]}


def dashboard(uid: str, title: str, description: str, tags: list[str], variables: list[dict], layout: Layout) -> dict:
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": tags,
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "schemaVersion": 39,
        "time": {"from": "now-1h", "to": "now"},
        "timezone": "browser",
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Data source",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                },
                *variables,
            ]
        },
        "panels": layout.numbered(),
    }


def training_dashboard() -> dict:
    layout = Layout()
    layout.row("Overview")
    layout.add(
        "stat",
        "Slowest rank's step time / median rank's",
        [target(f"max({step_time('rank')}) / quantile(0.5, {step_time('rank')})")],
        "none",
        width=6,
        height=4,
        defaults={"decimals": 2},
    )
    layout.add(
        "stat", "MFU (mean over ranks)", [target(f"avg(diag_mfu_ratio{{{RANKS}}})")], "percentunit", width=6, height=4
    )
    layout.add(
        "stat",
        "Tokens per second (all ranks)",
        [target(f"sum(rate(diag_tokens_total{{{RANKS}}}{RATE}))")],
        "short",
        width=6,
        height=4,
    )
    layout.add(
        "stat",
        "Since the stalest rank's last step",
        [target(f"time() - min(diag_last_step_end_timestamp_seconds{{{RANKS}}})")],
        "s",
        width=6,
        height=4,
        defaults={"thresholds": thresholds(("green", None), ("red", 300))},
    )

    layout.row("Steps")
    layout.add(
        "timeseries", "Step time per rank", [target(step_time("run, rank"), "rank {{rank}}")], "s", **LEGEND_TABLE
    )
    layout.add(
        "timeseries",
        "Step time quantiles over all ranks",
        [
            target(
                f"histogram_quantile({q}, sum by (le) (rate(diag_step_duration_seconds_bucket{{{RANKS}}}{RATE})))",
                f"p{int(q * 100)}",
            )
            for q in (0.5, 0.9, 0.99)
        ],
        "s",
    )
    layout.add(
        "timeseries",
        "MFU per rank",
        [target(f"diag_mfu_ratio{{{RANKS}}}", "rank {{rank}}")],
        "percentunit",
        **LEGEND_TABLE,
    )
    layout.add(
        "timeseries",
        "Where step time goes (share of step time, all ranks)",
        [
            target(
                f"sum by (part) (rate(diag_step_breakdown_seconds_total{{{RANKS}}}{RATE})) / ignoring(part) group_left "
                f"sum(rate(diag_step_duration_seconds_sum{{{RANKS}}}{RATE}))",
                "{{part}}",
            )
        ],
        "percentunit",
    )
    layout.add(
        "timeseries",
        "Steps per second per rank",
        [target(f"rate(diag_steps_total{{{RANKS}}}{RATE})", "rank {{rank}}")],
        "short",
        **LEGEND_TABLE,
    )
    layout.add(
        "timeseries",
        "Marked phases (diag.phase), share of step time",
        [
            target(
                f"sum by (phase) (rate(diag_phase_seconds_total{{{RANKS}}}{RATE})) / ignoring(phase) group_left "
                f"sum(rate(diag_step_duration_seconds_sum{{{RANKS}}}{RATE}))",
                "{{phase}}",
            )
        ],
        "percentunit",
    )

    layout.row("Communication")
    layout.add(
        "timeseries",
        "Collective wait, share of step time, by op",
        [
            target(
                f"sum by (op) (rate(diag_collective_wait_seconds_total{{{RANKS}}}{RATE})) / ignoring(op) group_left "
                f"sum(rate(diag_step_duration_seconds_sum{{{RANKS}}}{RATE}))",
                "{{op}}",
            )
        ],
        "percentunit",
    )
    layout.add(
        "timeseries",
        "Communication wait, share of step time, per rank",
        [
            target(
                f'sum by (rank) (rate(diag_step_breakdown_seconds_total{{{RANKS}, part="comm_wait"}}{RATE})) / '
                f"sum by (rank) (rate(diag_step_duration_seconds_sum{{{RANKS}}}{RATE}))",
                "rank {{rank}}",
            )
        ],
        "percentunit",
        **LEGEND_TABLE,
    )
    layout.add(
        "timeseries",
        "Mean collective time by op and process group",
        [
            target(
                f"sum by (op, pg) (rate(diag_collective_seconds_total{{{RANKS}}}{RATE})) / "
                f"sum by (op, pg) (rate(diag_collectives_total{{{RANKS}}}{RATE}))",
                "{{op}} pg {{pg}}",
            )
        ],
        "s",
    )
    layout.add(
        "timeseries",
        "Bytes sent into collectives per second, by op",
        [target(f"sum by (op) (rate(diag_collective_bytes_total{{{RANKS}}}{RATE}))", "{{op}}")],
        "Bps",
    )

    layout.row("Memory")
    layout.add(
        "timeseries",
        "CUDA allocator: reserved and peak allocated per rank",
        [
            target(f"diag_memory_reserved_bytes{{{RANKS}}}", "reserved rank {{rank}}"),
            target(f"diag_memory_allocated_peak_bytes{{{RANKS}}}", "peak allocated rank {{rank}}"),
        ],
        "bytes",
        **LEGEND_TABLE,
    )
    layout.add(
        "timeseries",
        "Allocator fragmentation (reserved but unallocated share)",
        [target(f"diag_memory_fragmentation_ratio{{{RANKS}}}", "rank {{rank}}")],
        "percentunit",
        **LEGEND_TABLE,
    )
    layout.add(
        "timeseries",
        "Process RSS",
        [target(f"diag_memory_rss_bytes{{{RANKS}}}", "rank {{rank}}")],
        "bytes",
        **LEGEND_TABLE,
    )
    layout.add(
        "timeseries",
        "Allocator retries and OOMs",
        [
            target(
                f"sum by (rank) (increase(diag_memory_alloc_retries_total{{{RANKS}}}{RATE}))", "retries rank {{rank}}"
            ),
            target(f"sum by (rank) (increase(diag_memory_ooms_total{{{RANKS}}}{RATE}))", "OOMs rank {{rank}}"),
        ],
        "short",
    )

    gpu_legend = "{{host}} gpu {{gpu}} rank {{rank}}"
    layout.row("GPUs")
    layout.add(
        "timeseries",
        "GPU utilisation",
        [target(f"diag_gpu_utilization_ratio{{{GPUS}}}", gpu_legend)],
        "percentunit",
        **LEGEND_TABLE,
    )
    layout.add(
        "timeseries",
        "Power draw and limit",
        [
            target(f"diag_gpu_power_usage_watts{{{GPUS}}}", gpu_legend),
            target(f"max by (host, gpu) (diag_gpu_power_limit_watts{{{GPUS}}})", "limit {{host}} gpu {{gpu}}"),
        ],
        "watt",
        **LEGEND_TABLE,
    )
    layout.add(
        "timeseries",
        "Temperature",
        [target(f"diag_gpu_temperature_celsius{{{GPUS}}}", gpu_legend)],
        "celsius",
        **LEGEND_TABLE,
    )
    layout.add(
        "timeseries",
        "SM clock, share of its maximum",
        [target(f"diag_gpu_sm_clock_hertz{{{GPUS}}} / diag_gpu_sm_clock_max_hertz{{{GPUS}}}", gpu_legend)],
        "percentunit",
        **LEGEND_TABLE,
    )
    layout.add(
        "timeseries",
        "Clock throttle reasons active (GPUs with the reason)",
        [target(f'sum by (reason) (diag_gpu_clock_throttle_active{{{GPUS}, reason!="gpu_idle"}})', "{{reason}}")],
        "short",
    )
    layout.add(
        "timeseries",
        "GPU memory used, share of total",
        [target(f"diag_gpu_memory_used_bytes{{{GPUS}}} / diag_gpu_memory_total_bytes{{{GPUS}}}", gpu_legend)],
        "percentunit",
        **LEGEND_TABLE,
    )
    layout.add(
        "timeseries",
        "PCIe throughput",
        [
            target(f"sum by (host, gpu) (diag_gpu_pcie_tx_bytes_per_second{{{GPUS}}})", "tx {{host}} gpu {{gpu}}"),
            target(f"sum by (host, gpu) (diag_gpu_pcie_rx_bytes_per_second{{{GPUS}}})", "rx {{host}} gpu {{gpu}}"),
        ],
        "Bps",
    )
    layout.add(
        "timeseries",
        "ECC errors and XIDs",
        [
            # growth, not increase(): a GPU's first XID creates its series, and increase() does not count it
            *(
                target(
                    f"{growth(f'diag_gpu_ecc_{kind}_errors_total', '$__interval', selector=GPUS)} > 0",
                    f"ECC {kind} {{{{host}}}} gpu {{{{gpu}}}}",
                )
                for kind in ("corrected", "uncorrected")
            ),
            target(
                f"{growth('diag_gpu_xid_errors_total', '$__interval', f'{GPU}, xid', selector=GPUS)} > 0",
                "XID {{xid}} {{host}} gpu {{gpu}}",
            ),
        ],
        "short",
    )
    return dashboard(
        "diag-training",
        "diag: distributed training",
        "Step time, MFU, communication, memory and GPU telemetry exported by diag (docs/prometheus.md).",
        ["diag", "pytorch", "training", "gpu"],
        [
            variable("run", "Run", "label_values(diag_rank_info, run)"),
            variable("host", "Host", 'label_values(diag_rank_info{run=~"$run"}, host)'),
            variable("rank", "Rank", 'label_values(diag_rank_info{run=~"$run", host=~"$host"}, rank)'),
        ],
        layout,
    )


def per_gpu(metric: str, matchers: str = "", by: str = GPU, offset: str = "", selector: str = FLEET) -> str:
    """One series per GPU (and per the other labels in `by`): a GPU's series from the node agent and from the
    rank that uses it, and the agent's series from before and after a rank claimed it (its run and rank labels
    change then), are one."""
    selector = ", ".join(m for m in (selector, matchers) if m)
    return f"max by ({by}) ({metric}{{{selector}}}{offset})"


def share(metric: str, of: str) -> str:
    return f"{per_gpu(metric)} / {per_gpu(of)}"


def growth(counter: str, window: str, by: str = GPU, selector: str = FLEET) -> str:
    """How much a counter grew over the window: its value now less its value a window ago, or all of it where it
    had none then or has since been reset (agent restarted). increase() misses a GPU's first XID: that XID creates
    the series, and increase() counts only what comes after a series' first sample."""
    now = per_gpu(counter, by=by, selector=selector)
    return f"(({now} - {per_gpu(counter, by=by, offset=f' offset {window}', selector=selector)}) >= 0 or {now})"


def or_zero(expr: str) -> str:
    """0 rather than no value for the GPUs reporting where expr has none (no XID yet)."""
    return f"{expr} or {per_gpu('diag_gpu_memory_total_bytes')} * 0"


def active(reasons: str, by: str = GPU) -> str:
    """1 for the GPUs where one of the clock-event reasons (a regex) is active, 0 for the others."""
    return per_gpu("diag_gpu_clock_throttle_active", f'reason=~"{reasons}"', by)


def xids(window: str) -> str:
    return f"sum by ({GPU}) ({growth('diag_gpu_xid_errors_total', window, f'{GPU}, xid')})"


def problems() -> dict[str, str]:
    """Per GPU, only for the GPUs that have them: what makes a GPU need attention over the dashboard's range."""
    return {
        "slowed": f"{active(f'{THERMAL}|{HARDWARE}')} == 1",
        "xid": f"{xids('$__range')} > 0",
        "ecc": f"{growth('diag_gpu_ecc_uncorrected_errors_total', '$__range')} > 0",
        "hot": f"{per_gpu('diag_gpu_temperature_celsius')} >= {HOT_CELSIUS}",
    }


def problem_count() -> str:
    """How many of the problems each GPU has: label each problem's GPUs with its name so that `or` keeps them
    all (it keeps one series per label set), then count per GPU."""
    named = " or ".join(f'label_replace({expr}, "problem", "{name}", "", "")' for name, expr in problems().items())
    return or_zero(f"count by ({GPU}) ({named})")


def instant(expr: str, table: bool = False) -> dict:
    return dict(target(expr), instant=True, range=False, **({"format": "table"} if table else {}))


OK, BAD = ("green", None), ("red", 1)
HEAT = (OK, ("orange", HOT_CELSIUS - 5), ("red", HOT_CELSIUS))
GPU_LEGEND = "{{host}} gpu {{gpu}}"


def count_stat(layout: Layout, title: str, expr: str, *steps: tuple[str, float | None]) -> None:
    """How many GPUs expr returns: 0, not "No data", when none."""
    layout.add(
        "stat",
        title,
        [instant(f"count({expr}) or vector(0)")],
        "none",
        width=4,
        height=4,
        defaults={"thresholds": thresholds(*steps)},
    )


def gpu_timeseries(layout: Layout, title: str, expr: str, unit: str, width: int = 12) -> None:
    layout.add("timeseries", title, [target(expr, GPU_LEGEND)], unit, width=width, **LEGEND_TABLE)


def flag(color: str) -> list[dict]:
    """Value mappings of a 0-or-1 reason: active in colour, else a dash."""
    return [{"type": "value", "options": {"0": {"text": "-"}, "1": {"text": "active", "color": color}}}]


def cell(unit: str, *steps: tuple[str, float | None], mappings: list | None = None) -> list[dict]:
    """A table column's unit and, given thresholds or value mappings, its text coloured by them."""
    properties = [{"id": "unit", "value": unit}]
    if steps:
        properties.append({"id": "thresholds", "value": thresholds(*steps)})
    if mappings:
        properties.append({"id": "mappings", "value": mappings})
    if steps or mappings:
        properties.append({"id": "custom.cellOptions", "value": {"type": "color-text"}})
    return properties


def attention_table(layout: Layout) -> None:
    """One row per GPU, most problems first: instant queries each aggregated by host and gpu, which Grafana's
    merge joins on (its key is the fields every query has: Time, host, gpu)."""
    columns = {  # name: (query, column settings)
        "Problems": (problem_count(), cell("none", OK, BAD)),
        "Memory": (per_gpu("diag_gpu_memory_total_bytes", by=f"{GPU}, uuid"), cell("bytes")),
        "Temperature": (per_gpu("diag_gpu_temperature_celsius"), cell("celsius", *HEAT)),
        "Power": (per_gpu("diag_gpu_power_usage_watts"), cell("watt")),
        "Power / limit": (share("diag_gpu_power_usage_watts", "diag_gpu_power_limit_watts"), cell("percentunit")),
        "Utilisation": (per_gpu("diag_gpu_utilization_ratio"), cell("percentunit")),
        "SM clock / max": (share("diag_gpu_sm_clock_hertz", "diag_gpu_sm_clock_max_hertz"), cell("percentunit")),
        "Memory used": (share("diag_gpu_memory_used_bytes", "diag_gpu_memory_total_bytes"), cell("percentunit")),
        "Thermal slowdown": (active(THERMAL), cell("none", mappings=flag("red"))),
        "HW slowdown": (active(HARDWARE), cell("none", mappings=flag("red"))),
        "Power cap": (active(POWER_CAP), cell("none", mappings=flag("blue"))),
        "XIDs": (or_zero(xids("$__range")), cell("none", OK, BAD)),
        "ECC uncorrected": (
            or_zero(growth("diag_gpu_ecc_uncorrected_errors_total", "$__range")),
            cell("none", OK, BAD),
        ),
        "ECC corrected": (
            or_zero(growth("diag_gpu_ecc_corrected_errors_total", "$__range")),
            cell("none", OK, ("orange", 1)),
        ),
    }
    layout.add(
        "table",
        "GPUs needing attention",
        [instant(expr, table=True) for expr, _ in columns.values()],
        "none",
        width=24,
        height=12,
        description="Every GPU of the selected hosts, most problems first. Problems: slowed by heat or a hardware "
        f"signal now, {HOT_CELSIUS} °C or more now, XIDs or uncorrected ECC errors in the dashboard's time range. "
        "XID and ECC columns count over the range, the others are the last reading.",
        overrides=[
            {"matcher": {"id": "byName", "options": name}, "properties": props} for name, (_, props) in columns.items()
        ],
        options={"showHeader": True, "sortBy": [{"displayName": "Problems", "desc": True}]},
        transformations=[
            {"id": "merge", "options": {}},
            {
                "id": "organize",
                "options": {  # the nth query's values are the column "Value #<its refId>"
                    "excludeByName": {"Time": True},
                    "indexByName": {"host": 0, "gpu": 1, "uuid": 2},
                    "renameByName": {f"Value #{chr(ord('A') + i)}": name for i, name in enumerate(columns)},
                },
            },
        ],
    )


def fleet_dashboard() -> dict:
    layout = Layout()
    found = problems()
    layout.row("Overview")
    count_stat(layout, "GPUs reporting", per_gpu("diag_gpu_memory_total_bytes"), ("blue", None))
    count_stat(layout, "GPUs slowed by heat or hardware now", found["slowed"], OK, BAD)
    count_stat(layout, "GPUs at their power cap now", f"{active(POWER_CAP)} == 1", ("blue", None))
    count_stat(layout, "GPUs with XIDs or uncorrected ECC errors", f"{found['xid']} or {found['ecc']}", OK, BAD)
    layout.add(
        "stat",
        "Hottest GPU",
        [instant(f"max({per_gpu('diag_gpu_temperature_celsius')})")],
        "celsius",
        width=4,
        height=4,
        defaults={"thresholds": thresholds(*HEAT)},
    )
    clock = share("diag_gpu_sm_clock_hertz", "diag_gpu_sm_clock_max_hertz")
    busy = f"{per_gpu('diag_gpu_utilization_ratio')} > {BUSY}"
    layout.add(
        "stat",
        f"Lowest SM clock / max of GPUs over {BUSY:.0%} busy",
        [instant(f"min({clock} and on ({GPU}) ({busy}))")],
        "percentunit",
        width=4,
        height=4,
        # at their power cap, busy GPUs still run at 0.8 or more of their maximum SM clock
        defaults={"thresholds": thresholds(("red", None), ("orange", 0.6), ("green", 0.8))},
    )
    attention_table(layout)

    layout.row("Utilisation and memory")
    gpu_timeseries(layout, "GPU utilisation", per_gpu("diag_gpu_utilization_ratio"), "percentunit", width=8)
    gpu_timeseries(
        layout, "Memory controller utilisation", per_gpu("diag_gpu_memory_utilization_ratio"), "percentunit", width=8
    )
    gpu_timeseries(
        layout,
        "GPU memory used, share of total",
        share("diag_gpu_memory_used_bytes", "diag_gpu_memory_total_bytes"),
        "percentunit",
        width=8,
    )

    layout.row("Power and temperature")
    layout.add(
        "timeseries",
        "Power draw and limit",
        [
            target(per_gpu("diag_gpu_power_usage_watts"), GPU_LEGEND),
            target(per_gpu("diag_gpu_power_limit_watts"), f"limit {GPU_LEGEND}"),
        ],
        "watt",
        **LEGEND_TABLE,
    )
    gpu_timeseries(layout, "Temperature", per_gpu("diag_gpu_temperature_celsius"), "celsius")

    layout.row("Clocks and throttling")
    gpu_timeseries(layout, "SM clock, share of its maximum", clock, "percentunit", width=8)
    # only the reasons active: a 0 series per GPU and reason would bury the few that matter
    not_idle = per_gpu("diag_gpu_clock_throttle_active", 'reason!="gpu_idle"', f"{GPU}, reason")
    reasons = f"{not_idle} == 1"
    layout.add(
        "timeseries",
        "GPUs per active throttle reason",
        [target(f"count by (reason) ({reasons})", "{{reason}}")],
        "none",
        width=8,
    )
    layout.add(
        "state-timeline",
        "Throttle reasons active, per GPU",
        [target(reasons, f"{GPU_LEGEND} {{{{reason}}}}")],
        "none",
        width=8,
        options={"showValue": "never", "mergeValues": True},
        defaults={"mappings": flag("orange")},
    )

    layout.row("PCIe")
    gpu_timeseries(layout, "PCIe rx (into the GPU)", per_gpu("diag_gpu_pcie_rx_bytes_per_second"), "Bps")
    gpu_timeseries(layout, "PCIe tx (out of the GPU)", per_gpu("diag_gpu_pcie_tx_bytes_per_second"), "Bps")

    # new errors per interval, only where there are some: bars at the interval they appeared in
    layout.row("Errors")
    bars = {**LEGEND_TABLE, "defaults": {"custom": {"drawStyle": "bars"}}}
    xid = growth("diag_gpu_xid_errors_total", "$__interval", f"{GPU}, xid")
    layout.add(
        "timeseries",
        "XIDs per interval, by code",
        [target(f"{xid} > 0", f"XID {{{{xid}}}} {GPU_LEGEND}")],
        "none",
        **bars,
    )
    layout.add(
        "timeseries",
        "ECC errors per interval",
        [
            target(f"{growth(f'diag_gpu_ecc_{kind}_errors_total', '$__interval')} > 0", f"{kind} {GPU_LEGEND}")
            for kind in ("uncorrected", "corrected")
        ],
        "none",
        **bars,
    )
    return dashboard(
        "diag-gpu-fleet",
        "diag: GPU fleet",
        "Every GPU of every node running the diag node agent (diag telemetry --prometheus-port 9401), used by a "
        "rank or not: throttling, heat, clocks, XIDs and ECC errors (docs/prometheus.md, dashboards/README.md).",
        ["diag", "gpu", "fleet"],
        [
            variable("host", "Host", "label_values(diag_gpu_memory_total_bytes, host)"),
            variable("gpu", "GPU", 'label_values(diag_gpu_memory_total_bytes{host=~"$host"}, gpu)'),
        ],
        layout,
    )


DASHBOARDS = {"diag-training.json": training_dashboard, "diag-gpu-fleet.json": fleet_dashboard}


def main(out_dir: Path = HERE) -> None:
    for name, make in DASHBOARDS.items():
        path = out_dir / name
        path.write_text(json.dumps(make(), indent=2) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE)
