"""The diag trace format: the single source of truth shared by the writer (capture) and the loader.

A trace directory holds one sub-directory per rank, ``rank00007/``, with:

* ``manifest.json``: who this rank is (host, pid, ranks, device, versions, layout, FLOPs, clock anchor).
* the tables below, in one of two formats (the loader reads both, even mixed in one directory):

  * **schema version 2** (what capture writes by default; ``python3 -m diag.testing.synthetic --format 2``;
    diag/trace/columnar.py): each table as numbered
    *segments*, ``steps.000001.arrows``, ``steps.000001.parquet``, ``steps.000002.arrows``, ... A live segment
    (``.arrows``) is an Arrow IPC stream: a schema message whose metadata ``diag-trace`` holds the marker
    ``#diag-trace schema=2 table=NAME``, then one record batch per flush of the writer (every 0.5 s by default),
    its buffers zstd-compressed, category columns dictionary-encoded (int32 indices; new strings arrive as
    dictionary deltas). Each flush reaches the file in one write, so a reader sees whole messages, or a last one
    still being written, which it ignores until it is complete. At 65,536 rows, and at ``diag.finish``, the
    segment is compacted: its rows are written as ``steps.000001.parquet`` (row groups of 16,384 rows, so a reader
    of the last rows decodes only the last groups; dictionary encoding for categories and flags,
    DELTA_BINARY_PACKED for integers, BYTE_STREAM_SPLIT for floats, zstd; statistics
    for the step and time columns; the marker in the footer's key-value metadata ``diag-trace``), renamed into
    place, and the stream removed. Where both files of a number exist (a kill between the rename and the
    removal), the Parquet one is read. A job killed before finish leaves its last segment as a stream, read as
    it is. A second run into the same directory starts at the next number. Columns are read by name: a segment
    written before a nullable column was added reads it as empty. Arrow types: int64 for ``int64`` and
    ``Int64``, float64 for ``Float64``, int8 for ``int8``, dictionary<int32, utf8> for ``category``.
  * **schema version 1** (``diag.init(trace_format=1)``; the default before version 2): one CSV file per table (``steps.csv``,
    ``collectives.csv``, ...). Each starts with a marker line ``#diag-trace schema=1 table=NAME`` and a header
    line; rows are only ever appended, so a file can be read while it is written. A last line without its
    newline is a row still being written and is ignored. A text field holding a comma or a double quote is
    quoted (RFC 4180: ``"a,b"``, inner quotes doubled); a line break in one is written as the two characters
    ``\\n`` (``\\r``), so every row is one line. Floats are rounded to 3 decimals.

* ``events.jsonl``: rare, free-form records (OOMs, warnings, watchdog dumps), one JSON object per line.

Why this format (measured with ``benchmarks/bench_storage.py``, figures in docs/benchmarks.md): Parquet with
those encodings is the smallest of the candidates measured on the same rows (CSV 63-66 B a collective record;
Arrow IPC file with zstd 5.3; Parquet with its default encodings and zstd 8.4; with delta and byte-stream-split
encodings 3.0 on synthetic collectives), and reads without parsing. But a Parquet file is only readable once
its footer is written, so it cannot be appended to every 0.5 s; an Arrow IPC stream can, and is readable
while written. Small per-flush batches cost ~1 KB of framing each (20-30 B a record at 50-100 rows a flush),
hence the compaction into Parquet; the live stream is bounded (65,536 rows) so a SIGKILL leaves at most that
much uncompacted.

Version 2 became the default once its last open questions were answered. A real 4-rank job SIGTERMed a
second after it started lost ranks' exit records (the watchdog's SIGTERM handler did not wait for the other
thread writing them; fixed). tests/integration/prometheus/test_rank_metrics.py failed 7 of 12 runs: pyarrow imports pandas
the first time it converts Python values, and that happened on the writer thread's first flush, ~0.4 s holding
the GIL mid-training; it is now done at ``diag.init`` (``columnar.warm_up``: init ~0.25 s longer, the first
flush ~0.4 s shorter), and the test no longer races the Flight Recorder follower. What each format costs to
write and read: docs/benchmarks.md ("Trace storage"). ``diag.init(trace_format=1)`` still
writes CSV, and the loader reads both.

Times are wall-clock microseconds since the Unix epoch on the rank's own clock (``*_us`` columns that are
instants) or microsecond durations (``*_us`` columns that are spans). ``manifest.json``'s
``clock_offset_us`` is this rank's clock minus rank 0's, measured at init: subtract it to line ranks up.
Every unit is in the column name. Bump ``SCHEMA_VERSION`` on any incompatible change.
"""

