"""Prometheus metrics from the records capture already produces: step time, MFU, collectives, memory, GPU.

Nothing here runs on the training thread. The trace writer hands each batch of rows it flushes (every
``flush_interval_s``, on its own thread) to the session's metrics sink, which folds them into running totals;
Prometheus reads those totals over HTTP from a private registry. The training loop therefore pays nothing for
the export, and the metrics lag the trace files by at most one flush interval.

The same ``RowMetrics`` folds rows read back from trace files (``diag telemetry TRACE_DIR``) and NVML readings
of every GPU on a node (``diag telemetry``), so one set of names, units and labels serves all three.

Names follow Prometheus conventions (base units, ratios 0-1, ``_total`` counters, ``diag_`` prefix); GPU
metrics follow DCGM exporter's fields (``METRICS`` names each counterpart). No torch import: the node agent
uses this module.
"""

from __future__ import annotations

import bisect
import logging
import math
import statistics
import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from diag._warn import warn_once
from diag.analysis.peaks import mfu_of, peak_flops_per_s
from diag.trace.manifest import Manifest
from diag.trace.records import Heartbeat, Stall
from diag.trace.schema import TABLES, THROTTLE_REASONS

log = logging.getLogger("diag")

RANK_LABELS = ("run", "rank", "local_rank", "host")
GPU_LABELS = (*RANK_LABELS, "gpu", "uuid", "model")
INFO_LABELS = (*RANK_LABELS, "world_size", "backend", "device")

# Step durations span milliseconds (small models) to minutes (large ones at scale).
STEP_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

# The parts of a step that steps.csv breaks out, as values of the ``part`` label.
STEP_PARTS = {
    "forward": "forward_us",
    "backward": "backward_us",
    "optimizer": "optimizer_us",
    "comm_wait": "comm_wait_us",
    "data_wait": "data_wait_us",
}

BYTES_PER_KIB = 1024  # NVML reports PCIe throughput in KB/s of 1024 bytes
# diag_straggler_score: each rank's median busy time over its last steps (enough to ride over a one-off spike,
# few enough to follow a rank that became slow), once it has a few
STRAGGLER_WINDOW_STEPS = 50
STRAGGLER_MIN_STEPS = 5
# Label values that come from the user's names (phases, process groups, ops) are capped per source: 300,000
# distinct phase names made /metrics 62 MB and 7 s a scrape. Beyond the cap, new ones are counted under
# OTHER_LABEL (one warning); the trace keeps every name.
MAX_PHASE_NAMES = 200
MAX_COLLECTIVE_SERIES = 200  # (op, process group) pairs
MAX_PENDING_GROUPS = 200
OTHER_LABEL = "other"


@dataclass(frozen=True)
class MetricSpec:
    """One exported metric family: its exposed name, type, labels and, for GPU metrics, DCGM's counterpart."""

    name: str  # as a query names it (counters end in _total; a histogram adds _bucket, _sum, _count)
    kind: str  # counter, gauge, histogram
    unit: str  # seconds, bytes, ratio, ... ("" for counts)
    help: str
    labels: tuple[str, ...] = RANK_LABELS
    dcgm: str | None = None  # DCGM exporter field it corresponds to, with DCGM's unit where it differs

    @property
    def sample_names(self) -> tuple[str, ...]:
        if self.kind == "histogram":
            return (f"{self.name}_bucket", f"{self.name}_sum", f"{self.name}_count")
        return (self.name,)


def _gpu(name, unit, help_text, dcgm, extra=()):
    return MetricSpec(name, "gauge", unit, help_text, (*GPU_LABELS, *extra), dcgm)


METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("diag_rank_info", "gauge", "1", "1 for every rank exported; its labels describe the rank", INFO_LABELS),
    MetricSpec("diag_steps_total", "counter", "steps", "training steps recorded (completed or failed)"),
    MetricSpec("diag_step_duration_seconds", "histogram", "seconds", "host wall time of the step body"),
    MetricSpec("diag_last_step_index", "gauge", "step", "index of the last step recorded"),
    MetricSpec(
        "diag_last_step_end_timestamp_seconds", "gauge", "seconds", "Unix time the last recorded step ended (stalls)"
    ),
    MetricSpec(
        "diag_step_breakdown_seconds_total",
        "counter",
        "seconds",
        "time in each part of steps: forward, backward, optimizer, comm_wait (blocked in collectives), data_wait "
        "(blocked in the data loader, before the step body)",
        (*RANK_LABELS, "part"),
    ),
    MetricSpec("diag_step_device_seconds_total", "counter", "seconds", "GPU time of steps from CUDA events"),
    MetricSpec("diag_samples_total", "counter", "samples", "samples in recorded steps, when given to diag.step"),
    MetricSpec("diag_tokens_total", "counter", "tokens", "tokens in recorded steps, when given to diag.step"),
    MetricSpec("diag_model_flops_total", "counter", "FLOPs", "model FLOPs of recorded steps (flops_per_step x steps)"),
    MetricSpec("diag_device_peak_flops", "gauge", "FLOP/s", "dense peak FLOP/s of the device for the training dtype"),
    MetricSpec(
        "diag_mfu_ratio",
        "gauge",
        "ratio",
        "model FLOPs utilisation of the steps in the last flush: FLOPs / (step body + data wait) / peak",
    ),
    MetricSpec(
        "diag_phase_seconds_total",
        "counter",
        "seconds",
        "host time in spans marked with diag.phase",
        (*RANK_LABELS, "phase"),
    ),
    MetricSpec("diag_phases_total", "counter", "spans", "spans marked with diag.phase", (*RANK_LABELS, "phase")),
    MetricSpec(
        "diag_collectives_total",
        "counter",
        "operations",
        "collective and point-to-point operations issued",
        (*RANK_LABELS, "op", "pg"),
    ),
    MetricSpec(
        "diag_collective_seconds_total",
        "counter",
        "seconds",
        "issue-to-completion time of collectives whose completion was seen",
        (*RANK_LABELS, "op", "pg"),
    ),
    MetricSpec(
        "diag_collective_wait_seconds_total",
        "counter",
        "seconds",
        "time the caller was blocked in synchronous (async_op=False) collectives",
        (*RANK_LABELS, "op", "pg"),
    ),
    MetricSpec(
        "diag_collective_bytes_total",
        "counter",
        "bytes",
        "bytes this rank contributed to collectives (input tensor sizes)",
        (*RANK_LABELS, "op", "pg"),
    ),
    MetricSpec(
        "diag_memory_allocated_bytes", "gauge", "bytes", "CUDA caching allocator: allocated at the last step end"
    ),
    MetricSpec(
        "diag_memory_allocated_peak_bytes", "gauge", "bytes", "CUDA caching allocator: peak allocated in the last step"
    ),
    MetricSpec("diag_memory_reserved_bytes", "gauge", "bytes", "CUDA caching allocator: reserved at the last step end"),
    MetricSpec(
        "diag_memory_reserved_peak_bytes", "gauge", "bytes", "CUDA caching allocator: peak reserved in the last step"
    ),
    MetricSpec(
        "diag_memory_fragmentation_ratio",
        "gauge",
        "ratio",
        "reserved but unallocated share of reserved memory at the last step end",
    ),
    MetricSpec(
        "diag_memory_rss_bytes", "gauge", "bytes", "resident set size of the rank's process at the last step end"
    ),
    MetricSpec(
        "diag_memory_alloc_retries_total", "counter", "retries", "cudaMalloc retries after freeing the allocator cache"
    ),
    MetricSpec("diag_memory_ooms_total", "counter", "errors", "CUDA out-of-memory errors"),
    MetricSpec(
        "diag_heartbeat_timestamp_seconds",
        "gauge",
        "seconds",
        "Unix time of the rank's last watchdog heartbeat (every heartbeat_interval_s): stale when the process is "
        "frozen, dead or its host is gone",
    ),
    MetricSpec(
        "diag_collective_pending_seconds",
        "gauge",
        "seconds",
        "at the last heartbeat, how long the oldest collective still pending in each group had been pending "
        "(0: none pending)",
        (*RANK_LABELS, "pg"),
    ),
    MetricSpec(
        "diag_hang_stalled_seconds",
        "gauge",
        "seconds",
        "present only while the watchdog sees a stall (a collective pending, or no progress, past "
        "hang_threshold_s): how long, with the collective (op, pg, seq; empty when the step itself is stuck)",
        (*RANK_LABELS, "pg", "op", "seq"),
    ),
    MetricSpec(
        "diag_straggler_score",
        "gauge",
        "ratio",
        "the rank's median busy time per step (data wait + step body - time blocked in collectives) over its "
        "last steps, divided by the median of the other ranks' (1: like the others). Only from `diag telemetry "
        "TRACE_DIR`, which sees every rank; ranks serving themselves get the recording rule "
        "diag:rank_straggler_score (dashboards/alerts.yml)",
    ),
    _gpu(
        "diag_gpu_utilization_ratio", "ratio", "GPU utilisation (time a kernel was running)", "DCGM_FI_DEV_GPU_UTIL (%)"
    ),
    _gpu(
        "diag_gpu_memory_utilization_ratio", "ratio", "memory controller utilisation", "DCGM_FI_DEV_MEM_COPY_UTIL (%)"
    ),
    _gpu("diag_gpu_memory_used_bytes", "bytes", "device memory used", "DCGM_FI_DEV_FB_USED (MiB)"),
    _gpu("diag_gpu_memory_total_bytes", "bytes", "device memory total", "DCGM_FI_DEV_FB_TOTAL (MiB)"),
    _gpu("diag_gpu_power_usage_watts", "watts", "power draw", "DCGM_FI_DEV_POWER_USAGE"),
    _gpu("diag_gpu_power_limit_watts", "watts", "enforced power limit", "DCGM_FI_DEV_ENFORCED_POWER_LIMIT"),
    _gpu("diag_gpu_temperature_celsius", "celsius", "GPU temperature", "DCGM_FI_DEV_GPU_TEMP"),
    _gpu("diag_gpu_sm_clock_hertz", "hertz", "current SM clock", "DCGM_FI_DEV_SM_CLOCK (MHz)"),
    _gpu("diag_gpu_sm_clock_max_hertz", "hertz", "maximum SM clock", "DCGM_FI_DEV_MAX_SM_CLOCK (MHz)"),
    _gpu(
        "diag_gpu_clock_throttle_reasons",
        "bitmask",
        "NVML clock-event (throttle) reason bitmask",
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS (newer DCGM: DCGM_FI_DEV_CLOCKS_EVENT_REASONS)",
    ),
    _gpu(
        "diag_gpu_clock_throttle_active",
        "0 or 1",
        "1 while the named clock-event reason is active, 0 otherwise",
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS (one bit)",
        ("reason",),
    ),
    _gpu(
        "diag_gpu_pcie_tx_bytes_per_second",
        "bytes/s",
        "PCIe transmit throughput (NVML's 20 ms sample)",
        "DCGM_FI_PROF_PCIE_TX_BYTES (DCGM_FI_DEV_PCIE_TX_THROUGHPUT, KB/s)",
    ),
    _gpu(
        "diag_gpu_pcie_rx_bytes_per_second",
        "bytes/s",
        "PCIe receive throughput (NVML's 20 ms sample)",
        "DCGM_FI_PROF_PCIE_RX_BYTES (DCGM_FI_DEV_PCIE_RX_THROUGHPUT, KB/s)",
    ),
    replace(
        _gpu(
            "diag_gpu_ecc_corrected_errors_total",
            "errors",
            "volatile corrected ECC errors",
            "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        ),
        kind="counter",
    ),
    replace(
        _gpu(
            "diag_gpu_ecc_uncorrected_errors_total",
            "errors",
            "volatile uncorrected ECC errors",
            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        ),
        kind="counter",
    ),
    replace(
        _gpu(
            "diag_gpu_xid_errors_total",
            "errors",
            "XID errors seen, by XID code",
            "DCGM_FI_DEV_XID_ERRORS (the last XID code, a gauge)",
            ("xid",),
        ),
        kind="counter",
    ),
)
# served by ``diag triage --watch --prometheus-port`` (diag/metrics/verdict.py), not by the ranks: no rank labels
TRIAGE_LABELS = ("run", "verdict", "culprit_ranks", "action", "hosts", "gpus", "why")
TRIAGE_METRICS: tuple[MetricSpec, ...] = (
    MetricSpec(
        "diag_triage_verdict",
        "gauge",
        "1",
        "1 for the latest verdict of `diag triage --watch --prometheus-port` (labels without rank, local_rank and "
        "host): what went wrong, which ranks, and what to do next (action fix_code, restart, evict or none; the "
        "hosts and GPUs to evict; why)",
        TRIAGE_LABELS,
    ),
    MetricSpec(
        "diag_triage_judged_timestamp_seconds",
        "gauge",
        "seconds",
        "Unix time of that verdict (labels: run only)",
        ("run",),
    ),
)
SPECS = {spec.name: spec for spec in (*METRICS, *TRIAGE_METRICS)}


