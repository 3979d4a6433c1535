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
            "fieldConfig": {"defaults": {"unit": unit, **extra.pop("defaults", {})}, "overrides": []},
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


def training_dashboard() -> dict:
    layout = Layout()
    timeseries = {"options": {"legend": {"displayMode": "table", "placement": "right", "calcs": ["mean", "max"]}}}
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
        defaults={
            "thresholds": {
                "mode": "absolute",
                "steps": [{"color": "green", "value": None}, {"color": "red", "value": 300}],
            }
        },
    )

    layout.row("Steps")
    layout.add("timeseries", "Step time per rank", [target(step_time("run, rank"), "rank {{rank}}")], "s", **timeseries)
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
        **timeseries,
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
        **timeseries,
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
        **timeseries,
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
        **timeseries,
    )
    layout.add(
        "timeseries",
        "Allocator fragmentation (reserved but unallocated share)",
        [target(f"diag_memory_fragmentation_ratio{{{RANKS}}}", "rank {{rank}}")],
        "percentunit",
        **timeseries,
    )
    layout.add(
        "timeseries",
        "Process RSS",
        [target(f"diag_memory_rss_bytes{{{RANKS}}}", "rank {{rank}}")],
        "bytes",
        **timeseries,
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
        **timeseries,
    )
    layout.add(
        "timeseries",
        "Power draw and limit",
        [
            target(f"diag_gpu_power_usage_watts{{{GPUS}}}", gpu_legend),
            target(f"max by (host, gpu) (diag_gpu_power_limit_watts{{{GPUS}}})", "limit {{host}} gpu {{gpu}}"),
        ],
        "watt",
        **timeseries,
    )
    layout.add(
        "timeseries",
        "Temperature",
        [target(f"diag_gpu_temperature_celsius{{{GPUS}}}", gpu_legend)],
        "celsius",
        **timeseries,
    )
    layout.add(
        "timeseries",
        "SM clock, share of its maximum",
        [target(f"diag_gpu_sm_clock_hertz{{{GPUS}}} / diag_gpu_sm_clock_max_hertz{{{GPUS}}}", gpu_legend)],
        "percentunit",
        **timeseries,
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
        **timeseries,
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
            target(
                f"sum by (host, gpu) (increase(diag_gpu_ecc_corrected_errors_total{{{GPUS}}}{RATE}))",
                "ECC corrected {{host}} gpu {{gpu}}",
            ),
            target(
                f"sum by (host, gpu) (increase(diag_gpu_ecc_uncorrected_errors_total{{{GPUS}}}{RATE}))",
                "ECC uncorrected {{host}} gpu {{gpu}}",
            ),
            target(
                f"sum by (host, gpu, xid) (increase(diag_gpu_xid_errors_total{{{GPUS}}}{RATE}))",
                "XID {{xid}} {{host}} gpu {{gpu}}",
            ),
        ],
        "short",
    )
    return {
        "uid": "diag-training",
        "title": "diag: distributed training",
        "description": "Step time, MFU, communication, memory and GPU telemetry exported by diag (docs/prometheus.md).",
        "tags": ["diag", "pytorch", "training", "gpu"],
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
                variable("run", "Run", "label_values(diag_rank_info, run)"),
                variable("host", "Host", 'label_values(diag_rank_info{run=~"$run"}, host)'),
                variable("rank", "Rank", 'label_values(diag_rank_info{run=~"$run", host=~"$host"}, rank)'),
            ]
        },
        "panels": layout.numbered(),
    }


def main(out_dir: Path = HERE) -> None:
    path = out_dir / "diag-training.json"
    path.write_text(json.dumps(training_dashboard(), indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE)