from __future__ import annotations

import re
from collections import namedtuple
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

SCHEMA_VERSION = 2  # the newest: the columnar segments (diag/trace/columnar.py), diag.init(trace_format=2)
CSV_SCHEMA_VERSION = 1  # the CSV tables: diag.init(trace_format=1) and traces before version 2, always read
MANIFEST_FILE = "manifest.json"
MAX_RANK = 1 << 20  # a rank number (directory name, manifest, world_size) above this is not a real job
EVENTS_FILE = "events.jsonl"
HEARTBEAT_FILE = "heartbeat.json"
# An earlier attempt's last heartbeat, kept when a restarted job (torchrun --max-restarts, a requeue) starts
# capture again in the same directory: heartbeat_attempt_001.json, ... in the order the attempts ran. It tells
# how that attempt ended (its exit record, its stall), which the restart's own heartbeat.json replaces.
EARLIER_HEARTBEAT_PREFIX = "heartbeat_attempt_"
# Side files the hang watchdog writes into a rank directory (diag/capture/watchdog.py) and triage reads
# (diag/triage/sources.py): hang_dump_001.json, ... (one per stall or signal, numbered in order, a restart's after
# the earlier attempt's) with the same stacks as text in stacks_001.txt, ...; the latest Flight Recorder dump (a
# pickle: load only with diag.triage.flight_recorder's restricted unpickler); faulthandler's output on SIGSEGV,
# SIGABRT, ...
HANG_DUMP_PREFIX = "hang_dump_"
STACKS_PREFIX = "stacks_"
FR_DUMP_FILE = "fr_dump.pkl"
FATAL_STACKS_FILE = "fatal_stacks.txt"
# NCCL's own log (NCCL_DEBUG=INFO), which capture has NCCL write into the rank directory when the user did not
# configure it (diag/capture/nccl_log.py); the loader reads its first MAX_NCCL_LOG_BYTES and parses it
# (diag/trace/nccl_log.py), never executing anything of it.
NCCL_LOG_FILE = "nccl.log"
# The opt-in deep memory mode's result (diag.init(memory_deep_steps=(start, count)), diag/capture/memory_deep.py):
# plain JSON converted at capture time, never a pickle; read by diag/trace/memory_deep.py (keys: MEMORY_DEEP_KEYS)
MEMORY_DEEP_FILE = "memory_deep.json"
MEMORY_DEEP_FORMAT = "diag.memory_deep/1"
RANK_DIR_PREFIX = "rank"
MARKER_PREFIX = "#diag-trace"


NULLABLE_DTYPES = ("Float64", "Int64", "category")  # columns added to a table later must be one of these


@dataclass(frozen=True)
class Column:
    name: str
    dtype: str  # pandas dtype the loader gives the column ("Int64" and "Float64" allow missing values)
    doc: str
    former_name: str | None = None  # the name earlier writers of this schema version gave it: still read
    # written with every digit (repr) instead of rounded to 3 decimals: values compared for equality across
    # ranks (fingerprints) or far below 1 (a converged loss)
    exact: bool = False


