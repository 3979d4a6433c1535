"""The facade: ``analyze(trace) -> Report``, every analysis run over one loaded trace. ``Report.to_dict()`` is
the JSON contract documented in docs/analyze.md; views only present a Report."""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from diag.analysis import bubble as bubble_analysis
from diag.analysis import comms as comms_analysis
from diag.analysis import grid
from diag.analysis import mfu as mfu_analysis
from diag.analysis import stragglers as stragglers_analysis
from diag.analysis.bubble import SECTION as BUBBLE
from diag.analysis.bubble import BubbleReport, analyze_bubble, gantt_rows, stage_work_per_step_us
from diag.analysis.calibration import MachineSpeed, machine_speed
from diag.analysis.collective_waits import loaded_waits
from diag.analysis.comms import SECTION as COMMS
from diag.analysis.comms import CommsReport, ReducedWaits, analyze_comms
from diag.analysis.engine import Shard, run_loaded, window_us_of
from diag.analysis.failures import SECTION as FAILURES
from diag.analysis.failures import (
    FailureReport,
    earlier_attempt_failure,
    find_failures,
    judge_failure,
)
from diag.analysis.findings import Finding, FindingContext, rank_findings
from diag.analysis.gpu_time import SECTION as GPU_TIME
from diag.analysis.gpu_time import GpuTimeReport, analyze_gpu_time
from diag.analysis.health import SECTION as HEALTH
from diag.analysis.health import HealthAnalysis, HealthReport
from diag.analysis.links import SECTION as LINKS
from diag.analysis.links import LinkReport, analyze_links
from diag.analysis.memory import SECTION as MEMORY
from diag.analysis.memory import MemoryAnalysis, MemoryReport, memory_pressure
from diag.analysis.memory_deep import analyze_memory_deep
from diag.analysis.memory_plan import plan_against_measured
from diag.analysis.mesh import SECTION as MESH
from diag.analysis.mesh import MeshReport, analyze_mesh, group_waits_s, place_rank
from diag.analysis.mfu import SECTION as MFU
from diag.analysis.mfu import MfuReport, analyze_mfu
from diag.analysis.nccl import SECTION as NCCL
from diag.analysis.nccl import NcclReport, analyze_nccl
from diag.analysis.oom import explain_ooms
from diag.analysis.section import Section, json_safe
from diag.analysis.stragglers import SECTION as STRAGGLERS
from diag.analysis.stragglers import (
    RankStepTimes,
    StragglerReport,
    find_stragglers,
    rank_step_times,
)
from diag.analysis.telemetry import SECTION as TELEMETRY
from diag.analysis.telemetry import TelemetryAnalysis, TelemetryReport
from diag.analysis.window import StepWindow, choose_window, in_window_array, parse_step_range, select
from diag.trace.loader import Trace
from diag.trace.mesh import MeshLayout

# the per-step tables' columns this module reads (analysis/columns.py: what the loader keeps for it)
READS = {"steps": ("start_us", "duration_us", "data_wait_us")}

MAX_SKIPPED_LISTED = 200
REPORT_VERSION = 1

# Every section of the report, in the order the report, its JSON, its text and its HTML present them: each
# analysis module's SECTION (its findings and its JSON). A new analysis is its module, its field of Report, its
# call in ``analyze`` and one line here; views render a section by its name.
TIMELINE = Section("timeline")
PIPELINE_TIMELINE = Section("pipeline_timeline", in_json="never")  # one step's actions per stage: the Gantt's
SECTIONS = (
    FAILURES,
    TIMELINE,
    STRAGGLERS,
    MFU,
    COMMS,
    LINKS,
    MESH,
    NCCL,
    MEMORY,
    TELEMETRY,
    BUBBLE,
    PIPELINE_TIMELINE,
    GPU_TIME,
    HEALTH,
)


