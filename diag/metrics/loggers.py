"""diag's per-step figures in the tools users already watch: TensorBoard and Weights & Biases.

Like the Prometheus sink, a logger sees each batch of rows the trace writer flushes, on the writer's thread,
never the training thread. ``StepLogger`` itself does nothing (a logger that is off is a real object, so no
caller asks whether logging is on); the TensorBoard and W&B loggers import their package in their
constructor only. A logger that fails is turned off with one warning; the trace goes on.

Series, all under ``diag/`` and indexed by diag's step (``diag/step`` on W&B, whose own step the user's
logging owns): step_time_s, data_wait_s, forward_s, backward_s, optimizer_s, comm_wait_s, device_s,
samples_per_s, tokens_per_s, loss, grad_norm, mfu (steps rows; MFU when the manifest has the step's FLOPs and
the device's peak, by the report's formula); memory_allocated_bytes, memory_reserved_bytes,
memory_allocated_peak_bytes, rss_bytes (memory rows); gpu_util_pct, gpu_power_w, gpu_temp_c, gpu_sm_clock_mhz
(telemetry rows, at the last step seen); and, as they happen, events/<kind>: how many of each problem the rank
has recorded so far (nonfinite, oom, step_error, collective_error, watchdog_dump, heartbeat_gap), each also a
line of text in TensorBoard (``diag/events``).
"""

from __future__ import annotations

import math
from pathlib import Path

from diag._warn import warn_once
from diag.analysis.peaks import mfu_of, peak_flops_per_s
from diag.trace.manifest import Manifest

# Events a user wants to see the moment they happen: the rank-local findings, before any analysis runs
ALERT_EVENTS = ("nonfinite", "oom", "step_error", "collective_error", "watchdog_dump", "heartbeat_gap")

_STEP_SECONDS = {
    "step_time_s": "duration_us",
    "data_wait_s": "data_wait_us",
    "forward_s": "forward_us",
    "backward_s": "backward_us",
    "optimizer_s": "optimizer_us",
    "comm_wait_s": "comm_wait_us",
    "device_s": "device_us",
}
_MEMORY = {
    "memory_allocated_bytes": "allocated_bytes",
    "memory_reserved_bytes": "reserved_bytes",
    "memory_allocated_peak_bytes": "allocated_peak_bytes",
    "rss_bytes": "rss_bytes",
}
_TELEMETRY = {
    "gpu_util_pct": "util_pct",
    "gpu_power_w": "power_w",
    "gpu_temp_c": "temp_c",
    "gpu_sm_clock_mhz": "sm_clock_mhz",
}


def _number(value) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def step_scalars(table: str, row, flops_per_step: float | None = None, peak_flops: float | None = None) -> dict:
    """The figures one row gives, by series name (without the ``diag/`` prefix); empty cells left out.
    ``flops_per_step``, ``peak_flops`` (FLOP/s): MFU of a steps row when both are known."""
    if table == "steps":
        out = {name: _number(getattr(row, column)) for name, column in _STEP_SECONDS.items()}
        out = {name: value / 1e6 for name, value in out.items() if value is not None}
        seconds = out.get("step_time_s")
        for name, column in (("samples_per_s", "samples"), ("tokens_per_s", "tokens")):
            count = _number(getattr(row, column))
            if count is not None and seconds:
                out[name] = count / seconds
        for name in ("loss", "grad_norm"):
            if (value := _number(getattr(row, name))) is not None:
                out[name] = value
        if flops_per_step and peak_flops and seconds:
            # the iteration includes the data wait before the step, as the Prometheus sink's MFU does
            out["mfu"] = mfu_of(flops_per_step, seconds + out.get("data_wait_s", 0.0), peak_flops)
        return out
    columns = {"memory": _MEMORY, "telemetry": _TELEMETRY}.get(table, {})
    values = {name: _number(getattr(row, column)) for name, column in columns.items()}
    return {name: value for name, value in values.items() if value is not None}


