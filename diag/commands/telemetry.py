"""``diag telemetry``: a node agent serving Prometheus metrics. It samples NVML for every GPU of the node and,
given a live TRACE_DIR, follows what the ranks of this node write there, so a job can be watched from
Prometheus without an HTTP server inside training. Never imports torch."""

from __future__ import annotations

import signal
import socket
import threading
from dataclasses import dataclass
from pathlib import Path

import click

from diag.commands._options import poll_seconds
from diag.commands.exit_codes import InputError
from diag.metrics.nvml import XidEvents, decode_sample, open_nvml, read_sample
from diag.metrics.prometheus import (
    MetricsSource,
    RankLabels,
    RowMetrics,
    new_registry,
    normalise_uuid,
    peak_flops_of,
    row_tuples,
    serve,
    stop_serving,
    straggler_scores,
)
from diag.trace.manifest import Manifest, parse_manifests
from diag.views.format import printable

FOLLOWED_TABLES = ("steps", "phases", "collectives", "memory", "telemetry")


MAX_NOTES_SAID = 1000  # unreadable files named on stderr: beyond this many, the agent stays quiet about more


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass
class _Device:
    index: int
    handle: object
    uuid: str
    source: MetricsSource


class NodeGpus:
    """Every GPU NVML sees on this node, each a metrics source labelled with its index, UUID and model; the
    rank that uses it is added to its labels once a manifest in TRACE_DIR names its UUID."""

    def __init__(self, nvml, metrics: RowMetrics, host: str):
        self.nvml = nvml
        self.host = host
        self.devices: list[_Device] = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = normalise_uuid(_text(nvml.nvmlDeviceGetUUID(handle)))
            labels = RankLabels(host=host, gpu_uuid=uuid, gpu_model=_text(nvml.nvmlDeviceGetName(handle)))
            self.devices.append(_Device(index, handle, uuid, metrics.source(labels)))
        self._xids = XidEvents(nvml, {device.index: device.handle for device in self.devices})

    def sample(self) -> None:
        self._xids.poll()
        for device in self.devices:
            try:
                row = decode_sample(
                    read_sample(self.nvml, device.handle), device.index, self._xids.next_for(device.index)
                )
            except Exception:  # a GPU that stops answering keeps its last readings; the others go on
                continue
            device.source.observe("telemetry", [row])

    def assign_ranks(self, manifests: dict[int, Manifest]) -> None:
        for manifest in manifests.values():
            uuid = normalise_uuid(manifest.gpu_uuid or "")
            for device in self.devices:
                if uuid and device.uuid == uuid and manifest.host == self.host:
                    ranked = RankLabels.from_manifest(manifest)
                    device.source.labels = RankLabels(
                        run=ranked.run,
                        rank=ranked.rank,
                        local_rank=ranked.local_rank,
                        host=self.host,
                        gpu_uuid=device.uuid,
                        gpu_model=device.source.labels.gpu_model,
                    )


class TraceFollower:
    """Tails TRACE_DIR (incrementally, like the live dashboard) and folds the new rows of each rank on this
    host into its own metrics source, labelled from the rank's manifest."""

    def __init__(self, trace_dir: Path, metrics: RowMetrics, host: str | None, gpus: NodeGpus | None = None):
        from diag.trace.loader import TraceReader

        self.trace_dir = trace_dir
        self.metrics = metrics
        self.host = host  # None: every host
        self.gpus = gpus
        self.reader = TraceReader(trace_dir, FOLLOWED_TABLES)
        self.manifests: dict[int, Manifest] = {}
        self.sources: dict[int, MetricsSource] = {}
        self.problem: str | None = None  # why nothing is exported, in words, once
        self._said: set[str] = set()  # files named as unreadable (each once)

    def poll(self) -> None:
        from diag.trace.loader import TraceError

        try:
            data = self.reader.poll()
        except TraceError as exc:
            self._say(f"{exc}; waiting for the job to write it")
            return
        except Exception as exc:  # noqa: BLE001 - the agent (and the GPU metrics it serves) outlives one bad read
            self._say(f"could not read {self.trace_dir}: {type(exc).__name__}: {str(exc)[:300]}; trying again")
            return
        for note in data["skipped"]:  # a file that cannot be read: said once, skipped, the other ranks folded
            unreadable = "unreadable" in note.reason or "not read" in note.reason
            if unreadable and str(note) not in self._said and len(self._said) < MAX_NOTES_SAID:
                self._said.add(str(note))
                click.echo(printable(f"diag telemetry: {note}"), err=True)
        self.manifests.update(parse_manifests(data["manifests"], []))  # the analysis names odd values
        if self.gpus is not None:
            self.gpus.assign_ranks(self.manifests)
        for table in FOLLOWED_TABLES:
            if table == "telemetry" and self.gpus is not None:
                continue  # this agent samples every GPU itself, fresher than the ranks' files
            frame = data[table]
            if frame.empty:
                continue
            for rank, rows in frame.groupby("rank", sort=False):
                source = self._source(int(rank))
                if source is not None:
                    source.observe(table, row_tuples(rows, table))
        heartbeats = data.get("heartbeats")
        for heartbeat in heartbeats.to_dict("records") if heartbeats is not None else []:
            source = self._source(int(heartbeat["rank"]))
            if source is not None:
                source.observe("heartbeat", [heartbeat])
        straggler_scores(list(self.sources.values()))
        if self.manifests and not self.sources:
            hosts = sorted({str(m.host) for m in self.manifests.values()})
            self._say(
                f"{len(self.manifests)} ranks in {self.trace_dir}, none on {self.host} (hosts {', '.join(hosts)}): pass --all-hosts to export them"
            )

    def _source(self, rank: int) -> MetricsSource | None:
        source = self.sources.get(rank)
        manifest = self.manifests.get(rank)
        if manifest is None or (self.host is not None and manifest.host != self.host):
            return None
        if source is None:
            source = self.sources[rank] = self.metrics.source(RankLabels.from_manifest(manifest))
        source.labels = RankLabels.from_manifest(manifest)  # the run id is settled after the first write
        source.flops_per_step = manifest.flops_per_step
        source.peak_flops = peak_flops_of(manifest)
        return source

    def _say(self, message: str) -> None:
        if message != self.problem:
            self.problem = message
            click.echo(printable(f"diag telemetry: {message}"), err=True)


