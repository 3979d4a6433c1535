"""One rank's capture session: owns the writer, the step/phase state and the capture components.

Everything that runs on the training thread goes through ``_guarded``-style try/except: a failure in
diag is one warning and the training loop goes on untouched. The user's own exceptions always propagate.
"""

from __future__ import annotations

import os
import platform
import sys
import threading
import time
from contextlib import contextmanager, suppress
from pathlib import Path

from diag import readiness
from diag._warn import warn_once
from diag.capture import collectives, torch_private
from diag.capture.calibration import CORE_WAIT, start_calibration
from diag.capture.components import HOOKS, hooks_of
from diag.capture.config import CaptureConfig
from diag.capture.device_timer import host_value
from diag.capture.flight_recorder import StepSpans
from diag.capture.identity import RankIdentity, detect_identity
from diag.capture.memory import is_out_of_memory, start_memory
from diag.capture.memory_deep import start_memory_deep
from diag.capture.nvml import start_telemetry
from diag.capture.nvtx import start_nvtx
from diag.capture.watchdog import start_watchdog
from diag.trace.schema import PHASES, STEPS, rank_dir_name
from diag.trace.writer import RankWriter

# The capture components (diag/capture/components.py): the session's attribute for each (None when off) and the
# function that starts it. They start in this order and their hooks run in it, the end hooks (step_end,
# phase_end, stop) in reverse: the component begun last ends first.
COMPONENTS = (
    ("nvtx", start_nvtx),
    ("memory", start_memory),
    ("recorder", collectives.start_recorder),
    ("telemetry", start_telemetry),
    # after the recorder: its first heartbeat says whether collectives are recorded; it stops before the recorder
    ("watchdog", start_watchdog),
    # after telemetry, whose NVML handle reads its clocks, and memory, whose row is taken before it runs
    ("calibrator", start_calibration),
    # last (and after memory, whose categories it tracks): last at step begin, what diag does before it would be
    # tracked too; first at step end, diag's own end-of-step work is not the step's memory; first to stop
    ("memory_deep", start_memory_deep),
)