def exported_sample_names() -> set[str]:
    """Every sample name diag can expose (histograms with their _bucket, _sum and _count series): the ranks', the
    node agent's and ``diag triage --watch``'s."""
    return {name for spec in SPECS.values() for name in spec.sample_names}


def render_metric_table() -> str:
    """The metric table of docs/prometheus.md, generated from ``METRICS`` and ``TRIAGE_METRICS``."""
    lines = [
        "| metric | type | unit | labels beyond run, rank, local_rank, host | meaning | DCGM exporter |",
        "|---|---|---|---|---|---|",
    ]
    for spec in SPECS.values():
        extra = ", ".join(label for label in spec.labels if label not in RANK_LABELS) or ""
        field_name, _, note = (spec.dcgm or "").partition(" ")
        dcgm = f"`{field_name}` {note}".strip() if field_name else ""
        lines.append(f"| `{spec.name}` | {spec.kind} | {spec.unit} | {extra} | {spec.help} | {dcgm} |")
    return "\n".join(lines) + "\n"


# -- the running totals ---------------------------------------------------------------------------------------
@dataclass
class RankLabels:
    """Who a source of rows is: the rank's labels, and the GPU's for GPU metrics (empty strings when unknown)."""

    run: str = ""
    rank: str = ""
    local_rank: str = ""
    host: str = ""
    world_size: str = ""
    backend: str = ""
    device: str = ""
    gpu_uuid: str = ""
    gpu_model: str = ""

    @classmethod
    def from_manifest(cls, manifest: Manifest) -> RankLabels:
        def text(value) -> str:
            return "" if value is None else str(value)

        return cls(
            run=text(manifest.run_id),
            rank=text(manifest.rank),
            local_rank=text(manifest.local_rank),
            host=text(manifest.host),
            world_size=text(manifest.world_size),
            backend=text(manifest.backend),
            device=text(manifest.device),
            gpu_uuid=normalise_uuid(text(manifest.gpu_uuid)),
            gpu_model=text(manifest.device_name) if manifest.gpu_uuid else "",
        )

    def rank_values(self) -> tuple[str, ...]:
        return (self.run, self.rank, self.local_rank, self.host)