@click.command("telemetry")
@click.argument("trace_dir", required=False, type=click.Path(path_type=Path, file_okay=False))
@click.option("--prometheus-port", required=True, type=int, help="Port to serve /metrics on.")
@click.option(
    "--bind",
    default="0.0.0.0",
    show_default=True,
    help="Address to bind. 0.0.0.0 lets Prometheus on another machine scrape it, and anyone else who can reach "
    "the port read the metrics (there is no authentication): bind 127.0.0.1 behind a local scraper.",
)
@click.option(
    "--interval",
    default=5.0,
    show_default=True,
    type=poll_seconds(),
    help="Seconds between NVML samples and reads of TRACE_DIR.",
)
@click.option(
    "--all-hosts",
    is_flag=True,
    help="Export every rank of TRACE_DIR, not only this host's (one agent for a whole job on a shared file system).",
)
def command(trace_dir, prometheus_port, bind, interval, all_hosts):
    """Serve Prometheus metrics of this node: NVML telemetry of every GPU (utilisation, memory, power,
    temperature, clocks, throttling, PCIe, ECC, XID) and, given TRACE_DIR, the step, MFU, collective and memory
    metrics of the ranks of this node, read from the files they write. Metric names and labels are those of
    diag.init(prometheus_port=...); see diag docs prometheus.

    \b
    Examples:
      diag telemetry --prometheus-port 9401                       GPUs of this node
      diag telemetry --prometheus-port 9401 /shared/traces/run1   and the ranks of this node
      diag telemetry --prometheus-port 9401 --all-hosts traces/run1   every rank, one agent
    then scrape http://NODE:9401/metrics (dashboards/prometheus.yml).
    """
    host = socket.gethostname()
    metrics = RowMetrics()
    nvml, no_gpu = open_nvml()
    if nvml is None and trace_dir is None:
        raise InputError(
            f"no GPU telemetry on {host}: {no_gpu}. Nothing to export: give a TRACE_DIR to export the ranks' metrics"
        )
    if nvml is None:
        click.echo(f"diag telemetry: no GPU telemetry on {host}: {no_gpu}; exporting the ranks' metrics only", err=True)
    gpus = NodeGpus(nvml, metrics, host) if nvml is not None else None
    follower = TraceFollower(trace_dir, metrics, None if all_hosts else host, gpus) if trace_dir is not None else None
    try:
        server = serve(new_registry(metrics), prometheus_port, bind)
    except OSError as exc:
        raise InputError(f"cannot serve on {bind}:{prometheus_port} ({exc}); choose another --prometheus-port") from exc
    what = [f"{len(gpus.devices)} GPUs"] if gpus is not None else []
    if follower is not None:
        what.append(f"ranks {'of every host' if all_hosts else 'of ' + host} in {trace_dir}")
    click.echo(f"Serving Prometheus metrics on http://{bind}:{prometheus_port}/metrics: {', '.join(what)}", err=True)

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while True:
            if gpus is not None:
                gpus.sample()
            if follower is not None:
                follower.poll()
            if stop.wait(interval):
                break
    except KeyboardInterrupt:
        pass
    finally:
        stop_serving(server)