@dataclass(frozen=True)
class Table:
    name: str
    doc: str
    columns: tuple[Column, ...]

    @property
    def file_name(self) -> str:
        return f"{self.name}.csv"

    @property
    def column_names(self) -> list[str]:
        return [c.name for c in self.columns]

    @property
    def exact_indexes(self) -> tuple[int, ...]:
        return tuple(i for i, c in enumerate(self.columns) if c.exact)

    @property
    def dtypes(self) -> dict[str, str]:
        return {c.name: c.dtype for c in self.columns}

    def __getstate__(self) -> dict:
        # without the cached row_type and row: made from the columns at run time, they cannot be pickled, and a
        # table goes to and from worker processes with what a reader read (TraceReader.read_state)
        return {k: v for k, v in self.__dict__.items() if k not in ("row_type", "row")}

    @cached_property
    def row_type(self) -> type:
        """A namedtuple of the columns in file order: capture builds rows with ``row`` and readers (the
        Prometheus folding) take fields by name, so a column added or moved cannot shift the others."""
        singular = self.name[:-1] if self.name.endswith("s") else self.name
        return namedtuple(f"{singular.title()}Row", self.column_names, defaults=(None,) * len(self.columns))

    @cached_property
    def row(self) -> Callable[..., tuple]:
        """The row builder, keyword arguments only (a column not given is empty). Generated from the column
        names (constants of this module, never a trace's) as namedtuple itself is: about 0.3 us a row, where
        calling the namedtuple class with keywords costs 0.7 us; capture builds ~20 rows a step."""
        names = self.column_names
        source = (
            f"def row(*, {', '.join(f'{n}=None' for n in names)}):\n    return _new(_type, ({', '.join(names)},))\n"
        )
        namespace = {"_new": tuple.__new__, "_type": self.row_type}
        exec(source, namespace)  # noqa: S102
        return namespace["row"]

    def frame(self, rank: int, **columns):
        """A pandas frame of this table for one rank, built by column name (every column given, none other)."""
        import numpy as np
        import pandas as pd

        if set(columns) != set(self.column_names):
            raise ValueError(f"{self.name}: columns {sorted(set(columns) ^ set(self.column_names))} wrong")
        length = len(next(iter(columns.values())))
        return pd.DataFrame(
            {"rank": np.full(length, rank, dtype="int32"), **{n: columns[n] for n in self.column_names}}
        )

    def header_columns(self, names: list[str]) -> int | None:
        """How many of this table's columns a file with this header line holds, or None if it is not this
        table's. Columns are only ever added at the end, nullable: a file written before an addition holds the
        leading ones (read under their current or former names), and the rest read as empty."""
        if not 0 < len(names) <= len(self.columns):
            return None
        if any(name not in (c.name, c.former_name) for name, c in zip(names, self.columns)):
            return None
        if any(c.dtype not in NULLABLE_DTYPES for c in self.columns[len(names) :]):
            return None
        return len(names)

    def leading(self, count: int) -> Table:
        """This table with only its first ``count`` columns (how an older file of it is parsed)."""
        return self if count == len(self.columns) else Table(self.name, self.doc, self.columns[:count])

    def marker_line(self) -> str:
        return f"{MARKER_PREFIX} schema={CSV_SCHEMA_VERSION} table={self.name}\n"

    def header(self) -> str:
        return self.marker_line() + ",".join(self.column_names) + "\n"


STEPS = Table(
    "steps",
    "One row per training step (the body of `with diag.step():`).",
    (
        Column("step", "int64", "step index, from 0, as counted by diag (or given by the user)"),
        Column("start_us", "int64", "wall-clock instant the step began"),
        Column("duration_us", "int64", "host wall time of the step body"),
        Column("data_wait_us", "int64", "time blocked in the wrapped data loader for this step's batch"),
        Column("forward_us", "int64", "host time in the instrumented model's forward"),
        Column("backward_us", "int64", "host time from backward start until autograd finished"),
        Column("optimizer_us", "int64", "host time in optimizer.step()"),
        Column("comm_wait_us", "int64", "host time blocked in synchronous collectives and waits"),
        Column("device_us", "Float64", "GPU time of the step from CUDA events; empty on CPU"),
        Column("samples", "Int64", "samples in the step's batch when known"),
        Column("tokens", "Int64", "tokens in the step's batch when known"),
        Column(
            "loss",
            "Float64",
            "the step's loss as given to diag.record / end_step; empty if not given or not finite (a `nonfinite` event says which)",
            exact=True,
        ),
        Column(
            "grad_norm",
            "Float64",
            "the step's gradient norm as given (e.g. clip_grad_norm_'s result); empty as loss is",
            exact=True,
        ),
        Column(
            "param_fingerprint",
            "Float64",
            "every fingerprint_every steps, the sum of the instrumented DDP model's parameters after the step (each summed in float32, the sums added in float64): equal on every replica of `replica_group` unless they drifted apart",
            exact=True,
        ),
        Column(
            "runqueue_wait_us",
            "Float64",
            "time the training thread was ready to run but waited for a core during the step body (other load on "
            "the host; Linux schedstat, empty elsewhere): not the rank's own work",
        ),
        Column(
            "thread_cpu_us",
            "Float64",
            "time the training thread ran on a core during the step body (Linux schedstat, empty elsewhere)",
        ),
    ),
)

PHASES = Table(
    "phases",
    "Spans inside a step marked with `diag.phase(name)` (and the Trainer's own phases).",
    (
        Column("step", "int64", "step the span belongs to (-1 outside any step)"),
        Column("name", "category", "phase name"),
        Column("start_us", "int64", "wall-clock instant the span began"),
        Column("duration_us", "int64", "host wall time of the span"),
        Column("device_us", "Float64", "GPU time of the span from CUDA events; empty on CPU"),
    ),
)