def normalise_uuid(uuid: str) -> str:
    """torch prints a GPU's UUID bare; NVML and DCGM's ``UUID`` label write it ``GPU-...``."""
    return uuid if not uuid or uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"


@dataclass
class _Collective:
    count: int = 0
    seconds: float = 0.0
    wait_seconds: float = 0.0
    bytes: int = 0


@dataclass
class _Gpu:
    values: dict[str, float] = field(default_factory=dict)  # spec name -> last value
    throttle: int | None = None
    xids: dict[int, int] = field(default_factory=dict)


class MetricsSource:
    """Running totals of one rank (or one GPU of a node): rows in, metric values out. Not thread-safe by
    itself: ``RowMetrics`` serialises access."""

    def __init__(self, labels: RankLabels, lock: threading.Lock):
        self.labels = labels
        self.flops_per_step: float | None = None
        self.peak_flops: float | None = None  # FLOP/s
        self._lock = lock
        self.steps = 0
        self.step_buckets = [0] * len(STEP_BUCKETS_S)
        self.step_seconds = 0.0
        self.last_step: int | None = None
        self.last_step_end_s: float | None = None
        self.parts = dict.fromkeys(STEP_PARTS, 0.0)
        self.device_seconds: float | None = None
        self.samples: int | None = None
        self.tokens: int | None = None
        self.model_flops = 0.0
        self.mfu: float | None = None
        self.phases: dict[str, list] = {}  # name -> [count, seconds]
        self.collectives: dict[tuple[str, str], _Collective] = {}
        self.memory: dict[str, float] = {}
        self.gpus: dict[str, _Gpu] = {}  # NVML index -> last readings
        self.heartbeat_s: float | None = None
        self.pending_s: dict[str, float] = {}  # pg -> age of its oldest pending collective at the last heartbeat
        self.stall: Stall | None = None  # the watchdog's stall record while it sees one
        self.recent_busy_s: deque = deque(maxlen=STRAGGLER_WINDOW_STEPS)
        self.straggler_score: float | None = None  # set by whoever sees every rank (the node agent)

    def observe(self, table: str, rows: Iterable) -> None:
        """Fold rows of ``table`` (tuples in the schema's column order) into the totals."""
        handler = _HANDLERS.get(table)
        if handler is None:
            return
        with self._lock:
            handler(self, rows)

    # -- per table --------------------------------------------------------------------------------------------
    def _steps(self, rows) -> None:
        iteration_s = 0.0
        counted = 0
        for row in rows:
            seconds = row.duration_us / 1e6
            data_wait_us, comm_us = row.data_wait_us or 0, row.comm_wait_us or 0
            self.steps += 1
            index = bisect.bisect_left(STEP_BUCKETS_S, seconds)
            if index < len(self.step_buckets):
                self.step_buckets[index] += 1
            self.step_seconds += seconds
            for part, value in zip(
                self.parts, (row.forward_us, row.backward_us, row.optimizer_us, comm_us, data_wait_us)
            ):
                self.parts[part] += (value or 0) / 1e6
            if _present(row.device_us):
                self.device_seconds = (self.device_seconds or 0.0) + row.device_us / 1e6
            if _present(row.samples):
                self.samples = (self.samples or 0) + int(row.samples)
            if _present(row.tokens):
                self.tokens = (self.tokens or 0) + int(row.tokens)
            end_s = (row.start_us + row.duration_us) / 1e6
            if self.last_step_end_s is None or end_s >= self.last_step_end_s:
                self.last_step, self.last_step_end_s = int(row.step), end_s
            iteration_s += seconds + data_wait_us / 1e6
            counted += 1
            self.recent_busy_s.append(seconds + (data_wait_us - comm_us) / 1e6)
        if self.flops_per_step and counted:
            self.model_flops += self.flops_per_step * counted
            if self.peak_flops and iteration_s > 0:
                self.mfu = mfu_of(self.flops_per_step * counted, iteration_s, self.peak_flops)

    def _phases(self, rows) -> None:
        for row in rows:
            name = str(row.name)
            if name not in self.phases and len(self.phases) >= MAX_PHASE_NAMES:
                name = _over_cap("phase names", MAX_PHASE_NAMES, "phase")
            totals = self.phases.setdefault(name, [0, 0.0])
            totals[0] += 1
            totals[1] += row.duration_us / 1e6

    def _collectives(self, rows) -> None:
        for row in rows:
            key = (str(row.op), str(row.pg))
            totals = self.collectives.get(key)
            if totals is None and len(self.collectives) >= MAX_COLLECTIVE_SERIES:
                key = (OTHER_LABEL, _over_cap("(op, process group) pairs", MAX_COLLECTIVE_SERIES, "op and pg"))
                totals = self.collectives.get(key)
            if totals is None:
                totals = self.collectives[key] = _Collective()
            totals.count += 1
            totals.bytes += int(row.bytes or 0)
            if _present(row.duration_us):
                totals.seconds += row.duration_us / 1e6
                if row.blocking:
                    totals.wait_seconds += row.duration_us / 1e6

    def _memory(self, rows) -> None:
        if not rows:
            return
        last = rows[-1]  # gauges
        allocated, reserved = last.allocated_bytes, last.reserved_bytes
        values = {
            "diag_memory_allocated_bytes": allocated,
            "diag_memory_allocated_peak_bytes": last.allocated_peak_bytes,
            "diag_memory_reserved_bytes": reserved,
            "diag_memory_reserved_peak_bytes": last.reserved_peak_bytes,
            "diag_memory_rss_bytes": last.rss_bytes,
            "diag_memory_alloc_retries_total": last.alloc_retries,
            "diag_memory_ooms_total": last.ooms,
        }
        if _present(allocated) and _present(reserved) and reserved > 0:
            values["diag_memory_fragmentation_ratio"] = (reserved - allocated) / reserved
        self.memory.update({name: float(v) for name, v in values.items() if _present(v)})

    def _telemetry(self, rows) -> None:
        for row in rows:
            state = self.gpus.get(str(row.gpu))
            if state is None:
                state = self.gpus[str(row.gpu)] = _Gpu()
            for name, value, factor in (
                ("diag_gpu_utilization_ratio", row.util_pct, 0.01),
                ("diag_gpu_memory_utilization_ratio", row.mem_util_pct, 0.01),
                ("diag_gpu_memory_used_bytes", row.mem_used_bytes, 1),
                ("diag_gpu_memory_total_bytes", row.mem_total_bytes, 1),
                ("diag_gpu_power_usage_watts", row.power_w, 1),
                ("diag_gpu_power_limit_watts", row.power_limit_w, 1),
                ("diag_gpu_temperature_celsius", row.temp_c, 1),
                ("diag_gpu_sm_clock_hertz", row.sm_clock_mhz, 1e6),
                ("diag_gpu_sm_clock_max_hertz", row.sm_clock_max_mhz, 1e6),
                ("diag_gpu_pcie_tx_bytes_per_second", row.pcie_tx_kib_per_s, BYTES_PER_KIB),
                ("diag_gpu_pcie_rx_bytes_per_second", row.pcie_rx_kib_per_s, BYTES_PER_KIB),
                ("diag_gpu_ecc_corrected_errors_total", row.ecc_corrected, 1),
                ("diag_gpu_ecc_uncorrected_errors_total", row.ecc_uncorrected, 1),
            ):
                if _present(value):
                    state.values[name] = float(value) * factor
            if _present(row.throttle_reasons):
                state.throttle = int(row.throttle_reasons)
            if _present(row.xid):
                state.xids[int(row.xid)] = state.xids.get(int(row.xid), 0) + 1

    def _heartbeat(self, records) -> None:
        """The watchdog's heartbeat (in training, as it is written; in the agent, heartbeat.json read back)."""
        heartbeat = Heartbeat.from_json(records[-1])
        if heartbeat is None or heartbeat.time_us is None:
            return
        time_us = heartbeat.time_us
        self.heartbeat_s = time_us / 1e6
        oldest: dict[str, float] = dict.fromkeys(self.pending_s, 0.0)  # groups seen before: 0 when none pending
        for entry in heartbeat.pending:
            if entry.start_us is not None:
                pg = str(entry.pg)
                if pg not in oldest and len(oldest) >= MAX_PENDING_GROUPS:
                    pg = _over_cap("process groups with pending collectives", MAX_PENDING_GROUPS, "pg")
                oldest[pg] = max(oldest.get(pg, 0.0), max(time_us - entry.start_us, 0.0) / 1e6)
        self.pending_s = oldest
        self.stall = heartbeat.stall