class Session:
    """Created by ``diag.init``; its options are the fields of ``CaptureConfig`` (diag/capture/config.py,
    docs/capture-options.md)."""

    COUNT_FLOPS_AT_STEP = 1  # not step 0: lazy initialisation and DDP's bucket rebuild happen there

    enabled = True

    def __init__(self, trace_dir: str | os.PathLike, config: CaptureConfig | None = None):
        config = CaptureConfig() if config is None else config  # a CaptureConfig has checked its values
        self.config = config
        self.trace_dir = Path(trace_dir)
        self.identity: RankIdentity = detect_identity()
        self.rank = self.identity.rank
        self.world_size = self.identity.world_size
        self.writer = RankWriter(
            self.trace_dir / rank_dir_name(self.rank),
            flush_interval_s=config.flush_interval_s,
            schema_version=config.trace_format,
        )
        self.device = _device(config.device)
        self.capture_status: dict[str, str] = {}
        # the user's, before diag sets NCCL's log variables: what `diag doctor` judges
        self._hang_settings = {name: os.environ[name] for name in readiness.HANG_SETTINGS if name in os.environ}
        self._start_nccl_log(config.nccl_log and self.writer.enabled)

        # step and phase state, read by the watchdog from its own thread
        self.current_step: int | None = None
        self.last_step: int | None = None
        self.current_phase: str | None = None
        self.step_started_us: int | None = None
        self._next_step = 0
        self._last_index: int | None = None  # the last step number begun: a repeat is warned about once
        self._open_step = False  # begin_step without end_step yet
        self._pid = os.getpid()  # a forked child (os.fork inside a step) records nothing of the parent's
        self._step_start_ns = 0
        # (thread, its time on a core and waiting for one) when the step began
        self._step_schedstat: tuple[int, tuple[int, int] | None] = (0, None)
        self._step_device_event = None
        self._phase_us: dict[str, float] = {}
        # diag.phase() spans open now, by name: a span of a name that encloses the hooks' own (the user's
        # ``diag.phase("forward")`` around the model's call) counts once, as the enclosing span
        self._open_phases: dict[str, int] = {}
        self._data_wait_us = 0.0
        self._comm_wait_us = 0.0
        self._hooks: list = []
        self.pg_generation = 0  # destroy_process_group() calls that ended every group (trace_group_name)
        self._meshes: list = []  # DeviceMeshes found on instrumented modules
        self._count_flops = config.count_flops and not config.flops_per_step
        self._ddp_buckets = "hook" if config.ddp_buckets is True else config.ddp_buckets
        self._fingerprint_every = config.fingerprint_every
        self._replica_params: list = []  # parameters of the instrumented DDP model: identical on its replicas
        self._step_values: dict = {}  # loss, grad_norm given for the step in progress (diag.record)
        self.step_spans = StepSpans()

        self.manifest = self._base_manifest(config)
        if config.model_shape:
            self.manifest["model_shape"] = dict(config.model_shape)
        # Without a writable trace directory (already warned about) nothing else is worth starting, but the
        # clock sync still runs: it is a collective the other ranks are waiting in.
        writing = self.writer.enabled
        self.device_timer = self._make_device_timer()
        self._sync_clocks(config.clock_sync)
        self.metrics = self._start_metrics(config.prometheus_port if writing else None, config.prometheus_addr)
        self.loggers = (
            self._start_loggers(config.tensorboard, config.wandb, config.loggers_on_every_rank) if writing else []
        )
        if self.loggers:  # set once the list exists: the writer's thread may flush at any moment
            self.writer.row_observer = self._observe_rows
        self.components = self._start_components()  # after the clock sync: the calibration runs on every rank at once
        self._on = {hook: hooks_of(self.components, hook) for hook in HOOKS}
        self.manifest["hang_settings"] = self._hang_settings
        self._check_readiness()
        self.manifest["capture"] = self.capture_status
        self.writer.on_stop = self._on_capture_stopped
        self.writer.write_manifest(self.manifest)
        self.writer.start()

    # -- setup ----------------------------------------------------------------------------------------------
    def _check_readiness(self) -> None:
        """Could a hang of this job be diagnosed (diag/readiness.py)? The answer in the manifest's capture status,
        and one line on rank 0's stderr when a setting should change: at init, while it still can."""
        try:
            default_timeout_s = None
            if self.manifest["backend"] is not None:
                default_timeout_s = torch_private.process_group_timeout_s(torch_private.default_group())
            job = readiness.JobFacts(
                backend=self.manifest["backend"],
                world_size=self.world_size,
                local_world_size=self.identity.local_world_size,
                trace_dir=str(self.trace_dir),
                timeouts_s={"0": default_timeout_s} if default_timeout_s else None,
            )
            changes = [c for c in readiness.check(self._hang_settings, job) if c.status == "change"]
        except Exception as exc:  # a readiness check never stops capture
            self.capture_status["hang_readiness"] = f"not checked ({exc!r})"
            return
        if not changes:
            self.capture_status["hang_readiness"] = "ok"
            return
        self.capture_status["hang_readiness"] = "to change: " + ", ".join(c.name for c in changes)
        if self.rank == 0 and self.writer.enabled:
            advice = "; ".join(c.advice for c in changes)
            print(
                f"diag: a hang of this job would be hard to diagnose: {advice} (`diag doctor {self.trace_dir}`)",
                file=sys.stderr,
                flush=True,
            )

    def _base_manifest(self, config: CaptureConfig) -> dict:
        import torch

        ident = self.identity
        cuda = self.device if self.device.type == "cuda" else None
        return {
            "schema_version": self.writer.schema_version,
            "run_id": os.environ.get("DIAG_RUN_ID") or (ident.job.run_id if ident.job else None),
            "rank": ident.rank,
            "local_rank": ident.local_rank,
            "world_size": ident.world_size,
            "local_world_size": ident.local_world_size,
            "host": ident.host,
            "pid": ident.pid,
            "launcher": ident.launcher,
            "job": ident.job.to_manifest() if ident.job else None,
            "backend": collectives.default_backend(),
            "device": str(self.device),
            "device_name": torch.cuda.get_device_name(cuda) if cuda is not None else platform.processor() or "cpu",
            "gpu_index": cuda.index if cuda is not None else None,
            "gpu_uuid": str(torch.cuda.get_device_properties(cuda).uuid) if cuda is not None else None,
            "torch_version": torch.__version__,
            "cuda_version": torch.version.cuda,
            "nccl_version": _nccl_version(),
            "python_version": platform.python_version(),
            "parallel": config.parallel,
            "flops_per_step": config.flops_per_step,
            "flops_source": "user" if config.flops_per_step else None,
            "peak_tflops": config.peak_tflops,
            "dtype": config.dtype,
            "clock_offset_us": 0.0 if ident.world_size == 1 else None,
            "clock_sync_error_us": None,
            "start_time_us": time.time_ns() // 1000,
            "process_groups": {},
            "finished": False,
        }

    def _start_nccl_log(self, enabled: bool) -> None:
        """First of all: NCCL reads its log variables when it creates its first communicator."""
        from diag.capture.nccl_log import start_nccl_log

        self.capture_status["nccl_log"] = start_nccl_log(self.writer.rank_dir) if enabled else "off"

    def _start_components(self) -> list:
        """Each of ``COMPONENTS`` started, in order, as the attribute of its name; the list of those that are on."""
        for name, _ in COMPONENTS:  # the watchdog's thread reads the others from its start
            setattr(self, name, None)
        started = []
        for name, start in COMPONENTS:
            try:
                component = start(self)
            except Exception as exc:  # the rest of capture goes on without it
                warn_once(f"start-{name}", f"{name} could not start ({exc!r}); it is off")
                continue
            setattr(self, name, component)
            if component is not None:
                started.append((name, component))
        return started

    def _make_device_timer(self):
        from diag.capture.device_timer import DeviceTimer, NoDeviceTimer

        if self.device.type == "cuda":
            self.capture_status["device_time"] = "on: CUDA events"
            timer = DeviceTimer(self.writer)
            self.writer.before_flush = timer.poll  # rows out within a flush interval, even if the loop stops
            return timer
        self.capture_status["device_time"] = "off: no CUDA device"
        return NoDeviceTimer(self.writer)

    def _sync_clocks(self, enabled: bool) -> None:
        import torch.distributed as dist

        if not (enabled and dist.is_available() and dist.is_initialized() and self.world_size > 1):
            return
        from diag.capture.clock import synchronise_clocks

        try:
            store = dist.distributed_c10d._get_default_store()
            sync = synchronise_clocks(store, self.rank, self.world_size, self.identity.host)
            self.manifest["clock_offset_us"] = sync.offset_us
            self.manifest["clock_sync_error_us"] = sync.error_us
            self.manifest["run_id"] = self.manifest["run_id"] or sync.run_id
        except Exception as exc:
            warn_once("clock-sync", f"clock synchronisation failed ({exc!r}); cross-rank times are not aligned")

    def _start_metrics(self, port: int | None, addr: str):
        """After the clock sync: the run id it agrees on labels every metric."""
        from diag.metrics.prometheus import start_metrics

        sink = start_metrics(port, addr, self.manifest, self.identity.local_rank)
        self.writer.row_observer = sink.observe
        self.capture_status["prometheus"] = sink.status
        return sink

    def _start_loggers(self, tensorboard, wandb, every_rank: bool) -> list:
        """TensorBoard / W&B: they see the rows the writer flushes, after the Prometheus sink."""
        if not tensorboard and not wandb:
            return []
        from diag.metrics.loggers import start_loggers

        loggers = start_loggers(tensorboard, wandb, self.rank, every_rank, self.manifest)
        for name, logger in loggers.items():
            self.capture_status[name] = logger.status
        return list(loggers.values())

    def _observe_rows(self, table: str, rows: list) -> None:
        """Every flushed batch of rows to the metrics sink and each logger (each guards its own failures)."""
        self.metrics.observe(table, rows)
        for logger in self.loggers:
            logger.observe(table, rows)

    # -- state the watchdog and the hooks use ----------------------------------------------------------------
    def current_step_or_none(self) -> int:
        return -1 if self.current_step is None else self.current_step

    def pending_collectives(self) -> list[dict]:
        return self.recorder.pending() if self.recorder is not None else []

    def set_phase(self, name: str | None) -> None:
        if name is not None:
            for hook in self._on["phase_begin"]:
                hook(name)
        elif self.current_phase is not None:
            for hook in self._on["phase_end"]:
                hook(self.current_phase)
        self.current_phase = name

    def add_phase_time(self, name: str, duration_us: float) -> None:
        if self._open_phases.get(name):  # inside a diag.phase(name): that span holds this time already
            return
        self._phase_us[name] = self._phase_us.get(name, 0.0) + duration_us

    def add_comm_wait(self, duration_us: float) -> None:
        self._comm_wait_us += duration_us

    def add_data_wait(self, duration_us: float) -> None:
        self._data_wait_us += duration_us

    def trace_group_name(self, torch_name) -> str:
        """The trace's name of the process group torch calls ``torch_name``: torch's own name, and after
        ``destroy_process_group()`` and a new ``init_process_group`` (torch then names groups "0", "1" ... again,
        and numbers their collectives from 1 again) the name with the generation, "0@1": the new groups'
        collectives never collide with the old ones' (pg, seq)."""
        return str(torch_name) if not self.pg_generation else f"{torch_name}@{self.pg_generation}"

    def register_process_group(self, group) -> str:
        """Name a process group and describe it in the manifest the first time it is seen."""
        try:
            name = self.trace_group_name(group.group_name)
            if name not in self.manifest["process_groups"]:
                self.manifest["process_groups"][name] = _describe_group(group)
                self.writer.write_manifest(self.manifest)
            return name
        except Exception:
            return "unknown"

    def describe_process_groups(self) -> None:
        """Every process group torch knows (DTensor's and DeviceMesh's too, which no Python wrapper sees),
        with the mesh dimension each one is, into the manifest. At instrument and at finish: off the steps."""
        try:
            import torch.distributed as dist

            if not (dist.is_available() and dist.is_initialized()):
                return
            groups = self.manifest["process_groups"]
            for group, name in torch_private.process_group_names().items():
                groups.setdefault(self.trace_group_name(name), _describe_group(group))
            for mesh in self._meshes:
                names = list(mesh.mesh_dim_names or [f"dim{i}" for i in range(mesh.ndim)])
                for dim, dim_name in enumerate(names):
                    group = mesh.get_group(dim)
                    groups.setdefault(self.trace_group_name(group.group_name), _describe_group(group))["mesh_dim"] = (
                        dim_name
                    )
                self.manifest["device_mesh"] = {
                    "shape": list(mesh.shape),
                    "dim_names": names,
                    "groups": {n: self.trace_group_name(mesh.get_group(d).group_name) for d, n in enumerate(names)},
                }
            self.writer.write_manifest(self.manifest)
        except Exception as exc:
            warn_once("process-groups", f"cannot describe the process groups ({exc!r})")

    def note_device_mesh(self, module) -> None:
        """The DeviceMesh of a module's DTensor parameters (tensor parallel, FSDP2): torch keeps no registry. A
        parameter sharded on a slice (``mesh["tp"]``) names the whole mesh it was sliced from."""
        for param in module.parameters():
            mesh = getattr(param, "device_mesh", None)
            if mesh is None:
                continue
            with suppress(Exception):  # a torch without root meshes: the slice is what can be described
                mesh = torch_private.root_mesh(mesh)
            if all(mesh is not known for known in self._meshes):
                self._meshes.append(mesh)

    # -- steps and phases -------------------------------------------------------------------------------------
    @contextmanager
    def step(self, index: int | None = None, samples: int | None = None, tokens: int | None = None):
        started = self._begin_step(index)
        counter = self._flop_counter() if started else None
        completed = False
        try:
            if counter is None:
                yield self
            else:
                with counter:
                    yield self
            completed = True
        except BaseException as exc:
            self._on_step_error(exc)
            raise
        finally:
            if started:
                self._end_step(samples, tokens, completed)
            if counter is not None:
                self._record_counted_flops(counter)

    def begin_step(self, index: int | None = None) -> None:
        """Open a step without a ``with`` block, for framework callbacks (Lightning, Hugging Face) whose step
        starts and ends in two separate calls; ``end_step`` closes it. ``count_flops`` does not apply: FLOP
        counting needs a block around the step."""
        self._open_step = self._begin_step(index)

    def record(self, loss=None, grad_norm=None) -> None:
        """The current step's loss and gradient norm (numbers or 0-d tensors; a tensor on the GPU is copied to
        the host without waiting for it), written with the step's row. Outside a step: ignored."""
        if self.current_step is None:
            return
        if loss is not None:
            self._step_values["loss"] = loss
        if grad_norm is not None:
            self._step_values["grad_norm"] = grad_norm

    def end_step(
        self,
        samples: int | None = None,
        tokens: int | None = None,
        error: BaseException | None = None,
        loss=None,
        grad_norm=None,
    ):
        """Close the step ``begin_step`` opened; ``error``: the exception that ended it (recorded like one
        escaping ``with diag.step()``, an OOM with the allocator summary); ``loss``, ``grad_norm``: as
        ``record``."""
        self.record(loss=loss, grad_norm=grad_norm)
        if not self._open_step:
            return
        self._open_step = False
        if error is not None:
            self._on_step_error(error)
        self._end_step(samples, tokens, completed=error is None)

    def instrument_ddp_buckets(self, ddp_model) -> bool:
        """Record a DDP model's gradient all-reduces (the ``ddp_buckets`` option says how) without timing its
        forward and backward: ``instrument`` calls it, and framework callbacks that time those from the
        framework's own events."""
        self._track_replicas(ddp_model)
        if self.recorder is None or not self._ddp_buckets:
            return False
        group = ddp_model.process_group
        mode = self._ddp_buckets
        if mode == "auto":
            mode = "hook" if collectives.backend_of(group) == "nccl" else "flight_recorder"
        if mode == "hook" and collectives.install_ddp_hook(
            ddp_model, collectives.active_recorder, lambda: self._on_user_comm_hook(group)
        ):
            self.capture_status["ddp_buckets"] = "hook: each bucket timed"
            return True
        self.recorder.flight_recorder.follow_ddp(self.recorder.group_name(group), group)
        self._hooks.append(collectives.LastGradientWait(ddp_model, self.add_comm_wait))
        self.capture_status["ddp_buckets"] = "flight_recorder: buckets untimed, exposed wait per step"
        return True

    def _track_replicas(self, ddp_model) -> None:
        """A DDP model's parameters are the same on every rank of its process group after each step: their
        fingerprint, compared across that group (named in the manifest), shows when replicas drift apart."""
        try:
            if self._fingerprint_every and not self._replica_params:
                self._replica_params = [p for p in ddp_model.module.parameters() if p.requires_grad]
                self.manifest["replica_group"] = self.register_process_group(ddp_model.process_group)
                self.writer.write_manifest(self.manifest)
        except Exception as exc:
            warn_once("replica-fingerprint", f"replica fingerprints are off ({exc!r})")
            self._replica_params = []

    def _fingerprint(self, step: int):
        """Every ``fingerprint_every`` steps, the sum of every replicated parameter, on their device. Each
        parameter is summed in float32 (float64 costs 60x more on a CPU: docs/health.md) and the sums added in
        float64; replicas hold bit-identical parameters and reduce them identically, so any difference shows."""
        if not self._replica_params or step % self._fingerprint_every:
            return None
        import torch

        with torch.no_grad():
            sums = torch.stack([p.detach().sum(dtype=torch.float32) for p in self._replica_params])
            return sums.double().sum()

    def _on_user_comm_hook(self, group) -> None:
        """The user registered their own DDP communication hook, which now runs in diag's: what it issues
        through torch.distributed is recorded as it goes; what it issues on the group directly comes from
        Flight Recorder."""
        self.recorder.flight_recorder.follow_ddp(self.recorder.group_name(group), group)
        self.capture_status["ddp_buckets"] = "hook: the user's communication hook, its collectives recorded"
        self.manifest["capture"] = self.capture_status
        self.writer.write_manifest(self.manifest)

    def open_step(self) -> tuple[int, int] | None:
        """(wall-clock start in ns, index) of the step in progress, or None."""
        step, started_us = self.current_step, self.step_started_us
        return None if step is None or started_us is None else (started_us * 1000, step)

    def _flop_counter(self):
        if not self._count_flops or self.current_step != self.COUNT_FLOPS_AT_STEP:
            return None
        try:
            from torch.utils.flop_counter import FlopCounterMode

            return FlopCounterMode(display=False)
        except Exception as exc:
            warn_once("flop-counter", f"cannot count FLOPs ({exc!r}); MFU needs flops_per_step")
            return None

    def _record_counted_flops(self, counter) -> None:
        self._count_flops = False
        try:
            self.set_flops(float(counter.get_total_flops()), "flop_counter")
        except Exception as exc:
            warn_once("flop-counter", f"cannot count FLOPs ({exc!r}); MFU needs flops_per_step")

    def _begin_step(self, index: int | None) -> bool:
        # phase time recorded outside any step (an evaluation forward between two steps) is not this step's
        self._phase_us = {}
        try:
            self.device_timer.poll()
            self.current_step = self._next_step if index is None else int(index)
            self._note_repeated_step(self.current_step)
            self._next_step = self.current_step + 1
            self.step_started_us = time.time_ns() // 1000
            self._step_start_ns = time.perf_counter_ns()
            self._step_schedstat = (threading.get_native_id(), CORE_WAIT.read_cpu_and_wait_ns())
            self._step_device_event = self.device_timer.start()
            for hook in self._on["step_begin"]:  # last: what diag does before memory_deep's would be tracked too
                hook(self.current_step)
            return True
        except Exception as exc:
            warn_once("step-begin", f"step timing failed ({exc!r})")
            return False

    def _note_repeated_step(self, step: int) -> None:
        """One warning when step numbers repeat or go back within this process: ``diag.step(global_step)``
        called once per micro-batch makes each optimizer step several steps of the same number."""
        last, self._last_index = self._last_index, step
        if last is None or step > last:
            return
        if step == last:
            message = (
                f"diag.step called with step {step} again: call it once per optimizer step, around all its "
                "micro-batches (README, gradient accumulation)"
            )
        else:
            message = f"diag.step called with step {step} after step {last}: step numbers should increase"
        warn_once("step-repeated", message)

    def _in_owner_process(self) -> bool:
        """False in a child forked from the rank: the buffered rows and the files are the parent's."""
        return os.getpid() == self._pid

    def _on_capture_stopped(self, reason: str) -> None:
        """The writer stopped mid-run (a full disk, a directory made read-only): the manifest and heartbeat say
        at which step and why, so that the report and triage do not read the rows that made it as the run."""
        step = self.current_step if self.current_step is not None else self._next_step
        stopped = {"step": step, "last_step": self.last_step, "reason": reason, "time_us": time.time_ns() // 1000}
        self.manifest["capture_stopped"] = stopped
        heartbeat = self.watchdog.stopped_heartbeat() if self.watchdog is not None else None
        self.writer.write_last_words(self.manifest, heartbeat)

    def _end_step(self, samples, tokens, completed: bool) -> None:
        """Write the step's rows (a failed step's too: its time was spent). Only a completed step becomes
        ``last_step``, which hang triage reads as the last step this rank finished."""
        if not self._in_owner_process():  # a forked child leaving a step the parent opened
            return
        step = self.current_step
        for hook in self._on["step_end"]:  # memory_deep's first: diag's own end-of-step work is not the step's memory
            hook(step, completed)
        try:
            duration_us = (time.perf_counter_ns() - self._step_start_ns) / 1000
            cpu_us, core_wait_us = self._thread_cpu_and_wait_us()
            exposed_async_us = self.recorder.exposed_async_wait_us() if self.recorder is not None else 0.0
            phase = self._phase_us
            row = STEPS.row(
                step=step,
                start_us=self.step_started_us,
                duration_us=round(duration_us),
                data_wait_us=round(self._data_wait_us),
                forward_us=round(phase.get("forward", 0.0)),
                backward_us=round(phase.get("backward", 0.0)),
                optimizer_us=round(phase.get("optimizer", 0.0)),
                comm_wait_us=round(self._comm_wait_us + exposed_async_us),
                runqueue_wait_us=core_wait_us,
                thread_cpu_us=cpu_us,
                samples=samples,
                tokens=tokens,
                loss=host_value(self._step_values.get("loss")),
                grad_norm=host_value(self._step_values.get("grad_norm")),
                param_fingerprint=host_value(self._fingerprint(step)) if completed else None,
            )
            self.device_timer.stop(self._step_device_event, "steps", row)
            self.step_spans.add(self.step_started_us * 1000, time.time_ns(), step)
        except Exception as exc:
            warn_once("step-end", f"step recording failed ({exc!r})")
        finally:
            if completed:
                self.last_step = step
            self.current_step = self.step_started_us = None
            self._phase_us = {}
            self._step_values = {}
            self._data_wait_us = self._comm_wait_us = 0.0
            self.current_phase = None
            for hook in self._on["step_recorded"]:  # the memory row, the NVTX ranges' end, the calibration
                hook(step, completed)

    def _thread_cpu_and_wait_us(self) -> tuple[float | None, float | None]:
        """The time the step's thread ran on a core, and waited for one, since the step began (None: no
        schedstat, or the step ended on another thread than it began)."""
        thread, start = self._step_schedstat
        end = CORE_WAIT.read_cpu_and_wait_ns() if thread == threading.get_native_id() else None
        if start is None or end is None:
            return None, None
        return (end[0] - start[0]) / 1000, (end[1] - start[1]) / 1000

    def _on_step_error(self, exc: BaseException) -> None:
        if not self._in_owner_process():  # a forked child's own exit (SystemExit) is not the parent's step error
            return
        try:
            if is_out_of_memory(exc):
                summary = self.memory.summary() if self.memory is not None else None
                name = f"oom_step{self.current_step}.txt"
                if summary:
                    self.writer.write_text(name, summary)
                self.writer.event(
                    "oom",
                    step=self.current_step,
                    message=str(exc)[:2000],
                    summary_file=name if summary else None,
                    **self._oom_fields(),
                )
            else:
                self.writer.event("step_error", step=self.current_step, error=repr(exc)[:2000])
            self.writer.flush()
        except Exception as inner:
            warn_once("step-error", f"could not record a failed step ({inner!r})")

    def _on_loader_error(self, exc: BaseException) -> None:
        """The data loader raised, outside any step: recorded as the step's error it was loading for, so that a
        job that catches it, or restarts into the same directory (overwriting the exit record), still shows
        which rank failed first."""
        if not self._in_owner_process():
            return
        try:
            self.writer.event("data_error", step=self._next_step, error=repr(exc)[:2000])
            self.writer.flush()
        except Exception as inner:
            warn_once("data-error", f"could not record a data loader error ({inner!r})")

    def _oom_fields(self) -> dict:
        try:
            return self.memory.oom_fields(self.current_step) if self.memory is not None else {}
        except Exception as exc:  # the OOM itself is still recorded
            warn_once("oom-memory", f"could not read memory at an out-of-memory error ({exc!r})")
            return {}

    def on_backward_end(self) -> None:
        """A backward pass ended (the hooks' listener): the step's gradients are all there."""
        if self.memory is not None:
            self.memory.categories.on_backward_end(self.current_step)

    def track_memory_of(self, module=None, optimizer=None) -> None:
        """Count the memory of an instrumented model and optimizer by category, and describe them in the
        manifest (``memory_model``) for ``diag memory-plan`` and the report's predicted-against-measured."""
        if self.memory is None:
            return
        try:
            from diag.capture.memory_categories import describe_model

            categories = self.memory.categories
            if module is not None:
                categories.add_module(module)
            if optimizer is not None:
                categories.add_optimizer(optimizer)
            self.manifest["memory_model"] = describe_model(categories.modules, categories.optimizers)
            self.writer.write_manifest(self.manifest)
        except Exception as exc:
            warn_once("memory-categories", f"cannot count memory by category ({exc!r})")

    @contextmanager
    def phase(self, name: str):
        start_us = time.time_ns() // 1000
        start_ns = time.perf_counter_ns()
        previous, self.current_phase = self.current_phase, name
        self._open_phases[name] = self._open_phases.get(name, 0) + 1
        event = self._safe(self.device_timer.start)
        for hook in self._on["phase_begin"]:
            hook(name)
        try:
            yield
        finally:
            self.current_phase = previous
            self._open_phases[name] -= 1
            for hook in self._on["phase_end"]:
                hook(name)
            try:
                duration_us = (time.perf_counter_ns() - start_ns) / 1000
                self.add_phase_time(name, duration_us)
                row = PHASES.row(
                    step=self.current_step_or_none(), name=name, start_us=start_us, duration_us=round(duration_us)
                )
                self.device_timer.stop(event, "phases", row)
            except Exception as exc:
                warn_once("phase", f"phase recording failed ({exc!r})")

    @staticmethod
    def _safe(function):
        try:
            return function()
        except Exception:
            return None

    # -- instrumenting ----------------------------------------------------------------------------------------
    def instrument(self, *objects, step_at: str | None = None) -> None:
        import torch

        from diag.capture import pipeline
        from diag.capture.frameworks import instrument_framework, is_deepspeed_engine
        from diag.capture.hooks import BackwardHooks, ModelHooks, OptimizerHooks

        if step_at is not None and not any(is_deepspeed_engine(obj) for obj in objects):
            warn_once("step-at", f"step_at={step_at!r} applies to a DeepSpeed engine, and none was given: ignored")
        for obj in objects:
            try:
                if instrument_framework(self, obj, step_at):  # DeepSpeed, Accelerate: before torch base classes
                    continue
                if isinstance(obj, torch.nn.Module):
                    is_ddp = isinstance(obj, torch.nn.parallel.DistributedDataParallel)
                    if is_ddp:
                        self.instrument_ddp_buckets(obj)
                    self.note_device_mesh(obj)
                    self.describe_process_groups()
                    self.track_memory_of(module=obj)
                    self._hooks.append(ModelHooks(self, obj))
                    if not any(isinstance(h, BackwardHooks) for h in self._hooks):
                        self._hooks.append(BackwardHooks(self))
                elif isinstance(obj, torch.optim.Optimizer):
                    self.track_memory_of(optimizer=obj)
                    self._hooks.append(OptimizerHooks(self, obj))
                elif pipeline.is_pipeline_schedule(obj):
                    hooks = pipeline.instrument_schedule(self, obj)
                    if hooks is not None:
                        self._hooks.append(hooks)
                else:
                    warn_once(f"instrument-{type(obj).__name__}", f"diag.instrument does not know {type(obj).__name__}")
            except Exception as exc:
                warn_once(f"instrument-{type(obj).__name__}", f"could not instrument {type(obj).__name__} ({exc!r})")

    def wrap_loader(self, loader):
        iterator = iter(loader)
        while True:
            start_ns = time.perf_counter_ns()
            previous, self.current_phase = self.current_phase, "data_wait"
            try:
                batch = next(iterator)
            except StopIteration:
                return
            except Exception as exc:
                self._on_loader_error(exc)
                raise
            finally:
                self.current_phase = previous
            self.add_data_wait((time.perf_counter_ns() - start_ns) / 1000)
            yield batch

    def set_flops(self, flops_per_step: float, source: str) -> None:
        self.manifest["flops_per_step"] = flops_per_step
        self.manifest["flops_source"] = source
        self.writer.write_manifest(self.manifest)

    # -- end ----------------------------------------------------------------------------------------------
    def finish(self) -> None:
        if not self._in_owner_process():  # a forked child: the parent finishes its own capture
            return
        try:
            self.device_timer.drain()
        except Exception as exc:
            warn_once("finish", f"error while finishing capture ({exc!r})")
        for hook in self._on["stop"]:
            hook()
        if self.memory_deep is not None:  # "off: why" if it stopped
            self.capture_status["memory_deep"] = self.memory_deep.status
        for hooks in reversed(self._hooks):  # last wrapped, first unwrapped: wrappers of one method nest
            hooks.remove()
        self._hooks.clear()
        self.describe_process_groups()
        self.manifest["finished"] = True
        self.manifest["end_time_us"] = time.time_ns() // 1000
        self.writer.write_manifest(self.manifest)
        self.writer.close()  # its last flush still reaches the metrics
        for sink in (self.metrics, *self.loggers):
            try:
                sink.close()
            except Exception as exc:
                warn_once("finish", f"error while finishing capture ({exc!r})")


class DisabledSession:
    """What ``diag.session()`` is before ``diag.init`` or after a failed init: every call does nothing."""

    enabled = False
    current_step = last_step = current_phase = step_started_us = None

    @contextmanager
    def step(self, index=None, samples=None, tokens=None):
        yield self

    @contextmanager
    def phase(self, name):
        yield

    def begin_step(self, index=None):
        pass

    def end_step(self, samples=None, tokens=None, error=None, loss=None, grad_norm=None):
        pass

    def record(self, loss=None, grad_norm=None):
        pass

    def instrument(self, *objects, step_at=None):
        pass

    def wrap_loader(self, loader):
        yield from loader

    def pending_collectives(self):
        return []

    def finish(self):
        pass


def _describe_group(group) -> dict:
    import torch.distributed as dist

    return {
        "ranks": dist.get_process_group_ranks(group),
        "size": group.size(),
        "backend": str(dist.get_backend(group)),
        "desc": getattr(group, "group_desc", None),
        "timeout_s": torch_private.process_group_timeout_s(group),
    }


def _device(device):
    """The option's device (a torch.device or a string such as 'cuda:1'), else the current CUDA device, else the CPU."""
    import torch

    if device is not None:
        return torch.device(device)
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _nccl_version() -> str | None:
    try:
        import torch

        version = torch.cuda.nccl.version()
        return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    except Exception:
        return None