@dataclass
class RunInfo:
    path: str
    run_id: str | None
    world_size: int | None
    ranks_found: list[int]
    ranks_missing: list[int]
    ranks_without_steps: list[int]
    hosts: int
    device_name: str | None
    steps: int  # distinct steps recorded
    window: StepWindow
    skipped: list[dict] = field(default_factory=list)  # {path, reason, lines}
    skipped_total: int = 0
    notes: list[str] = field(default_factory=list)
    launcher: str | None = None  # process launcher from the manifests: torchrun, slurm, mpi, pmi, none
    job: dict | None = None  # {scheduler, job_id, job_name, restarts} from the manifests, when a launcher named one
    step_errors: list[dict] = field(default_factory=list)  # {rank, step, kind, error, time_us}, earliest first
    rank_exits: list[dict] = field(default_factory=list)  # {rank, how, error, last_step}: ranks that ended abnormally
    machine: MachineSpeed | None = None  # how fast the machine ran (the calibration rows); None without them


@dataclass
class Timeline:
    """Series the views draw: per step across ranks, and per rank across steps (medians, in ms)."""

    per_step: list[dict] = field(
        default_factory=list
    )  # step, iteration_median_ms, iteration_max_ms, busy_median_ms, busy_max_ms, slowest_rank
    per_rank: list[dict] = field(default_factory=list)  # rank, host, busy_ms, compute_ms, data_wait_ms, comm_wait_ms


@dataclass
class Report:
    run: RunInfo
    findings: list[Finding]
    stragglers: StragglerReport
    mfu: MfuReport
    comms: CommsReport
    memory: MemoryReport
    telemetry: TelemetryReport
    timeline: Timeline
    bubble: BubbleReport | None = None  # None for runs without pipeline parallelism
    pipeline_timeline: list[dict] = field(default_factory=list)  # one step's actions per stage, for the Gantt
    gpu_time: GpuTimeReport | None = None  # torch.profiler (Kineto) imports only; None for diag's own traces
    health: HealthReport = field(default_factory=HealthReport)  # loss, gradient norm, replica fingerprints
    links: LinkReport | None = None  # process groups by busbw, the host or link common to slow ones; None: < 2 groups
    nccl: NcclReport | None = None  # NCCL's own view from the ranks' nccl.log; None without any
    mesh: MeshReport | None = None  # communication per device-mesh dimension; None for a run without a mesh

    def to_state(self) -> dict:
        """Everything in the Report, JSON-safe and structured like the dataclasses, for ``from_state``."""
        return json_safe(self)

    @classmethod
    def from_state(cls, state: dict) -> Report:
        return _build(cls, state)

    def to_dict(self) -> dict:
        window = json_safe(self.run.window)
        window.pop("step_indices", None)
        run = json_safe(self.run)
        run["window"] = window
        if run.get("machine") is None:  # traces without calibration rows: the run section is what it was
            run.pop("machine", None)
        out = {"report_version": REPORT_VERSION, "run": run, "findings": json_safe(self.findings)}
        for section in SECTIONS:
            if section.in_report:
                out.update(section.json_keys(getattr(self, section.name)))
        return out