def _over_cap(what: str, cap: int, label: str) -> str:
    warn_once(
        f"prometheus-cap-{what}",
        f"more than {cap} distinct {what} in one rank's metrics: the others are exported under "
        f'{label}="{OTHER_LABEL}" (the trace keeps every name)',
    )
    return OTHER_LABEL


def straggler_scores(sources: Iterable[MetricsSource]) -> None:
    """Each source's straggler score against the *other* sources (the median of two ranks is their average:
    comparing with it would halve a 2-rank job's straggler). Sources with too few recent steps get none."""
    medians = {
        id(source): statistics.median(source.recent_busy_s)
        for source in sources
        if len(source.recent_busy_s) >= STRAGGLER_MIN_STEPS
    }
    for source in sources:
        own = medians.get(id(source))
        others = [m for key, m in medians.items() if key != id(source)]
        reference = statistics.median(others) if others else None
        source.straggler_score = own / reference if own is not None and reference else None


_HANDLERS = {
    "heartbeat": MetricsSource._heartbeat,
    "steps": MetricsSource._steps,
    "phases": MetricsSource._phases,
    "collectives": MetricsSource._collectives,
    "memory": MetricsSource._memory,
    "telemetry": MetricsSource._telemetry,
}


def _present(value) -> bool:
    """Not None and not NaN (rows read back through pandas carry NaN for empty cells)."""
    return value is not None and not (isinstance(value, float) and math.isnan(value))


