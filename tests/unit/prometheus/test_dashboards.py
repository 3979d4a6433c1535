"""The Grafana dashboards query only what diag exports (the fleet one: every GPU of a node, claimed by a rank
or not), the metric table of docs/prometheus.md is the one the code defines, and the exported names follow
Prometheus conventions. The exported set is read from a live registry fed with real runs (the bundled sample
traces, one with H100 telemetry), not from a list."""

import json
import re
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from diag.commands.telemetry import TraceFollower
from diag.metrics.nvml import decode_sample
from diag.metrics.prometheus import (
    METRICS,
    RankLabels,
    RowMetrics,
    exported_sample_names,
    new_registry,
    render_metric_table,
)
from diag.trace.schema import PHASES, STEPS, THROTTLE_REASONS

REPO = Path(__file__).resolve().parents[3]
DASHBOARDS = sorted((REPO / "dashboards").glob("*.json"))
FLEET = REPO / "dashboards" / "diag-gpu-fleet.json"
PROMQL_WORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left", "group_right"}


@pytest.fixture(scope="module")
def live_exposition() -> str:
    """What a registry built by diag's code serves after folding two real runs, plus what neither recorded: an
    XID, a throttle reason, tokens, a marked phase and a heartbeat of a stalled collective."""
    metrics = RowMetrics()
    for run in ("straggler", "straggler-h100"):
        TraceFollower(REPO / "sample_traces" / run, metrics, host=None).poll()
    gpu = metrics.source(RankLabels(run="r", rank="9", local_rank="0", host="h", gpu_uuid="GPU-1", gpu_model="m"))
    reading = {"t_ns": 0, "util_gpu": 50, "clock_event_reasons": 4}
    gpu.observe("telemetry", [decode_sample(reading, 0, xid=48)])
    gpu.observe("phases", [PHASES.row(step=0, name="compute", start_us=0, duration_us=1000)])
    zero = dict.fromkeys(("start_us", "data_wait_us", "forward_us", "backward_us", "optimizer_us", "comm_wait_us"), 0)
    gpu.observe("steps", [STEPS.row(step=0, duration_us=2000, samples=1, tokens=128, **zero)])
    stuck = {"pg": "0", "seq": 7, "op": "all_reduce", "start_us": 0}
    gpu.observe("heartbeat", [{"time_us": 200e6, "pending": [stuck], "stall": {**stuck, "seconds": 200.0}}])
    return generate_latest(new_registry(metrics)).decode()


def exposed_names(text: str) -> set[str]:
    """Sample names Prometheus can store from an exposition: those of its samples, and for families that had
    none yet, the names their type gives (counters' _total, histograms' _bucket, _sum and _count)."""
    names = set()
    for family in text_string_to_metric_families(text):
        names |= {s.name for s in family.samples}
        if not family.samples:
            suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}.get(family.type, [""])
            names |= {family.name + suffix for suffix in suffixes}
    return names


def queried_metrics(expr: str) -> set[str]:
    """Metric names a PromQL expression (or a Grafana label_values(...) query) selects."""
    label_values = re.fullmatch(r"\s*label_values\((.*),\s*\w+\s*\)\s*", expr)
    if label_values:
        expr = label_values.group(1)
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # range selectors
    expr = re.sub(r"\$\{?\w+\}?", "", expr)  # Grafana variables elsewhere (offset $__range)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)  # label lists
    names = set(re.findall(r"\b[a-zA-Z_:][a-zA-Z0-9_:]*\b(?!\s*\()", expr))  # identifiers that are not calls
    return names - PROMQL_WORDS


def dashboard_queries(dashboard: dict) -> list[tuple[str, str]]:
    queries = [(panel["title"], t["expr"]) for panel in dashboard["panels"] for t in panel.get("targets", [])]
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            queries.append((f"${var['name']}", var["query"]["query"]))
    return queries


def test_metric_names_are_read_from_promql():
    expr = 'sum by (op) (rate(diag_a_total{x=~"$y", part="b c"}[5m])) / ignoring(op) group_left sum(diag_b{le="1"})'
    assert queried_metrics(expr) == {"diag_a_total", "diag_b"}
    assert queried_metrics('label_values(diag_rank_info{run=~"$run"}, host)') == {"diag_rank_info"}
    assert queried_metrics("time() - min(diag_c)") == {"diag_c"}
    assert queried_metrics('max by (gpu) (diag_d{gpu=~"$gpu"} offset $__range) or vector(0)') == {"diag_d"}


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_every_metric_a_dashboard_queries_is_exported(path, live_exposition):
    exported = exposed_names(live_exposition)
    dashboard = json.loads(path.read_text())
    queries = dashboard_queries(dashboard)
    assert len(queries) >= 20
    for title, expr in queries:
        names = queried_metrics(expr)
        assert names, f"{title}: no metric in {expr}"
        assert names <= exported, f"{title}: {sorted(names - exported)} not exported by diag"