def analyze(
    trace: Trace,
    steps: str | tuple | None = None,
    peak_tflops: float | None = None,
    flops_per_step: float | None = None,
    reduce_collectives=None,
    run_ranks=None,
) -> Report:
    """``reduce_collectives``: ``window -> ReducedWaits | None``, the collectives' waits reduced partition by
    partition (diag.analysis.collective_waits) when ``trace.collectives`` was not loaded; None: by the same two
    stages over the loaded table.
    ``run_ranks``: ``(analyses, window) -> their results``, the engine's analyses (telemetry, memory, health) run
    over the ranks' files when the trace's memory and telemetry were not loaded (nor the steps' loss, gradient
    norm and fingerprint); None: over the loaded tables."""
    step_range = parse_step_range(steps) if isinstance(steps, str) else steps
    failures = find_failures(trace.events, trace.heartbeats, trace.manifests, trace.clock_offsets_us())
    if failures.step_errors or failures.crashed:  # name the rank diag triage names, not the first to raise
        failures.blame = judge_failure(trace)
    else:
        failures.earlier = earlier_attempt_failure(trace)
    window = choose_window(trace.steps, step_range, failures.failed_steps)
    ranks_info = _ranks_info(trace)
    hosts = ranks_info["host"].dropna().astype(str).to_dict() if "host" in ranks_info else {}

    waits = reduce_collectives(window) if reduce_collectives is not None else _loaded_waits(trace, window)

    def window_rows(module: types.ModuleType) -> pd.DataFrame:
        """The window's rows of the steps table, with only the columns ``module`` reads: a copy of every column
        (~1.2 GB at 16,384 ranks x 1,000 steps) would be held beside the step times, at the analysis's peak."""
        return select(trace.steps, window, module.READS["steps"])

    times = rank_step_times(
        window_rows(stragglers_analysis), waits.per_rank_step if waits is not None else None, _pipeline_stages(trace)
    )
    comms = analyze_comms(waits, window_rows(comms_analysis), _pg_sizes(trace))
    if waits is not None:  # nothing after reads the per-rank-step waits, nor the hash of their index comms built
        waits = dataclasses.replace(waits, per_rank_step=None)
    pipelined = len(trace.microbatches) > 0
    stage_work = stage_work_per_step_us(trace.microbatches, window_rows(bubble_analysis)) if pipelined else None
    replicas = ranks_sharing_tokens(trace)
    mfu = analyze_mfu(times.frame, trace.manifests, window_rows(mfu_analysis), flops_per_step, peak_tflops, replicas)
    telemetry, memory, health = _rank_by_rank(trace, window, hosts, run_ranks)
    throttled = {g.rank: g.throttled_share for g in telemetry.gpus if g.throttled}
    last_arrival = {r.rank: r.last_arrival_fraction for r in comms.per_rank} if waits is not None else {}
    memory.ooms = explain_ooms(trace.events, memory, trace.manifests, trace.world_size)
    memory.plan = plan_against_measured(trace, memory.per_rank)
    memory.deep = analyze_memory_deep(trace.memory_deep)
    layout = MeshLayout.from_manifests(trace.manifests)
    mesh = analyze_mesh(layout, comms)
    place = functools.partial(place_rank, layout, group_waits_s(comms)) if layout is not None else None
    stragglers = find_stragglers(times, ranks_info, throttled, last_arrival, memory_pressure(memory), stage_work, place)

    bubble = analyze_bubble(trace, window.step_indices) if len(trace.microbatches) else None

    results = {
        "failures": failures,
        "timeline": _timeline(times.frame, hosts),
        "stragglers": stragglers,
        "mfu": mfu,
        "comms": comms,
        "links": analyze_links(waits, _pg_ranks(trace), hosts, layout),
        "mesh": mesh,
        "nccl": analyze_nccl(trace.nccl_logs, trace.manifests),
        "memory": memory,
        "telemetry": telemetry,
        "bubble": bubble,
        "pipeline_timeline": gantt_rows(trace).to_dict("records") if bubble is not None else [],
        "gpu_time": analyze_gpu_time(trace.gpu_kernels, window.step_indices),
        "health": health,
    }
    ctx = FindingContext(mfu.step_time_median_s, window.steps_analysed, times, stragglers)
    found = [f for section in SECTIONS for f in section.findings_of(results[section.name], ctx)]
    sections = {section.name: results[section.name] for section in SECTIONS if section.in_report}
    return Report(_run_info(trace, window, ranks_info, failures), rank_findings(found), **sections)


def _rank_by_rank(trace: Trace, window: StepWindow, hosts: dict, run_ranks) -> tuple:
    """The telemetry, memory and health reports: over the ranks' files by ``run_ranks``, else over the loaded
    tables. Health does not read the files when the load saw no rank hold a value of its columns."""
    telemetry_memory = (TelemetryAnalysis(hosts), MemoryAnalysis(window))
    health = HealthAnalysis.of(trace.events, trace.manifests)
    if run_ranks is None:
        bounds = telemetry_bounds_in_window(trace.steps, window)
        tables = {"memory": trace.memory, "telemetry": trace.telemetry, "steps": trace.steps}
        return tuple(run_loaded((*telemetry_memory, health), Shard(tables, window_us_of(bounds))))
    if _held_values(trace, health):
        return tuple(run_ranks((*telemetry_memory, health), window))
    return (*run_ranks(telemetry_memory, window), *run_loaded([health], Shard({}, window_us_of(None))))