class RowMetrics:
    """A prometheus_client collector over any number of sources (ranks, GPUs). Register it in a registry."""

    def __init__(self):
        self._lock = threading.Lock()
        self._sources: list[MetricsSource] = []

    def source(self, labels: RankLabels) -> MetricsSource:
        source = MetricsSource(labels, self._lock)
        with self._lock:
            self._sources.append(source)
        return source

    def remove(self, source: MetricsSource) -> None:
        with self._lock:
            self._sources = [s for s in self._sources if s is not source]

    def describe(self):
        return [self._family(spec) for spec in METRICS]

    def collect(self):
        families = {spec.name: self._family(spec) for spec in METRICS}
        with self._lock:
            for source in self._sources:
                _add_source(families, source)
        return list(families.values())

    @staticmethod
    def _family(spec: MetricSpec):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        kinds = {"counter": CounterMetricFamily, "gauge": GaugeMetricFamily, "histogram": HistogramMetricFamily}
        return kinds[spec.kind](spec.name, spec.help, labels=spec.labels)


def _add_source(families: dict, source: MetricsSource) -> None:
    labels = source.labels
    rank = labels.rank_values()
    if labels.rank:
        families["diag_rank_info"].add_metric([*rank, labels.world_size, labels.backend, labels.device], 1)
    if source.steps:
        families["diag_steps_total"].add_metric(rank, source.steps)
        cumulative, buckets = 0, []
        for bound, count in zip(STEP_BUCKETS_S, source.step_buckets):
            cumulative += count
            buckets.append((_float_text(bound), cumulative))
        buckets.append(("+Inf", source.steps))
        families["diag_step_duration_seconds"].add_metric(rank, buckets, source.step_seconds)
        families["diag_last_step_index"].add_metric(rank, source.last_step)
        families["diag_last_step_end_timestamp_seconds"].add_metric(rank, source.last_step_end_s)
        for part, seconds in source.parts.items():
            families["diag_step_breakdown_seconds_total"].add_metric([*rank, part], seconds)
        for name, value in (
            ("diag_step_device_seconds_total", source.device_seconds),
            ("diag_samples_total", source.samples),
            ("diag_tokens_total", source.tokens),
            ("diag_mfu_ratio", source.mfu),
        ):
            if value is not None:
                families[name].add_metric(rank, value)
        if source.flops_per_step:
            families["diag_model_flops_total"].add_metric(rank, source.model_flops)
    if source.peak_flops:
        families["diag_device_peak_flops"].add_metric(rank, source.peak_flops)
    for name, (count, seconds) in source.phases.items():
        families["diag_phases_total"].add_metric([*rank, name], count)
        families["diag_phase_seconds_total"].add_metric([*rank, name], seconds)
    for (op, pg), totals in source.collectives.items():
        key = [*rank, op, pg]
        families["diag_collectives_total"].add_metric(key, totals.count)
        families["diag_collective_seconds_total"].add_metric(key, totals.seconds)
        families["diag_collective_wait_seconds_total"].add_metric(key, totals.wait_seconds)
        families["diag_collective_bytes_total"].add_metric(key, totals.bytes)
    for name, value in source.memory.items():
        families[name].add_metric(rank, value)
    if source.heartbeat_s is not None:
        families["diag_heartbeat_timestamp_seconds"].add_metric(rank, source.heartbeat_s)
    for pg, seconds in source.pending_s.items():
        families["diag_collective_pending_seconds"].add_metric([*rank, pg], seconds)
    if source.stall is not None:
        stall = source.stall
        families["diag_hang_stalled_seconds"].add_metric(
            [*rank, _label(stall.pg), _label(stall.op), _label(stall.seq)], float(stall.seconds)
        )
    if source.straggler_score is not None:
        families["diag_straggler_score"].add_metric(rank, source.straggler_score)
    for gpu, state in source.gpus.items():
        gpu_labels = [*rank, gpu, labels.gpu_uuid, labels.gpu_model]
        for name, value in state.values.items():
            families[name].add_metric(gpu_labels, value)
        if state.throttle is not None:
            families["diag_gpu_clock_throttle_reasons"].add_metric(gpu_labels, state.throttle)
            for bit, reason in THROTTLE_REASONS.items():
                families["diag_gpu_clock_throttle_active"].add_metric(
                    [*gpu_labels, reason], int(bool(state.throttle & bit))
                )
        for xid, count in state.xids.items():
            families["diag_gpu_xid_errors_total"].add_metric([*gpu_labels, str(xid)], count)


