"""``diag triage --watch --prometheus-port``: the watch's verdict served to Prometheus, so that the alert that pages
someone (or a scheduler's webhook) carries what to do next: fix the code, restart, or evict the named hosts and
GPUs (diag/triage/action.py). One series, replaced when the verdict changes. No torch."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from diag.metrics.prometheus import SPECS, TRIAGE_LABELS

WHY_MAX_CHARS = 300  # a label, not a report: the evidence is in `diag triage TRACE_DIR`


class VerdictMetrics:
    """A prometheus_client collector holding the latest verdict (``Verdict.to_json()``) of one run."""

    def __init__(self):
        self._lock = threading.Lock()
        self._labels: tuple[str, ...] | None = None
        self._judged_s: float | None = None

    def update(self, run: str, verdict: dict, judged_s: float) -> None:
        values = {
            "run": run,
            "verdict": str(verdict.get("verdict", "")),
            "culprit_ranks": ",".join(str(r) for r in verdict.get("culprit_ranks") or []),
            "action": str(verdict.get("action", "")),
            "hosts": ",".join(str(h) for h in verdict.get("hosts") or []),
            "gpus": ",".join(str(g) for g in verdict.get("gpus") or []),
            "why": str(verdict.get("action_why", ""))[:WHY_MAX_CHARS],
        }
        with self._lock:
            self._labels = tuple(values[name] for name in TRIAGE_LABELS)
            self._judged_s = judged_s

    def describe(self):
        return []

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        with self._lock:
            labels, judged_s = self._labels, self._judged_s
        if labels is None:  # nothing judged yet: no series, rather than a made-up "no problem"
            return
        verdict = GaugeMetricFamily("diag_triage_verdict", SPECS["diag_triage_verdict"].help, labels=TRIAGE_LABELS)
        verdict.add_metric(list(labels), 1.0)
        yield verdict
        spec = SPECS["diag_triage_judged_timestamp_seconds"]
        judged = GaugeMetricFamily(spec.name, spec.help, labels=spec.labels)
        judged.add_metric([labels[TRIAGE_LABELS.index("run")]], judged_s)
        yield judged


def run_id_of(trace_dir: Path) -> str:
    """The run id the ranks' metrics carry (their manifests' ``run_id``), else the trace directory's name."""
    for manifest in sorted(Path(trace_dir).glob("rank*/manifest.json")):
        try:
            run_id = json.loads(manifest.read_text()).get("run_id")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(run_id, str) and run_id:
            return run_id
    return Path(trace_dir).name


def serve_verdict(metrics: VerdictMetrics, port: int, addr: str):
    """Serve ``metrics`` on http://addr:port/metrics from a daemon thread (OSError when the port is taken)."""
    from prometheus_client import CollectorRegistry

    from diag.metrics.prometheus import serve

    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    return serve(registry, port, addr)