def _held_values(trace: Trace, analysis) -> bool:
    """Whether a column the analysis reads held a value on some rank, as far as the load knows (it left those
    columns out: ``Trace.left_out_values``; not known: yes)."""
    if trace.left_out_values is None:
        return True
    return any((table, c) in trace.left_out_values for table, columns in analysis.reads.items() for c in columns)


def _ranks_info(trace: Trace) -> pd.DataFrame:
    """host, local_rank and gpu_index by rank, from the manifests (an empty frame without any)."""
    columns = ["host", "local_rank", "gpu_index"]
    rows = {rank: [m.host, m.local_rank, m.gpu_index] for rank, m in trace.manifests.items()}
    frame = pd.DataFrame.from_dict(rows, orient="index", columns=columns)
    frame.index.name = "rank"
    return frame


def _pipeline_stages(trace: Trace) -> dict[int, int] | None:
    """rank -> pipeline stage, when the run is pipelined: only ranks of the same stage do the same work."""
    stages = {
        rank: m.pipeline.stage for rank, m in trace.manifests.items() if m.pipeline and m.pipeline.stage is not None
    }
    return stages or None


def _pg_sizes(trace: Trace) -> dict[str, int]:
    """Process-group sizes from the manifests' process_groups, where capture recorded them."""
    return {
        name: group.size for m in trace.manifests.values() for name, group in m.process_groups.items() if group.size
    }


def _pg_ranks(trace: Trace) -> dict[str, list[int]]:
    """Process-group members from the manifests, where capture recorded them."""
    return {
        name: list(group.ranks)
        for m in trace.manifests.values()
        for name, group in m.process_groups.items()
        if group.ranks
    }


def ranks_sharing_tokens(trace: Trace) -> int:
    """Ranks that see the same tokens (tensor, pipeline and context parallel), to not count tokens twice."""
    layout = trace.first_manifest_value("parallel")
    return layout.ranks_sharing_tokens() if layout is not None else 1


def telemetry_bounds(steps_w: pd.DataFrame) -> pd.DataFrame:
    """Per rank, first_us and last_us: from the start of its first step in the window to the end of its last
    (its longest step after the last start), on its own clock."""
    bounds = steps_w.groupby("rank").agg(first_us=("start_us", "min"), last_us=("start_us", "max"))
    bounds["last_us"] += steps_w.groupby("rank")["duration_us"].max()
    return bounds


def telemetry_bounds_in_window(steps: pd.DataFrame, window: StepWindow) -> pd.DataFrame | None:
    """``telemetry_bounds(select(steps, window))`` (None where the window has no step), without the selected
    copy of the steps table where it is the usual one (diag.analysis.grid): the window's columns of the ranks x
    steps matrices of start and duration."""
    layout = grid.rank_major(steps["rank"].to_numpy(), steps["step"].to_numpy()) if len(steps) else None
    if layout is None or any(steps[c].dtype.kind not in "iu" for c in ("start_us", "duration_us")):
        steps_w = select(steps, window)
        return telemetry_bounds(steps_w) if len(steps_w) else None
    ranks, order = layout
    keep = in_window_array(order, window)
    if not keep.any():
        return None
    start = steps["start_us"].to_numpy().reshape(ranks, len(order))[:, keep]
    duration = steps["duration_us"].to_numpy().reshape(ranks, len(order))[:, keep]
    heads = steps["rank"].to_numpy()[:: len(order)]
    by_rank = np.argsort(heads, kind="stable")
    bounds = pd.DataFrame(
        {"first_us": start.min(axis=1)[by_rank], "last_us": start.max(axis=1)[by_rank]},
        index=pd.Index(heads[by_rank], name="rank"),
    )
    bounds["last_us"] += pd.Series(duration.max(axis=1)[by_rank], index=bounds.index)
    return bounds