def _label(value) -> str:
    return "" if value is None else str(value)


def _float_text(value: float) -> str:
    return repr(float(value))


def peak_flops_of(manifest: Manifest) -> float | None:
    """Dense peak FLOP/s: the user's ``peak_tflops``, else the datasheet table for the device and dtype."""
    return peak_flops_per_s(manifest.peak_tflops, manifest.device_name, manifest.dtype)


def row_tuples(frame, table: str) -> list[tuple]:
    """Rows of a loaded table (pandas) as the table's ``row_type``, with None for empty cells."""
    columns = TABLES[table].column_names
    values = frame[columns].astype(object)
    make = TABLES[table].row_type._make
    return [make(row) for row in values.where(values.notna(), None).itertuples(index=False, name=None)]


# -- serving --------------------------------------------------------------------------------------------------
def new_registry(metrics: RowMetrics):
    """A private registry (not prometheus_client's global one) holding only diag's metrics."""
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry(auto_describe=True)
    registry.register(metrics)
    return registry


def serve(registry, port: int, addr: str):
    """Serve ``registry`` on http://addr:port/metrics from a daemon thread; returns the server (OSError when
    the port is taken). The server times out idle and slow connections and bounds them per client
    (diag/metrics/endpoint.py): prometheus_client's own has no timeouts."""
    from prometheus_client import make_wsgi_app

    from diag.metrics.endpoint import serve_wsgi

    return serve_wsgi(make_wsgi_app(registry), port, addr)