COLLECTIVES = Table(
    "collectives",
    "One row per collective or point-to-point operation the rank issued.",
    (
        Column("step", "int64", "step during which it was issued (-1 outside any step)"),
        Column("pg", "category", "process group name (c10d group_name; the manifest describes each)"),
        Column("seq", "int64", "c10d sequence number in that group, as Flight Recorder counts it"),
        Column("op", "category", "all_reduce, all_gather, reduce_scatter, broadcast, send, recv, ..."),
        Column("bytes", "int64", "bytes this rank contributes (input tensor size)"),
        Column("dtype", "category", "element type, e.g. float32, bfloat16"),
        Column("peer", "Int64", "global rank of the peer for send/recv; empty for collectives"),
        Column("start_us", "int64", "wall-clock instant it was issued"),
        Column(
            "duration_us",
            "Float64",
            "issue to completion as the host saw it; on NCCL with TORCH_NCCL_ENABLE_TIMING=1 the collective's "
            "device (CUDA event) duration; empty if completion was never seen or not observable (DDP buckets "
            "read from gloo's Flight Recorder)",
        ),
        Column("blocking", "int8", "1 if the caller waited for it in the call (async_op=False)"),
        Column(
            "source",
            "category",
            "who issued it: py (torch.distributed call), ddp (DDP gradient bucket, timed by diag's comm hook or read "
            "from Flight Recorder), fr (issued from C++, read from Flight Recorder)",
        ),
    ),
)

MEMORY = Table(
    "memory",
    "Memory at the end of each step; peaks are since the previous row.",
    (
        Column("step", "int64", "step index"),
        Column("time_us", "int64", "wall-clock instant of the reading"),
        Column("allocated_bytes", "Int64", "CUDA caching allocator: bytes allocated now"),
        Column("allocated_peak_bytes", "Int64", "CUDA: peak allocated during the step"),
        Column("reserved_bytes", "Int64", "CUDA: bytes reserved by the allocator now"),
        Column("reserved_peak_bytes", "Int64", "CUDA: peak reserved during the step"),
        Column("alloc_retries", "Int64", "CUDA: cumulative cudaMalloc retries after freeing the cache"),
        Column("ooms", "Int64", "CUDA: cumulative out-of-memory errors"),
        Column("rss_bytes", "int64", "resident set size of the process (read at most every 0.1 s: the latest reading)"),
        Column(
            "param_bytes",
            "Int64",
            "bytes of the instrumented model's parameters on this rank's device: local shards under FSDP, ZeRO-3 "
            "and tensor parallelism, each storage once; empty when no model is instrumented",
        ),
        Column(
            "grad_bytes",
            "Int64",
            "bytes of gradients at the end of the step's last backward: the parameters' and the optimizer's "
            "`.grad` (local shards) and DeepSpeed ZeRO's partitioned gradients",
        ),
        Column(
            "optimizer_state_bytes",
            "Int64",
            "bytes of optimizer state on this rank's device: the tensors in `optimizer.state` and master weights "
            "(the optimizer's parameters that are not the model's, as DeepSpeed's fp32 partitions)",
        ),
        Column(
            "categories_step",
            "Int64",
            "the step at which the three byte counts above were measured (the first steps and every 50th: rows "
            "between repeat the latest measurement)",
        ),
    ),
)

TELEMETRY = Table(
    "telemetry",
    "NVML samples of the rank's GPU, taken by a background thread.",
    (
        Column("time_us", "int64", "wall-clock instant of the sample"),
        Column("gpu", "int64", "NVML device index"),
        Column("util_pct", "Float64", "GPU utilisation"),
        Column("mem_util_pct", "Float64", "memory controller utilisation"),
        Column("mem_used_bytes", "Int64", "device memory used"),
        Column("mem_total_bytes", "Int64", "device memory total"),
        Column("power_w", "Float64", "power draw"),
        Column("power_limit_w", "Float64", "enforced power limit"),
        Column("temp_c", "Float64", "GPU temperature"),
        Column("sm_clock_mhz", "Float64", "current SM clock"),
        Column("sm_clock_max_mhz", "Float64", "maximum SM clock"),
        Column("throttle_reasons", "Int64", "NVML clock-event reason bitmask"),
        Column("pcie_tx_kib_per_s", "Float64", "PCIe transmit throughput (NVML's KB/s, of 1024 bytes)", "pcie_tx_kbps"),
        Column("pcie_rx_kib_per_s", "Float64", "PCIe receive throughput (NVML's KB/s, of 1024 bytes)", "pcie_rx_kbps"),
        Column("ecc_corrected", "Int64", "volatile corrected ECC errors"),
        Column("ecc_uncorrected", "Int64", "volatile uncorrected ECC errors"),
        Column("xid", "Int64", "XID error code seen since the previous sample; empty if none"),
        Column(
            "process_mem_used_bytes",
            "Int64",
            "device memory this rank's process uses, from NVML's compute processes (the CUDA context, PyTorch's "
            "reserved memory, NCCL and other libraries); empty where NVML does not say (another pid namespace)",
        ),
        Column(
            "other_processes_mem_used_bytes",
            "Int64",
            "device memory used by the other processes on the same GPU, from NVML's compute processes",
        ),
    ),
)