def capture_stopped_notes(trace: Trace) -> list[str]:
    """One note per (step, reason) where capture stopped mid-run on some ranks (``manifest.capture_stopped``): the
    steps those ranks recorded are all the report can cover of them."""
    by_stop: dict[tuple, list[int]] = {}
    for rank, manifest in sorted(trace.manifests.items()):
        stopped = manifest.capture_stopped
        if stopped is not None:
            by_stop.setdefault((stopped.step, stopped.reason), []).append(int(rank))
    notes = []
    for (step, reason), ranks in by_stop.items():
        recorded = trace.steps.loc[trace.steps["rank"].isin(ranks), "step"] if len(trace.steps) else []
        covers = f"steps {int(recorded.min())}-{int(recorded.max())}" if len(recorded) else "no step"
        who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {_few_ranks(ranks)}"
        at = f" at step {step}" if step is not None else ""
        notes.append(
            f"capture stopped{at} ({reason}) on {who}: the report covers {covers} there; nothing after was recorded"
        )
    return notes


def _few_ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks[:10])) + (" ..." if len(ranks) > 10 else "")


def _unreadable_ranks(trace: Trace) -> set[int]:
    """Ranks whose directory, or a file in it, the loader could not read (a PermissionError, an I/O error, a
    damaged or implausible segment)."""
    from diag.trace.loader import RANK_DIR_RE

    ranks = set()
    for skip in trace.skipped:
        if skip.reason.startswith("unreadable"):
            path = Path(skip.path)
            match = RANK_DIR_RE.match(path.name) or RANK_DIR_RE.match(path.parent.name)
            if match:
                ranks.add(int(match.group(1)))
    return ranks


def _run_info(trace: Trace, window: StepWindow, ranks_info: pd.DataFrame, failures: FailureReport) -> RunInfo:
    with_steps = set(trace.steps["rank"].unique()) if len(trace.steps) else set()
    skipped = [{"path": s.path, "reason": s.reason, "lines": s.lines} for s in trace.skipped]
    notes = list(window.notes)
    if trace.ranks_missing:
        notes.append(
            f"{len(trace.ranks_missing)} of {trace.world_size} ranks have no traces; the report covers the others"
        )
    notes += failures.notes()
    notes += capture_stopped_notes(trace)
    without_steps = sorted(int(r) for r in set(trace.ranks_found) - with_steps)
    unreadable = _unreadable_ranks(trace)
    if without_steps and with_steps:
        unread = [r for r in without_steps if r in unreadable]
        silent = [r for r in without_steps if r not in unreadable]
        if unread:
            notes.append(
                f"{'ranks' if len(unread) > 1 else 'rank'} {_few_ranks(unread)}: files that could not be read "
                "(see skipped), so no step of them is in the report"
            )
        if silent:
            notes.append(
                f"{'ranks' if len(silent) > 1 else 'rank'} {_few_ranks(silent)} recorded no step: killed before "
                "their first write, or stuck before their first step (diag triage tells which)"
            )
    return RunInfo(
        path=str(trace.path),
        run_id=None if trace.run_id is None else str(trace.run_id),
        world_size=trace.world_size,
        ranks_found=list(map(int, trace.ranks_found)),
        ranks_missing=list(map(int, trace.ranks_missing)),
        ranks_without_steps=without_steps,
        hosts=int(ranks_info["host"].nunique()) if "host" in ranks_info else 0,
        device_name=trace.first_manifest_value("device_name"),
        steps=int(trace.steps["step"].nunique()) if len(trace.steps) else 0,
        window=window,
        skipped=skipped[:MAX_SKIPPED_LISTED],
        skipped_total=len(skipped),
        notes=notes,
        launcher=trace.first_manifest_value("launcher"),
        job=trace.first_manifest_value("job"),
        step_errors=[dataclasses.asdict(f) for f in failures.step_errors[:MAX_SKIPPED_LISTED]],
        rank_exits=[dataclasses.asdict(e) for e in failures.exits],
        machine=machine_speed(getattr(trace, "calibration", None)),
    )


