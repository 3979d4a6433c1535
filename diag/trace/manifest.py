"""``manifest.json``, parsed once: who a rank is, how the run is laid out, what it costs per step.

Capture writes the manifest as a JSON object (keys documented in ``schema.MANIFEST_KEYS``); the loader turns
each rank's object into a :class:`Manifest` here, and every reader (analyses, views, triage, metrics) uses its
typed fields instead of parsing the dict again. A value of the wrong type (a manifest is user-writable, and
torch.profiler imports fill only some keys) becomes ``None``; values that would divide or scale a result
(FLOPs, peak TFLOP/s, world size) are checked here and the odd ones named in the loader's notes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field

from diag.trace.json_values import as_rank, finite, mapping, positive_int, positive_number, text, whole
from diag.trace.schema import MAX_RANK, SCHEMA_VERSION

# manifest values that divide or scale results: a zero, negative, non-finite or non-numeric one is dropped
# (the analysis then falls back as if it were absent) and named, instead of a ZeroDivisionError or a wrong MFU
POSITIVE_FIELDS = ("peak_tflops", "flops_per_step")


@dataclass(frozen=True)
class ProcessGroupInfo:
    """One process group as capture described it (or torch.profiler's ``pg_config``)."""

    name: str
    ranks: tuple[int, ...] = ()  # global ranks, valid ones only
    size: int | None = None
    backend: str | None = None
    desc: str | None = None
    mesh_dim: str | None = None  # the DeviceMesh dimension this group is (tp, dp_shard), when a mesh was found
    timeout_s: float | None = None  # its collectives' timeout

    @classmethod
    def from_json(cls, name: str, raw: dict) -> ProcessGroupInfo:
        ranks = raw.get("ranks")
        members = [as_rank(r) for r in ranks] if isinstance(ranks, list) else []
        return cls(
            name=name,
            ranks=tuple(r for r in members if r is not None),
            size=positive_int(raw.get("size")),
            backend=text(raw.get("backend")),
            desc=text(raw.get("desc")),
            mesh_dim=text(raw.get("mesh_dim")),
            timeout_s=positive_number(raw.get("timeout_s")),
        )


@dataclass(frozen=True)
class PipelineLayout:
    """Pipeline parallelism as the schedule reported it; this rank's ``stage``."""

    schedule: str | None = None
    stages: int | None = None
    virtual_stages: int | None = None
    microbatches: int | None = None
    stage: int | None = None

    @classmethod
    def from_json(cls, raw: dict) -> PipelineLayout:
        return cls(
            schedule=text(raw.get("schedule")),
            stages=positive_int(raw.get("stages")),
            virtual_stages=positive_int(raw.get("virtual_stages")),
            microbatches=positive_int(raw.get("microbatches")),
            stage=as_rank(raw.get("stage")),  # from 0, as a rank is
        )


@dataclass(frozen=True)
class MemoryModel:
    """What capture learnt of the instrumented model and optimizer, for the memory plan (manifest ``memory_model``)."""

    params: int | None = None  # the whole model's parameters, when capture could tell
    params_local: int | None = None  # this rank's
    param_dtype: str | None = None
    optimizer: str | None = None  # class name (AdamW, FusedAdam, ...)
    master_weights: bool | None = None
    sharding: str | None = None  # ddp, fsdp1, fsdp2, deepspeed, none
    zero_stage: int | None = None  # ZeRO stage or FSDP's equivalent
    shard_degree: int | None = None  # ranks the model states are sharded over

    @classmethod
    def from_json(cls, raw: dict) -> MemoryModel:
        stage = whole(raw.get("zero_stage"))
        master = raw.get("master_weights")
        return cls(
            params=positive_int(raw.get("params")),
            params_local=positive_int(raw.get("params_local")),
            param_dtype=text(raw.get("param_dtype")),
            optimizer=text(raw.get("optimizer")),
            master_weights=master if isinstance(master, bool) else None,
            sharding=text(raw.get("sharding")),
            zero_stage=stage if stage in (0, 1, 2, 3) else None,
            shard_degree=positive_int(raw.get("shard_degree")),
        )


@dataclass(frozen=True)
class ModelShape:
    """The transformer's shape as the user gave ``diag.init(model_shape=...)`` (manifest ``model_shape``)."""

    micro_batch: int | None = None
    seq_len: int | None = None
    hidden: int | None = None
    layers: int | None = None
    heads: int | None = None
    vocab: int | None = None
    recompute: str | None = None  # none, selective, full
    flash_attention: bool | None = None
    dropout: bool | None = None
    sequence_parallel: bool | None = None

    @classmethod
    def from_json(cls, raw: dict) -> ModelShape:
        flags = {k: raw.get(k) if isinstance(raw.get(k), bool) else None for k in MODEL_SHAPE_FLAGS}
        recompute = text(raw.get("recompute"))
        return cls(
            **{k: positive_int(raw.get(k)) for k in MODEL_SHAPE_SIZES},
            recompute=recompute if recompute in ("none", "selective", "full") else None,
            **flags,
        )


MODEL_SHAPE_SIZES = ("micro_batch", "seq_len", "hidden", "layers", "heads", "vocab")
MODEL_SHAPE_FLAGS = ("flash_attention", "dropout", "sequence_parallel")


@dataclass(frozen=True)
class CaptureStopped:
    """A write failed mid-run and capture stopped (``manifest.capture_stopped``): nothing after ``step``."""

    step: int | None
    last_step: int | None  # the last step the rank completed when it stopped
    reason: str
    time_us: int | None

    @classmethod
    def from_json(cls, raw) -> CaptureStopped | None:
        if not isinstance(raw, dict):
            return None
        return cls(
            step=whole(raw.get("step")),
            last_step=whole(raw.get("last_step")),
            reason=(text(raw.get("reason")) or "unknown reason")[:200],
            time_us=whole(raw.get("time_us")),
        )


@dataclass(frozen=True)
class ParallelLayout:
    """The layout the user gave ``diag.init(parallel=...)``: degrees of each kind of parallelism."""

    dp: int | None = None
    tp: int | None = None
    pp: int | None = None
    cp: int | None = None
    ep: int | None = None

    @classmethod
    def from_json(cls, raw: dict) -> ParallelLayout:
        return cls(**{name: positive_int(raw.get(name)) for name in ("dp", "tp", "pp", "cp", "ep")})

    def ranks_sharing_tokens(self) -> int:
        """Ranks that see the same tokens (tensor, pipeline and context parallel), to not count tokens twice."""
        return (self.tp or 1) * (self.pp or 1) * (self.cp or 1)


@dataclass(frozen=True)
class Manifest:
    """One rank's manifest.json. Field names are the JSON keys (``schema.MANIFEST_KEYS``; a test checks both)."""

    rank: int
    schema_version: int | None = None
    run_id: str | None = None
    local_rank: int | None = None
    world_size: int | None = None  # None when absent or implausible (the loader then uses the ranks present)
    local_world_size: int | None = None
    host: str | None = None
    pid: int | None = None
    launcher: str | None = None
    job: dict | None = None  # {scheduler, job_id, job_name, restarts}
    backend: str | None = None
    device: str | None = None
    device_name: str | None = None
    gpu_index: int | None = None
    gpu_uuid: str | None = None
    torch_version: str | None = None
    cuda_version: str | None = None
    nccl_version: str | None = None
    python_version: str | None = None
    parallel: ParallelLayout | None = None
    flops_per_step: float | None = None
    flops_source: str | None = None
    peak_tflops: float | None = None
    dtype: str | None = None
    clock_offset_us: float | None = None
    clock_sync_error_us: float | None = None
    start_time_us: int | None = None
    process_groups: dict[str, ProcessGroupInfo] = field(default_factory=dict)
    device_mesh: dict | None = None
    capture: dict[str, str] = field(default_factory=dict)
    pipeline: PipelineLayout | None = None
    replica_group: str | None = None  # the DDP model's process group: its ranks are replicas
    memory_model: MemoryModel | None = None
    model_shape: ModelShape | None = None
    finished: bool = False
    end_time_us: int | None = None
    capture_stopped: CaptureStopped | None = None
    hang_settings: dict[str, str] = field(default_factory=dict)  # readiness.HANG_SETTINGS the rank ran with
    # who wrote it: None for diag's capture, "kineto" for a manifest made from a torch.profiler trace
    source: str | None = None
    trace_id: str | None = None

    @classmethod
    def from_json(cls, raw: dict, rank: int, problems: dict[str, list] | None = None) -> Manifest:
        """The manifest of ``rank`` (the directory's rank wins over the file's). ``problems`` collects, by
        key, the values that were present but unusable, for the loader's notes."""
        problems = problems if problems is not None else {}
        numbers = {name: positive_number(raw.get(name)) for name in POSITIVE_FIELDS}
        for name, value in numbers.items():
            if raw.get(name) is not None and value is None:
                problems.setdefault(name, []).append(raw.get(name))
        world_size = positive_int(raw.get("world_size"))
        if world_size is not None and world_size > MAX_RANK:
            world_size = None
        if raw.get("world_size") is not None and world_size is None:
            problems.setdefault("world_size", []).append(raw.get("world_size"))
        groups = raw.get("process_groups")
        return cls(
            rank=rank,
            schema_version=whole(raw.get("schema_version")),
            run_id=text(raw.get("run_id")),
            local_rank=as_rank(raw.get("local_rank")),
            world_size=world_size,
            local_world_size=positive_int(raw.get("local_world_size")),
            host=text(raw.get("host")),
            pid=positive_int(raw.get("pid")),
            launcher=text(raw.get("launcher")),
            job=mapping(raw.get("job")),
            backend=text(raw.get("backend")),
            device=text(raw.get("device")),
            device_name=text(raw.get("device_name")),
            gpu_index=as_rank(raw.get("gpu_index")),
            gpu_uuid=text(raw.get("gpu_uuid")),
            torch_version=text(raw.get("torch_version")),
            cuda_version=text(raw.get("cuda_version")),
            nccl_version=text(raw.get("nccl_version")),
            python_version=text(raw.get("python_version")),
            parallel=ParallelLayout.from_json(raw["parallel"]) if isinstance(raw.get("parallel"), dict) else None,
            flops_per_step=numbers["flops_per_step"],
            flops_source=text(raw.get("flops_source")),
            peak_tflops=numbers["peak_tflops"],
            dtype=text(raw.get("dtype")),
            clock_offset_us=finite(raw.get("clock_offset_us")),
            clock_sync_error_us=finite(raw.get("clock_sync_error_us")),
            start_time_us=whole(raw.get("start_time_us")),
            process_groups={
                str(name): ProcessGroupInfo.from_json(str(name), spec)
                for name, spec in (groups.items() if isinstance(groups, dict) else ())
                if isinstance(spec, dict)
            },
            device_mesh=mapping(raw.get("device_mesh")),
            capture={str(k): str(v) for k, v in (mapping(raw.get("capture")) or {}).items()},
            pipeline=PipelineLayout.from_json(raw["pipeline"]) if isinstance(raw.get("pipeline"), dict) else None,
            replica_group=text(raw.get("replica_group")),
            memory_model=MemoryModel.from_json(raw["memory_model"])
            if isinstance(raw.get("memory_model"), dict)
            else None,
            model_shape=ModelShape.from_json(raw["model_shape"]) if isinstance(raw.get("model_shape"), dict) else None,
            finished=raw.get("finished") is True,
            end_time_us=whole(raw.get("end_time_us")),
            capture_stopped=CaptureStopped.from_json(raw.get("capture_stopped")),
            hang_settings=_hang_settings(raw.get("hang_settings")),
            source=text(raw.get("source")),
            trace_id=text(raw.get("trace_id")),
        )

    def to_json(self) -> dict:
        """The manifest as JSON again (the analysis cache stores it so)."""
        out = dataclasses.asdict(self)
        out["process_groups"] = {
            name: {k: list(v) if k == "ranks" else v for k, v in group.items() if k != "name"}
            for name, group in out["process_groups"].items()
        }
        return out


def _hang_settings(raw) -> dict[str, str]:
    """The known variables only, as short strings: the manifest is user-writable."""
    from diag.readiness import HANG_SETTINGS

    values = mapping(raw) or {}
    return {name: str(values[name])[:MAX_SETTING_CHARS] for name in HANG_SETTINGS if isinstance(values.get(name), str)}


MAX_SETTING_CHARS = 500


def parse_manifests(records: Iterable[dict], notes: list[str]) -> dict[int, Manifest]:
    """Each rank's manifest (records carry the directory's ``rank``), by rank; ``notes`` gets one line per kind
    of odd value, naming a few of them."""
    problems: dict[str, list] = {}
    manifests = {}
    for record in records:
        rank = as_rank(record.get("rank"))
        if rank is not None:
            manifests[rank] = Manifest.from_json(record, rank, problems)
    for name in POSITIVE_FIELDS:
        if name in problems:
            notes.append(f"manifest {name} {_few(problems[name])} is not a positive number: ignored")
    if "world_size" in problems:
        notes.append(f"implausible world_size in manifests ({_few(problems['world_size'], str)}): ignored")
    newer = {r: m.schema_version for r, m in manifests.items() if (m.schema_version or 0) > SCHEMA_VERSION}
    if newer:
        notes.append(
            f"ranks {sorted(newer)[:10]} wrote manifest schema_version {max(newer.values())}, newer than "
            f"this diag ({SCHEMA_VERSION}): read as version {SCHEMA_VERSION}, fields it does not know are ignored"
        )
    return dict(sorted(manifests.items()))


def first_of(manifests: dict[int, Manifest], name: str):
    """The lowest rank's value of a field that every rank of a run shares (launcher, job, device name)."""
    for manifest in manifests.values():
        value = getattr(manifest, name)
        if value is not None and value != "":
            return value
    return None


def _few(values: list, show=None) -> str:
    def short(value) -> str:  # 0.0 (a column with gaps is float) as 0, and never more than 30 characters
        if isinstance(value, float) and value.is_integer():
            return str(int(value))
        return str(value)[:30]

    return ", ".join(sorted({(show or short)(v) for v in values})[:5])