MICROBATCHES = Table(
    "microbatches",
    "Pipeline parallelism: one row per stage action on one micro-batch (and each send/recv wait).",
    (
        Column("step", "int64", "step the micro-batch belongs to"),
        Column("stage", "int64", "pipeline stage index (the rank's position in the pipeline)"),
        Column("virtual_stage", "int64", "model chunk index for interleaved schedules (the stage index otherwise)"),
        Column("microbatch", "int64", "micro-batch index within the step (-1 for waits not tied to one)"),
        Column("action", "category", "forward, backward, backward_input, backward_weight, send_wait, recv_wait"),
        Column("start_us", "int64", "wall-clock instant the action began"),
        Column("duration_us", "int64", "host wall time of the action"),
        Column("device_us", "Float64", "GPU time of the action from CUDA events; empty on CPU"),
        Column(
            "runqueue_wait_us",
            "Float64",
            "time the recording thread was ready to run but waited for a core during the action (other load on "
            "the host; Linux schedstat, empty elsewhere): not the stage's own work",
        ),
    ),
)

CALIBRATION = Table(
    "calibration",
    "A small fixed workload timed on the rank's device at `diag.init`, every `calibrate_every` steps (at the step "
    "boundary, outside any step's timing) and at `diag.finish`: how fast the machine ran for this job, so that "
    "`diag compare` and `diag analyze` can tell a slower machine from a slower job (diag/capture/calibration.py). "
    "On CPU a float32 matmul on the job's intra-op threads (other load on the cores slows it as it slows the "
    "job's compute); on CUDA a matmul timed with CUDA events, with the SM clock and performance state from NVML.",
    (
        Column("step", "int64", "the last step completed before it ran (-1: at init, before any step)"),
        Column("time_us", "int64", "wall-clock instant it began"),
        Column("device", "category", "where it ran: cpu or cuda"),
        Column("threads", "int64", "intra-op threads it ran on (torch.get_num_threads(), the job's own)"),
        Column("repeats", "int64", "timed repetitions of the fixed workload (after one untimed warm-up)"),
        Column("flops", "int64", "floating-point operations of one repetition"),
        Column("duration_us", "Float64", "mean time of one repetition (wall on CPU, CUDA events on GPU)"),
        Column("min_duration_us", "Float64", "fastest repetition: what the device does unhindered"),
        Column("sm_clock_mhz", "Float64", "CUDA: the SM clock NVML read right after it; empty elsewhere"),
        Column("sm_clock_max_mhz", "Float64", "CUDA: the SM clock's maximum"),
        Column("pstate", "Int64", "CUDA: NVML performance state (0 fastest to 15 slowest)"),
        Column("throttle_reasons", "Int64", "CUDA: NVML clock-event reason bitmask (THROTTLE_REASONS)"),
        Column(
            "interval_cpu_us",
            "Float64",
            "CPU time the training thread (the one calling diag.step) ran since the previous calibration (at init: "
            "during the calibration itself); Linux schedstat, empty elsewhere",
        ),
        Column(
            "interval_runqueue_wait_us",
            "Float64",
            "time the training thread was ready to run but waited for a core since the previous calibration "
            "(other load on the machine); (cpu + wait) / cpu is how much longer its runnable work took",
        ),
    ),
)

TABLES: dict[str, Table] = {
    t.name: t for t in (STEPS, PHASES, COLLECTIVES, MEMORY, TELEMETRY, MICROBATCHES, CALIBRATION)
}