def _timeline(times: pd.DataFrame, hosts: dict) -> Timeline:
    if times.empty:
        return Timeline()
    # diag.analysis.grid: the groupbys' results, as ranks x steps matrices where the frame is the usual one
    per_step = pd.DataFrame(
        {
            "iteration_median_ms": grid.per_step(times, "iteration_us") / 1e3,
            "iteration_max_ms": grid.per_step(times, "iteration_us", "max") / 1e3,
            "busy_median_ms": grid.per_step(times, "busy_us") / 1e3,
            "busy_max_ms": grid.per_step(times, "busy_us", "max") / 1e3,
            "slowest_rank": grid.rank_of_step_max(times, "busy_us"),
        }
    )
    per_rank = pd.DataFrame(
        {
            "busy_ms": grid.per_rank(times, "busy_us") / 1e3,
            "compute_ms": grid.per_rank(times, "compute_us") / 1e3,
            "data_wait_ms": grid.per_rank(times, "data_wait_us") / 1e3,
            "comm_wait_ms": grid.per_rank(times, "wait_us") / 1e3,
        }
    )
    per_rank["host"] = [hosts.get(r) for r in per_rank.index]
    return Timeline(
        per_step=per_step.reset_index().to_dict("records"),
        per_rank=per_rank.reset_index().to_dict("records"),
    )


def all_step_times(trace: Trace, reduce_collectives=None) -> RankStepTimes | None:
    """Per (rank, step) timings over every recorded step, split as ``analyze`` splits its window's (the Report
    keeps only the window's medians; the dashboard draws every step). None without steps.
    ``reduce_collectives``: as ``analyze``'s, when the collectives were not loaded (given every step)."""
    if trace.steps.empty:
        return None
    if reduce_collectives is not None:
        first, last = int(trace.steps["step"].min()), int(trace.steps["step"].max())
        waits = reduce_collectives(StepWindow(first, last, last - first + 1, int(trace.steps["step"].nunique())))
    else:
        waits = _loaded_waits(trace, None)
    return rank_step_times(trace.steps, waits.per_rank_step if waits is not None else None, _pipeline_stages(trace))


def _loaded_waits(trace: Trace, window: StepWindow | None) -> ReducedWaits | None:
    """The waits of the loaded ``trace.collectives`` in ``window`` (None: every row)."""
    return loaded_waits(trace.collectives, window, trace.clock_offsets_us())


def options_fingerprint(**options) -> str:
    """Identifies a report: the options it was made with and the analysis code that made it."""
    digest = hashlib.blake2b(digest_size=12)
    digest.update(json.dumps({"report_version": REPORT_VERSION, **options}, sort_keys=True, default=str).encode())
    digest.update(_analysis_code_digest().encode())
    return digest.hexdigest()


@functools.cache
def _analysis_code_digest() -> str:
    """diag's version and the contents of the analysis, trace and triage modules (triage names a failed job's
    culprit in the report): an edited module makes a new report, while a copy or a reinstall of the same code
    (new modification times) keeps serving the cached one."""
    from diag import __version__

    digest = hashlib.blake2b(__version__.encode(), digest_size=12)
    package = Path(__file__).parents[1]
    for source in [path for part in ("analysis", "trace", "triage") for path in sorted((package / part).glob("*.py"))]:
        digest.update(f"{source.parent.name}/{source.name}:".encode() + source.read_bytes())
    return digest.hexdigest()


@functools.cache
def _type_hints(cls) -> dict:
    """A dataclass's resolved annotations, once per class: resolving them for each of the ~70,000 per-rank rows of
    a 16,384-rank report was most of a cached report's load."""
    return typing.get_type_hints(cls)


def _build(cls, data):
    """Rebuild dataclass ``cls`` from its ``_plain`` form (lists of dataclasses, optional fields)."""
    hints = _type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name in data:
            kwargs[f.name] = _build_value(hints[f.name], data[f.name])
    return cls(**kwargs)


def _build_value(hint, value):
    if value is None:
        return None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return _build_value(inner[0], value) if len(inner) == 1 else value
    if dataclasses.is_dataclass(hint):
        return _build(hint, value)
    if origin is list and args:
        return [_build_value(args[0], v) for v in value]
    if hint is np.ndarray:
        return np.asarray(value, dtype="int64")
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return hint(value)
    return value