def selectors(expr: str) -> list[tuple[str, str]]:
    """(metric, label matchers) of every series a PromQL expression selects."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', lambda m: m.group(0).replace("{", "(").replace("}", ")"), expr)
    return [(m.group(1), m.group(2) or "") for m in re.finditer(r"\b(diag_\w+)\s*(?:\{([^}]*)\})?", expr)]


def test_fleet_dashboard_shows_every_gpu_of_the_selected_hosts():
    """The operator's view: every series is filtered by the host and gpu variables and by nothing that a rank
    sets (a GPU no rank has claimed has empty run and rank labels), and every query is one per GPU."""
    dashboard = json.loads(FLEET.read_text())
    assert [v["name"] for v in dashboard["templating"]["list"]] == ["datasource", "host", "gpu"]
    panels = [panel for panel in dashboard["panels"] if panel["type"] != "row"]
    assert len(panels) >= 15
    for title, expr in dashboard_queries(dashboard):
        found = selectors(expr)
        assert found, f"{title}: {expr}"
        for metric, matchers in found:
            assert metric.startswith("diag_gpu_"), f"{title}: {metric} is not NVML telemetry of the node agent"
            labels = set(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", matchers))
            assert not labels & {"run", "rank", "local_rank"}, f"{title}: {metric}{{{matchers}}} hides unclaimed GPUs"
            if not title.startswith("$"):
                assert 'host=~"$host"' in matchers and 'gpu=~"$gpu"' in matchers, f"{title}: {metric}{{{matchers}}}"
                # the node agent's and the rank's series of a GPU, before and after a rank claims it, are one
                assert "max by (host, gpu" in expr, f"{title}: {expr}"


def test_fleet_attention_table_is_one_row_per_gpu():
    """Instant table queries aggregated by host and gpu (the labels Grafana's merge joins them on), and each
    renamed column is one of those queries."""
    dashboard = json.loads(FLEET.read_text())
    (table,) = [panel for panel in dashboard["panels"] if panel["title"] == "GPUs needing attention"]
    assert all(t["instant"] and not t["range"] and t["format"] == "table" for t in table["targets"])
    assert all(re.match(r"(count|max|sum) by \(host, gpu[,)]", t["expr"].lstrip("(")) for t in table["targets"])
    merge, organize = table["transformations"]
    assert merge["id"] == "merge"
    renamed = organize["options"]["renameByName"]
    assert sorted(renamed) == sorted(f"Value #{t['refId']}" for t in table["targets"])
    assert {o["matcher"]["options"] for o in table["fieldConfig"]["overrides"]} == set(renamed.values())
    assert table["options"]["sortBy"][0]["displayName"] in renamed.values()


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_throttle_reasons_queried_are_the_ones_exported(path):
    """A misspelt reason matches no series and reads as "not throttled"."""
    matched = []
    for _, expr in dashboard_queries(json.loads(path.read_text())):
        for value in re.findall(r'reason\s*(?:=~|!~|!=|=)\s*"([^"]*)"', expr):
            matched += value.split("|")
    assert matched and set(matched) <= set(THROTTLE_REASONS.values()), sorted(set(matched))


def test_live_registry_exports_exactly_the_documented_metrics(live_exposition):
    served_by_ranks = {name for spec in METRICS for name in spec.sample_names}  # not diag triage --watch's
    assert served_by_ranks == exported_sample_names() - {"diag_triage_verdict", "diag_triage_judged_timestamp_seconds"}
    assert exposed_names(live_exposition) == served_by_ranks
    families = {f.name: f for f in text_string_to_metric_families(live_exposition)}
    empty = sorted(name for name, family in families.items() if not family.samples)
    assert empty == []  # the two real runs and the XID reach every metric: each name above was really served


def test_names_follow_prometheus_conventions(live_exposition):
    units = ("_seconds", "_bytes", "_ratio", "_watts", "_celsius", "_hertz", "_flops", "_info", "_bytes_per_second")
    for family in text_string_to_metric_families(live_exposition):
        assert family.name.startswith("diag_")
        if family.type == "counter":
            assert all(s.name.endswith("_total") for s in family.samples)
        if family.name.endswith("_ratio"):
            assert all(0 <= s.value <= 1 for s in family.samples), family.name
        if family.type in ("gauge", "histogram") and family.name.startswith(("diag_memory_", "diag_gpu_")):
            unitless = {"diag_gpu_clock_throttle_reasons", "diag_gpu_clock_throttle_active"}
            assert family.name.endswith(units) or family.name in unitless, family.name


def test_gpu_metrics_name_their_dcgm_counterpart():
    gpu = [spec for spec in METRICS if spec.name.startswith("diag_gpu_")]
    assert len(gpu) >= 14 and all(spec.dcgm and "DCGM_FI_" in spec.dcgm for spec in gpu)
    assert {"gpu", "uuid", "model", "host"} <= set(gpu[0].labels)


def test_docs_metric_table_is_generated_from_the_code():
    docs = (REPO / "docs" / "prometheus.md").read_text()
    assert render_metric_table() in docs