# Read, never written: a torch.profiler (Kineto) trace's GPU activity, the Trace's ``gpu_kernels`` frame
# (diag.trace.kineto builds it; the GPU-time analysis reads it). Its times are on the trace's own clock.
GPU_KERNELS = Table(
    "gpu_kernels",
    "Every GPU activity with a stream (kernels, memcpy, memset) of a torch.profiler trace; imported by "
    "`diag analyze` from Kineto JSON, not written by diag.",
    (
        Column("ts_us", "float64", "device start"),
        Column("end_us", "float64", "device end"),
        Column("stream", "int32", "CUDA stream"),
        Column("kind", "category", "compute, communication (NCCL), memory (memcpy, memset) or other"),
        Column(
            "launch_us", "float64", "host instant of the CUDA runtime/driver call that launched it; empty if unmatched"
        ),
        Column(
            "step",
            "int64",
            "the step whose ProfilerStep had last started at launch (-1 before the first, -2 unmatched)",
        ),
    ),
)
IMPORTED_TABLES: dict[str, Table] = {GPU_KERNELS.name: GPU_KERNELS}

# NVML clock-event reason bits (nvmlClocksEventReason*), named for reports.
THROTTLE_REASONS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}

# Keys of manifest.json. Values may be null when unknown.
MANIFEST_KEYS: dict[str, str] = {
    "schema_version": "SCHEMA_VERSION of the writer",
    "run_id": "identifier shared by all ranks of one run: DIAG_RUN_ID if set, else the job's id with its restart counts (`job`), else chosen by rank 0",
    "rank": "global rank",
    "local_rank": "rank on this host",
    "world_size": "number of ranks",
    "local_world_size": "ranks on this host",
    "host": "host name",
    "pid": "process id",
    "launcher": "the process launcher whose variables gave the ranks: torchrun, slurm, mpi, pmi or none",
    "job": "{scheduler, job_id, job_name, restarts} of the job: scheduler slurm (SLURM_JOB_ID, SLURM_JOB_NAME), kubernetes (JOBSET_NAME of a JobSet or Kubeflow TrainJob, or the Kubeflow PyTorchJob name from MASTER_ADDR `<job>-master-0` / PET_RDZV_ENDPOINT `<job>-worker-0`) or torchelastic (TORCHELASTIC_RUN_ID); restarts {slurm_requeue: SLURM_RESTART_COUNT, jobset_restart: JOBSET_RESTART_ATTEMPT, torchelastic_restart: TORCHELASTIC_RESTART_COUNT} when > 0, which add `-requeueN`, `-attemptN`, `-restartN` to run_id; null when no launcher names a job",
    "backend": "default process group backend (nccl, gloo, ...)",
    "device": "torch device string of this rank (cuda:3, cpu)",
    "device_name": "GPU product name, or the CPU model",
    "gpu_index": "NVML index of the rank's GPU",
    "gpu_uuid": "GPU UUID",
    "torch_version": "torch.__version__",
    "cuda_version": "torch.version.cuda",
    "nccl_version": "NCCL version torch was built with",
    "python_version": "platform.python_version()",
    "parallel": "layout {dp, tp, pp, cp, ep} as given by the user",
    "flops_per_step": "model FLOPs of one step on this rank",
    "flops_source": "user, flop_counter, or null",
    "peak_tflops": "peak dense TFLOP/s of the device for `dtype`, as given by the user",
    "dtype": "training compute dtype (bfloat16, float16, float32, ...)",
    "clock_offset_us": "this rank's wall clock minus rank 0's, measured at init",
    "clock_sync_error_us": "the true offset is within clock_offset_us +- this (half the shortest round trip to rank 0)",
    "start_time_us": "wall-clock instant diag.init ran",
    "process_groups": "{pg name: {ranks, size, backend, desc, mesh_dim, timeout_s}} for every process group of "
    "the run (mesh_dim: the DeviceMesh dimension it is, e.g. tp, when a mesh was found on an instrumented module; "
    "timeout_s: its collectives' timeout)",
    "device_mesh": "{shape, dim_names, groups: {dim name: pg name}} of the DeviceMesh of an instrumented "
    "module's DTensor parameters (tensor parallel, FSDP2), the whole mesh where they sit on a slice of it "
    "(mesh['tp']), else absent",
    "capture": "what is being captured and what is off, with reasons",
    "pipeline": "pipeline layout when pipelined: {schedule, stages, virtual_stages, microbatches, stage}",
    "replica_group": "the process group (pg name) of the instrumented DDP model, whose ranks hold the same parameters (their `param_fingerprint`s are compared)",
    "memory_model": "{params, params_local, param_dtype, optimizer, master_weights, sharding, zero_stage, "
    "shard_degree} of the model and optimizer given to diag.instrument, for `diag memory-plan` (params: the whole "
    "model's, null when capture cannot tell, as for megatron-core's shards); absent when none was instrumented",
    "model_shape": "{micro_batch, seq_len, hidden, layers, heads, vocab, recompute, flash_attention, dropout, "
    "sequence_parallel} as given to diag.init(model_shape=...), for the activation memory `diag memory-plan` predicts",
    "hang_settings": "the environment variables that decide what a hang leaves to read (Flight Recorder, its "
    "dump, NCCL's watchdog and log: diag/readiness.py HANG_SETTINGS) as the rank ran with them, those set only; "
    "`diag doctor TRACE_DIR` judges them",
    "finished": "true once diag.finish() ran (rewritten at finish)",
    "end_time_us": "wall-clock instant diag.finish() ran",
    "capture_stopped": "{step, last_step, reason, time_us} when a write failed mid-run (a full disk, a directory "
    "made read-only) and capture stopped: nothing after `step` was recorded; absent while capture ran to the end",
}