def stop_serving(server) -> None:
    if server is not None:
        server.shutdown()
        server.server_close()


class MetricsSink:
    """What a session holds when Prometheus export is off: takes rows and does nothing with them."""

    status = "off"

    def observe(self, table: str, rows: list) -> None:
        pass

    def close(self) -> None:
        pass


class PrometheusSink(MetricsSink):
    """Serves this rank's metrics on ``addr:port``. ``observe`` runs on the trace writer's thread; an error in
    it turns the export off with one warning and never reaches the writer (the trace files go on)."""

    def __init__(self, port: int, addr: str, manifest: dict):
        self.port, self.addr = port, addr
        self._manifest = manifest  # the session's, updated in place (FLOPs counted at step 1 arrive late)
        self.metrics = RowMetrics()
        self.registry = new_registry(self.metrics)
        self.source = self.metrics.source(RankLabels.from_manifest(self._parsed()))
        self._server = serve(self.registry, port, addr)
        if self._server is not None:
            self.port = self._server.server_port  # port 0: the one the system chose
        self.status = f"on: http://{addr}:{self.port}/metrics"

    def observe(self, table: str, rows: list) -> None:
        try:
            self._fold(table, rows)
        except Exception as exc:
            self._fold = _ignore_rows  # stale metrics from now on; the writer and the trace go on
            self.status = f"off: failed ({exc!r})"
            warn_once("prometheus-observe", f"Prometheus metrics stopped updating ({exc!r}); the trace goes on")

    def _fold(self, table: str, rows: list) -> None:
        if table == "steps":
            manifest = self._parsed()
            self.source.flops_per_step = manifest.flops_per_step
            if self.source.peak_flops is None:
                self.source.peak_flops = peak_flops_of(manifest)
        self.source.observe(table, rows)

    def _parsed(self) -> Manifest:
        return Manifest.from_json(self._manifest, rank=int(self._manifest.get("rank") or 0))

    def close(self) -> None:
        stop_serving(self._server)
        self._server = None


def _ignore_rows(table: str, rows: list) -> None:
    pass


def start_metrics(port: int | None, addr: str, manifest: dict, local_rank: int) -> MetricsSink:
    """The sink for ``diag.init(prometheus_port=...)``: each rank of a node serves on ``port + local_rank``.
    A port that cannot be bound is one warning; capture goes on without the export."""
    if port is None:
        return MetricsSink()
    rank_port = int(port) + int(local_rank)
    try:
        return PrometheusSink(rank_port, addr, manifest)
    except Exception as exc:
        warn_once(
            "prometheus-port",
            f"cannot serve Prometheus metrics on {addr}:{rank_port} ({exc}); metrics export is off, capture goes on",
        )
        sink = MetricsSink()
        sink.status = f"off: cannot serve on {addr}:{rank_port} ({exc})"
        return sink