class StepLogger:
    """Logs nothing: what a session holds when no logger was asked for."""

    status = "off"

    def __init__(self, manifest: dict | None = None):
        self._last_step = 0
        self._manifest = manifest or {}  # the session's live manifest: FLOPs may be counted after a few steps
        self._event_counts: dict[str, int] = {}

    def observe(self, table: str, rows: list) -> None:
        try:
            if table == "events":
                self._observe_events(rows)
                return
            flops_per_step, peak_flops = self._mfu_inputs() if table == "steps" else (None, None)
            for row in rows:
                step = getattr(row, "step", None) if table != "telemetry" else None
                if step is not None and step >= 0:
                    self._last_step = int(step)
                scalars = step_scalars(table, row, flops_per_step, peak_flops)
                if scalars:
                    self.log(self._last_step, scalars)
        except Exception as exc:
            self.status = f"off: failed ({exc!r})"
            self.observe = _ignore  # the trace goes on without this logger
            warn_once(f"logger-{type(self).__name__}", f"{type(self).__name__} stopped ({exc!r}); the trace goes on")

    def _mfu_inputs(self) -> tuple[float | None, float | None]:
        manifest = Manifest.from_json(self._manifest, rank=int(self._manifest.get("rank") or 0))
        return manifest.flops_per_step, peak_flops_per_s(manifest.peak_tflops, manifest.device_name, manifest.dtype)

    def _observe_events(self, events: list[dict]) -> None:
        for event in events:
            kind = event.get("kind")
            if kind not in ALERT_EVENTS:
                continue
            self._event_counts[kind] = self._event_counts.get(kind, 0) + 1
            step = event.get("step")
            at_step = int(step) if isinstance(step, int) and step >= 0 else self._last_step
            self.log(at_step, {f"events/{kind}": float(self._event_counts[kind])})
            self.log_text(at_step, _describe_event(event))

    def log(self, step: int, scalars: dict[str, float]) -> None:
        pass

    def log_text(self, step: int, text: str) -> None:
        pass

    def close(self) -> None:
        pass


def _describe_event(event: dict) -> str:
    details = ", ".join(f"{k}={v}" for k, v in event.items() if k not in ("kind", "time_us") and v is not None)
    return f"{event.get('kind')}: {details}"[:1000]


def _ignore(table: str, rows: list) -> None:
    pass


class TensorBoardLogger(StepLogger):
    """Scalars in a TensorBoard event file under ``log_dir`` (torch.utils.tensorboard's SummaryWriter)."""

    def __init__(self, log_dir: str | Path, manifest: dict | None = None):
        super().__init__(manifest)
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(log_dir))
        self.status = f"on: TensorBoard events in {log_dir}"

    def log(self, step: int, scalars: dict[str, float]) -> None:
        for name, value in scalars.items():
            self.writer.add_scalar(f"diag/{name}", value, global_step=step)

    def log_text(self, step: int, text: str) -> None:
        self.writer.add_text("diag/events", text, global_step=step)

    def close(self) -> None:
        self.writer.close()


class WandbLogger(StepLogger):
    """Series in the user's Weights & Biases run, against ``diag/step`` (the run's own step stays the user's)."""

    def __init__(self, run, prefix: str = "diag/", manifest: dict | None = None):
        super().__init__(manifest)
        import wandb

        self.run = wandb.run if run is True else run
        if self.run is None:
            raise RuntimeError("no active W&B run: call wandb.init() before diag.init, or pass the run")
        self.prefix = prefix
        self.run.define_metric(f"{prefix}step")
        self.run.define_metric(f"{prefix}*", step_metric=f"{prefix}step")
        self.status = f"on: W&B run {getattr(self.run, 'id', '?')}"

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self.run.log({f"{self.prefix}step": step, **{f"{self.prefix}{k}": v for k, v in scalars.items()}})


def start_loggers(tensorboard, wandb, rank: int, every_rank: bool, manifest: dict | None = None) -> dict:
    """The loggers ``diag.init`` asked for, on rank 0 only unless ``every_rank`` (then TensorBoard writes
    ``<dir>/rank<N>`` and W&B series are named ``diag/rank<N>/...``). One that cannot start is one warning.
    ``manifest``: the session's manifest dict, read at each flush for MFU's inputs."""
    if rank != 0 and not every_rank:
        return {}
    loggers: dict[str, StepLogger] = {}
    if tensorboard:
        directory = Path(tensorboard) / f"rank{rank:05d}" if every_rank else Path(tensorboard)
        loggers["tensorboard"] = _started(TensorBoardLogger, directory, manifest)
    if wandb:
        loggers["wandb"] = _started(WandbLogger, wandb, f"diag/rank{rank}/" if every_rank else "diag/", manifest)
    return loggers


def _started(kind, *args) -> StepLogger:
    try:
        return kind(*args)
    except Exception as exc:
        warn_once(f"logger-{kind.__name__}", f"{kind.__name__} is off ({exc}); capture goes on")
        off = StepLogger()
        off.status = f"off: {exc}"
        return off