# Keys of memory_deep.json (all byte counts on the rank's device). Written once, after the last chosen step.
MEMORY_DEEP_KEYS: dict[str, str] = {
    "format": f"`{MEMORY_DEEP_FORMAT}`",
    "device": "torch device string of the rank",
    "steps": "the steps recorded",
    "step_peaks": "[{step, peak_bytes}]: each recorded step's peak of the tensor memory the module tracker saw",
    "modules": "the step with the highest peak, at that peak (torch's MemTracker): {step, peak_bytes, phase "
    "(forward, backward, optimizer), active_modules (qualified names of the modules running), by_category "
    "{param_bytes, buffer_bytes, grad_bytes, optimizer_state_bytes, activation_bytes, temporary_bytes, other_bytes}, "
    "top_modules [{module, activation_bytes, temporary_bytes}] (the activations and temporaries alive at the peak, by "
    "the module whose forward or backward created them, most first), modules_total}; null when it could not run",
    "allocations": "CUDA only, from the caching allocator's history with Python stacks: {peak_bytes, peak_step, "
    "before_recording_bytes (allocated before the first recorded step and still alive at the peak), entries, "
    "truncated (the history's ring buffer overflowed), top_allocations [{bytes, count, frames [{filename, line, "
    "name}] innermost first}], stacks_total, ooms [{bytes, device_free_bytes, frames}]}; null on CPU",
}

# heartbeat.json state once a write failed mid-run and capture stopped (its last heartbeat)
CAPTURE_STOPPED = "capture_stopped"

# heartbeat.json (diag/trace/records.py Heartbeat; written by diag/capture/watchdog.py). A key added later is
# absent from older heartbeats, and every reader takes it as unknown.
HEARTBEAT_KEYS: dict[str, str] = {
    "rank, pid, time_us": "who wrote it, and the wall clock when (rewritten every interval_s while alive)",
    "step, last_step, phase, step_started_us": "the step in progress (null between steps), the last completed",
    "state": "running, stalled, finished, how the process ended, or capture_stopped (a write failed mid-run: the "
    "last heartbeat written; the manifest's `capture_stopped` says when and why)",
    "interval_s, threshold_s": "how often it is rewritten; a collective pending this long is a stall",
    "pending, pending_count": "the collectives entered and not seen complete (the first 8 of pending_count)",
    "stall": "the stall it describes (the collective pending longest), when state is stalled",
    "last_seq": "highest collective seq seen per process group",
    "groups": (
        "per process group, `issued` (the last collective handed to the group; a blocking call once it returned "
        "or raised) and `completed` (the last one seen complete): {seq, op, bytes, dtype, step, start_us} each, "
        "as its collectives row has them. With `pending`, what diag triage needs of a rank that stalled or "
        "ended, without reading its tables. Absent in heartbeats written before it existed"
    ),
    "dumps_written, exit": "hang dumps written so far; how the process ended (how, signal, error, time_us)",
}


# c10 ScalarType names, as Flight Recorder and Kineto write a tensor's dtype -> (torch dtype name, bytes each)
SCALAR_TYPES: dict[str, tuple[str, int]] = {
    "Float": ("float32", 4),
    "Double": ("float64", 8),
    "Half": ("float16", 2),
    "BFloat16": ("bfloat16", 2),
    "Int": ("int32", 4),
    "Long": ("int64", 8),
    "Short": ("int16", 2),
    "Char": ("int8", 1),
    "Byte": ("uint8", 1),
    "Bool": ("bool", 1),
    "Float8_e4m3fn": ("float8_e4m3fn", 1),
    "Float8_e5m2": ("float8_e5m2", 1),
    "ComplexFloat": ("complex64", 8),
    "ComplexDouble": ("complex128", 16),
}


def hang_dump_name(number: int) -> str:
    return f"{HANG_DUMP_PREFIX}{number:03d}.json"


def hang_dump_number(file_name: str) -> int | None:
    """The number of a hang dump file, or None if the name is not one."""
    match = re.fullmatch(rf"{HANG_DUMP_PREFIX}(\d+)\.json", file_name)
    return int(match.group(1)) if match else None


def earlier_heartbeat_name(number: int) -> str:
    return f"{EARLIER_HEARTBEAT_PREFIX}{number:03d}.json"


def earlier_heartbeat_number(file_name: str) -> int | None:
    """The attempt number of a kept earlier heartbeat, or None if the name is not one."""
    match = re.fullmatch(rf"{EARLIER_HEARTBEAT_PREFIX}(\d+)\.json", file_name)
    return int(match.group(1)) if match else None


def segment_name(table: str, number: int, suffix: str) -> str:
    """A schema-2 segment file: ``collectives.000001.arrows`` (live stream) or ``collectives.000001.parquet``."""
    return f"{table}.{number:06d}.{suffix}"


def rank_dir_name(rank: int) -> str:
    return f"{RANK_DIR_PREFIX}{rank:05d}"


def parse_marker(line: str) -> tuple[int, str] | None:
    """Return (schema version, table name) of a file's marker line, or None if it is not one."""
    if not line.startswith(MARKER_PREFIX):
        return None
    fields = dict(part.split("=", 1) for part in line[len(MARKER_PREFIX) :].split() if "=" in part)
    try:
        return int(fields["schema"]), fields["table"]
    except (KeyError, ValueError):
        return None


def _former(column: Column) -> str:
    return (
        f" (written `{column.former_name}` by earlier versions; read under either name)" if column.former_name else ""
    )


def render_markdown() -> str:
    """docs/trace-format.md, generated from this module (``python -m diag.trace.schema``)."""
    lines = [
        "# diag trace format",
        "",
        f"Schema version **{SCHEMA_VERSION}**. Generated from `diag/trace/schema.py`, the single source of truth; "
        "regenerate with `python -m diag.trace.schema > docs/trace-format.md`.",
        "",
        __doc__.strip(),
        "",
        "## Layout",
        "",
        "```",
        "TRACE_DIR/",
        "  rank00000/",
        f"    {MANIFEST_FILE}",
        *(
            f"    {segment_name(t.name, 1, 'parquet')}   (schema 2; or {t.file_name}, schema 1)"
            for t in TABLES.values()
        ),
        f"    {segment_name('collectives', 2, 'arrows')}    (schema 2: a live segment, not yet compacted)",
        f"    {EVENTS_FILE}",
        f"    {HEARTBEAT_FILE}      (written by the hang watchdog)",
        f"    {earlier_heartbeat_name(1)}   (an earlier attempt's last heartbeat, kept by a restart)",
        f"    {NCCL_LOG_FILE}            (NCCL's own log, when diag set NCCL_DEBUG for the user)",
        f"    {MEMORY_DEEP_FILE}    (the deep memory mode's result, when memory_deep_steps was given)",
        "  rank00001/ ...",
        "```",
        "",
    ]
    for table in TABLES.values():
        lines += [f"## `{table.name}`", "", table.doc, "", "| column | type | meaning |", "|---|---|---|"]
        lines += [f"| `{c.name}` | {c.dtype} | {c.doc}{_former(c)} |" for c in table.columns]
        lines.append("")
    for table in IMPORTED_TABLES.values():
        lines += [f"## `{table.name}` (imported)", "", table.doc, "", "| column | type | meaning |", "|---|---|---|"]
        lines += [f"| `{c.name}` | {c.dtype} | {c.doc} |" for c in table.columns]
        lines.append("")
    lines += [f"## `{MANIFEST_FILE}`", "", "| key | meaning |", "|---|---|"]
    lines += [f"| `{key}` | {doc} |" for key, doc in MANIFEST_KEYS.items()]
    lines += ["", f"## `{MEMORY_DEEP_FILE}`", "", "| key | meaning |", "|---|---|"]
    lines += [f"| `{key}` | {doc} |" for key, doc in MEMORY_DEEP_KEYS.items()]
    lines += ["", f"## `{HEARTBEAT_FILE}`", "", "| key | meaning |", "|---|---|"]
    lines += [f"| `{key}` | {doc} |" for key, doc in HEARTBEAT_KEYS.items()]
    lines += ["", "## Throttle reasons", "", "| bit | name |", "|---|---|"]
    lines += [f"| `{bit:#x}` | {name} |" for bit, name in THROTTLE_REASONS.items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render_markdown(), end="")
