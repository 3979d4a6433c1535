"""The options of ``diag.init``: one frozen dataclass that is their signature, documentation and validation.

``CaptureConfig(...)`` checks every value at once (one ``ValueError`` naming each plainly wrong one: a wrong
argument is the caller's bug and is said at init, before training starts; capture never raises into the training
loop after that). ``CaptureConfig.from_environment(**options)`` also reads ``DIAG_<OPTION>`` variables, so that a
launcher can set options for every rank without touching the script; the options given in the script win.
docs/capture-options.md is generated from this module: ``python -m diag.capture.options_doc > docs/capture-options.md``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from diag.capture.calibration import DEFAULT_CALIBRATE_EVERY, calibrate_every_problem
from diag.capture.memory_deep import MAX_DEEP_STEPS, deep_steps_problem
from diag.trace.writer import DEFAULT_TRACE_FORMAT, TRACE_FORMATS

if TYPE_CHECKING:
    import torch

ENV_PREFIX = "DIAG_"
DDP_BUCKET_MODES = ("auto", "hook", "flight_recorder", True, False)
# Below this, a background thread (writer, sampler) wakes so often that it takes the GIL from training:
# flush_interval_s=0 made a job 230x slower. 10 ms is already 100 flushes a second.
MIN_INTERVAL_S = 0.01
# Replica fingerprints: every this many steps, each data-parallel replica sums its parameters (one pass over
# them on the device, read back without waiting); see docs/health.md for its measured cost
DEFAULT_FINGERPRINT_EVERY = 100

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


# -- reading one environment variable: text -> value, or ValueError saying what was expected ---------------------
def _parse_bool(text: str) -> bool:
    if text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    raise ValueError(f"expected one of {_TRUE + _FALSE}")


def _parse_int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError("expected a whole number") from None


def _parse_float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError("expected a number") from None


def _parse_str(text: str) -> str:
    return text


def _parse_json(text: str):
    try:
        return json.loads(text)
    except ValueError:
        raise ValueError('expected JSON, e.g. {"dp": 8, "tp": 4}') from None


def _parse_bool_or_str(text: str) -> bool | str:
    return _parse_bool(text) if text.lower() in _TRUE + _FALSE else text


def _parse_steps(text: str) -> tuple[int, int]:
    """``START,COUNT``, or ``START`` for one step."""
    try:
        parts = [int(p) for p in text.split(",")]
    except ValueError:
        raise ValueError("expected START,COUNT, e.g. 100,3") from None
    if len(parts) > 2:
        raise ValueError("expected START,COUNT, e.g. 100,3")
    return (parts[0], parts[1] if len(parts) > 1 else 1)


def _optional(parse: Callable[[str], object]) -> Callable[[str], object]:
    def parse_optional(text: str):
        return None if text.lower() == "none" else parse(text)

    parse_optional.__doc__ = parse.__doc__
    return parse_optional


def _option(default, doc: str, parse: Callable[[str], object] | None, env_form: str):
    """A field with its documentation, how its ``DIAG_`` variable is read (None: not from the environment) and
    what that variable looks like (for the docs)."""
    return field(default=default, metadata={"doc": doc, "parse": parse, "env_form": env_form})


@dataclass(frozen=True)
class CaptureConfig:
    """The options of ``diag.init`` (and of the Lightning and Hugging Face callbacks and ``diag.Trainer``)."""

    flops_per_step: float | None = _option(
        None, "Model FLOPs of one step on this rank, for MFU.", _optional(_parse_float), "number or none"
    )
    peak_tflops: float | None = _option(
        None, "The device's peak TFLOP/s for `dtype`, for MFU.", _optional(_parse_float), "number or none"
    )
    dtype: str | None = _option(
        None, "The training compute dtype, e.g. `'bf16'`.", _optional(_parse_str), "text or none"
    )
    parallel: dict | None = _option(
        None,
        "The parallel layout, e.g. `{'dp': 8, 'tp': 4, 'pp': 2}`.",
        _optional(_parse_json),
        'JSON, e.g. `{"dp": 8, "tp": 4}`',
    )
    telemetry: bool = _option(True, "Sample the GPU through NVML (off without a CUDA device).", _parse_bool, "bool")
    telemetry_interval_s: float = _option(1.0, "Seconds between NVML samples.", _parse_float, "number")
    collectives: bool = _option(True, "Record the collectives (torch.distributed calls).", _parse_bool, "bool")
    memory: bool = _option(True, "Record the device memory of each step.", _parse_bool, "bool")
    clock_sync: bool = _option(
        True,
        "Measure the ranks' clock offsets at init, through the rendezvous store: every rank must call `diag.init`.",
        _parse_bool,
        "bool",
    )
    watchdog: bool = _option(
        True, "Hang dumps and heartbeats, for `diag triage` (docs/triage.md).", _parse_bool, "bool"
    )
    hang_threshold_s: float = _option(
        120.0, "Seconds without progress in a step before the watchdog dumps the hang.", _parse_float, "number"
    )
    heartbeat_interval_s: float = _option(5.0, "Seconds between heartbeats.", _parse_float, "number")
    flush_interval_s: float = _option(
        0.5, "How often records reach the disk: the most a SIGKILL loses.", _parse_float, "number"
    )
    count_flops: bool = _option(
        False,
        "When `flops_per_step` is not given, count the model FLOPs of step 1 (the second step) with "
        "`torch.utils.flop_counter.FlopCounterMode` (that one step runs slower).",
        _parse_bool,
        "bool",
    )
    ddp_buckets: bool | str = _option(
        "auto",
        "How DDP's gradient all-reduces are recorded: `'hook'` times each through a DDP communication hook (DDP's "
        "Python hook path costs a few percent of a step where the CPU computes, docs/benchmarks.md); "
        "`'flight_recorder'` keeps DDP's built-in path and reads the buckets from Flight Recorder (issue time, "
        "size, no duration), the step's exposed communication timed from its last gradient; `'auto'`: `'hook'` "
        "on NCCL, where the host runs ahead of the GPU, `'flight_recorder'` elsewhere; `True`: `'hook'`; "
        "`False`: not recorded.",
        _parse_bool_or_str,
        "auto, hook, flight_recorder or a bool",
    )
    fingerprint_every: int = _option(
        DEFAULT_FINGERPRINT_EVERY,
        "Every this many steps, the instrumented DDP model's parameters are summed on each replica (in the steps "
        "table, compared across replicas by the analysis, docs/health.md); 0: off.",
        _parse_int,
        "whole number",
    )
    prometheus_port: int | None = _option(
        None,
        "Serve live Prometheus metrics on `http://ADDR:PORT+local_rank/metrics` (docs/prometheus.md), updated "
        "from the rows as the writer flushes them, off the training thread; None: off.",
        _optional(_parse_int),
        "port or none",
    )
    prometheus_addr: str = _option("0.0.0.0", "The address the Prometheus endpoint listens on.", _parse_str, "text")
    tensorboard: str | os.PathLike | None = _option(
        None,
        "A log directory for diag's per-step series as TensorBoard scalars (rank 0 only unless "
        "`loggers_on_every_rank`, docs/health.md).",
        _optional(_parse_str),
        "directory or none",
    )
    wandb: bool | object = _option(
        False,
        "`True` (the active W&B run) or a run object: log diag's per-step series there against `diag/step` "
        "(rank 0 only unless `loggers_on_every_rank`).",
        _parse_bool,
        "bool",
    )
    loggers_on_every_rank: bool = _option(
        False, "TensorBoard and W&B logging from every rank, not rank 0 only.", _parse_bool, "bool"
    )
    nccl_log: bool = _option(
        True,
        "Have NCCL write its log (`NCCL_DEBUG=INFO`, init and topology only) into the rank's directory when the "
        "user set none of `NCCL_DEBUG`, `NCCL_DEBUG_SUBSYS`, `NCCL_DEBUG_FILE` and NCCL has not started yet.",
        _parse_bool,
        "bool",
    )
    nvtx: bool = _option(
        False,
        "diag's steps and phases as NVTX ranges, for Nsight Systems timelines (docs/health.md); needs a CUDA "
        "build of torch, else off with one warning.",
        _parse_bool,
        "bool",
    )
    model_shape: dict | None = _option(
        None,
        "The transformer's `{micro_batch, seq_len, hidden, layers, heads, vocab, recompute, flash_attention, "
        "dropout, sequence_parallel}`, for the activation memory the report predicts (docs/memory.md).",
        _optional(_parse_json),
        'JSON, e.g. `{"hidden": 4096, "layers": 32}`',
    )
    memory_deep_steps: tuple[int, int] | None = _option(
        None,
        f"`(first step, count)`, count 1-{MAX_DEEP_STEPS}: for those few steps record what is behind the step's "
        "memory peak, by module and (CUDA) by allocation stack, into `memory_deep.json` (docs/memory.md; each "
        "such step runs several times slower). None: off, at no cost.",
        _optional(_parse_steps),
        "START,COUNT (or START: one step)",
    )
    device: str | torch.device | None = _option(
        None,
        "The rank's device (a `torch.device` or a string such as `'cuda:1'`); None: the current CUDA device, "
        "else the CPU.",
        _optional(_parse_str),
        "device or none",
    )
    trace_format: int = _option(
        DEFAULT_TRACE_FORMAT,
        "2: the tables as Arrow stream segments compacted into Parquet (schema version 2, ~9x smaller than CSV); "
        "1: the CSV tables of schema version 1 (docs/trace-format.md).",
        _parse_int,
        "1 or 2",
    )
    calibrate_every: int = _option(
        DEFAULT_CALIBRATE_EVERY,
        "Time a small fixed workload on the rank's device at init, every this many steps (between steps, outside "
        "their timing) and at finish, so that `diag compare` and `diag analyze` can tell a slower machine from a "
        "slower job (docs/compare.md); 0: off.",
        _parse_int,
        "whole number",
    )

    def __post_init__(self):
        problems = option_problems(_values(self))
        if problems:
            raise ValueError("diag.init: " + "; ".join(problems.values()))

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ, **overrides) -> CaptureConfig:
        """The options given, and for each option not given its ``DIAG_<OPTION>`` variable when set and not
        empty (``DIAG_HANG_THRESHOLD_S=60``, ``DIAG_TELEMETRY=0``). A malformed variable is a ``ValueError``
        naming it; an unknown option a ``TypeError`` naming it."""
        check_option_names(overrides)
        _warn_near_misses(environ)
        values, texts, problems = dict(overrides), {}, []
        for option in fields():
            variable = env_variable(option.name)
            text = environ.get(variable, "").strip()
            if option.name in overrides or not text:
                continue
            try:
                values[option.name] = option.metadata["parse"](text)
                texts[option.name] = text
            except ValueError as exc:
                problems.append(f"{variable}={text!r}: {exc}")
        wrong = option_problems({**_values(cls()), **values}) if not problems else {}
        for name, message in wrong.items():
            if name in texts:
                problems.append(f"{env_variable(name)}={texts[name]!r}: {message}")
        if problems:
            raise ValueError("diag.init: " + "; ".join(problems))
        return cls(**values)  # a wrong value given in the script: the dataclass's own error


def fields() -> tuple[dataclasses.Field, ...]:
    return dataclasses.fields(CaptureConfig)


def env_variable(name: str) -> str:
    return ENV_PREFIX + name.upper()


def check_option_names(options: Mapping) -> None:
    """A misspelt option is the caller's bug: a ``TypeError`` naming it, at once, before training starts."""
    unknown = set(options) - {option.name for option in fields()}
    if unknown:
        raise TypeError(f"diag.init got unknown options {sorted(unknown)}")


def _warn_near_misses(environ: Mapping[str, str]) -> None:
    """One warning for a ``DIAG_`` variable that is not an option's but nearly one's name (``DIAG_HANG_THRESHOLD``
    for ``DIAG_HANG_THRESHOLD_S``, any case): the launcher meant the option, which would silently keep its
    default. diag's other variables (``DIAG_RUN_ID``, ...) are no option's prefix and are left alone."""
    from diag._warn import warn_once

    known = {env_variable(option.name) for option in fields()}
    for name in environ:
        upper = name.upper()
        if name in known or not upper.startswith(ENV_PREFIX):
            continue
        meant = (
            [upper]
            if upper in known
            else sorted(k for k in known if k.startswith(upper + "_") or upper.startswith(k + "_"))
        )
        if meant:
            warn_once(
                f"config-env-{name}", f"{name} is not an option's variable (meant {' or '.join(meant)}?): ignored"
            )


def _values(config: CaptureConfig) -> dict:
    """The fields as given (``dataclasses.asdict`` would deep-copy a W&B run object)."""
    return {option.name: getattr(config, option.name) for option in fields()}


# -- validation -------------------------------------------------------------------------------------------------
_FLAGS = (
    "telemetry",
    "collectives",
    "memory",
    "clock_sync",
    "watchdog",
    "count_flops",
    "loggers_on_every_rank",
    "nccl_log",
    "nvtx",
)
_SECONDS = ("telemetry_interval_s", "heartbeat_interval_s", "flush_interval_s", "hang_threshold_s")


def option_problems(values: Mapping) -> dict[str, str]:
    """Option name -> why its value is plainly wrong, for every such option in ``values`` (all of them)."""
    problems: dict[str, str] = {}
    for name in _FLAGS:
        if not isinstance(values[name], bool):
            problems[name] = f"{name} must be True or False, not {values[name]!r}"
    for name in _SECONDS:
        if not _is_number_at_least(values[name], MIN_INTERVAL_S):
            problems[name] = f"{name} must be a number of seconds >= {MIN_INTERVAL_S}, not {values[name]!r}"
    for name in ("flops_per_step", "peak_tflops"):
        value = values[name]
        if value is not None and not (_is_number_at_least(value, 0.0) and value > 0):
            problems[name] = f"{name} must be a positive number or None, not {value!r}"
    if values["dtype"] is not None and not isinstance(values["dtype"], str):
        problems["dtype"] = f"dtype must be a string such as 'bf16' or None, not {values['dtype']!r}"
    if not _is_parallel_layout(values["parallel"]):
        problems["parallel"] = (
            f"parallel must map dimension names to positive sizes, e.g. {{'dp': 8, 'tp': 4}}, not {values['parallel']!r}"
        )
    board = values["tensorboard"]
    if board is not None and not isinstance(board, str | os.PathLike):
        problems["tensorboard"] = f"tensorboard must be a log directory or None, not {board!r}"
    run = values["wandb"]
    if not (isinstance(run, bool) or hasattr(run, "log")):
        problems["wandb"] = f"wandb must be True (the active run), False or a W&B run object, not {run!r}"
    if values["trace_format"] not in TRACE_FORMATS or isinstance(values["trace_format"], bool):
        problems["trace_format"] = f"trace_format must be one of {TRACE_FORMATS}, not {values['trace_format']!r}"
    calibrate_problem = calibrate_every_problem(values["calibrate_every"])
    if calibrate_problem:
        problems["calibrate_every"] = calibrate_problem
    every = values["fingerprint_every"]
    if isinstance(every, bool) or not isinstance(every, int) or every < 0:
        problems["fingerprint_every"] = (
            f"fingerprint_every must be a whole number of steps >= 0 (0: off), not {every!r}"
        )
    buckets = values["ddp_buckets"]
    if not any(buckets == mode and type(buckets) is type(mode) for mode in DDP_BUCKET_MODES):
        problems["ddp_buckets"] = f"ddp_buckets must be one of {DDP_BUCKET_MODES}, not {buckets!r}"
    port = values["prometheus_port"]
    if port is not None and not (isinstance(port, int) and not isinstance(port, bool) and 0 <= port <= 65535):
        problems["prometheus_port"] = f"prometheus_port must be a port number 0-65535 or None, not {port!r}"
    if not isinstance(values["prometheus_addr"], str):
        problems["prometheus_addr"] = f"prometheus_addr must be an address string, not {values['prometheus_addr']!r}"
    shape_problems = _model_shape_problems(values["model_shape"])
    if shape_problems:
        problems["model_shape"] = "; ".join(shape_problems)
    deep_problem = deep_steps_problem(values["memory_deep_steps"])
    if deep_problem:
        problems["memory_deep_steps"] = deep_problem
    return problems


def _is_parallel_layout(parallel) -> bool:
    if parallel is None:
        return True
    return isinstance(parallel, dict) and all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v > 0 for k, v in parallel.items()
    )


def _model_shape_problems(shape) -> list[str]:
    from diag.trace.manifest import MODEL_SHAPE_FLAGS, MODEL_SHAPE_SIZES

    if shape is None:
        return []
    if not isinstance(shape, dict):
        return [f"model_shape must be a dict such as {{'hidden': 4096, 'layers': 32}}, not {shape!r}"]
    unknown = set(map(str, shape)) - {*MODEL_SHAPE_SIZES, *MODEL_SHAPE_FLAGS, "recompute"}
    problems = [f"model_shape has unknown keys {sorted(unknown)}"] if unknown else []
    for key in MODEL_SHAPE_SIZES:
        value = shape.get(key)
        if value is not None and not (isinstance(value, int) and not isinstance(value, bool) and value > 0):
            problems.append(f"model_shape[{key!r}] must be a positive integer, not {value!r}")
    for key in MODEL_SHAPE_FLAGS:
        if shape.get(key) is not None and not isinstance(shape[key], bool):
            problems.append(f"model_shape[{key!r}] must be True or False, not {shape[key]!r}")
    if shape.get("recompute") not in (None, "none", "selective", "full"):
        problems.append(f"model_shape['recompute'] must be none, selective or full, not {shape['recompute']!r}")
    return problems


def _is_number_at_least(value, minimum: float) -> bool:
    """A real, finite number (not a bool) no smaller than ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return math.isfinite(value) and value >= minimum


# -- documentation ----------------------------------------------------------------------------------------------
def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def options_text() -> str:
    """The options as plain text, for ``help(diag.init)``."""
    lines = []
    for option in fields():
        lines.append(f"{option.name}: {option.type} = {option.default!r} (${env_variable(option.name)})")
        lines.append(f"    {option.metadata['doc']}")
    return "\n".join(lines)


def render_markdown() -> str:
    """docs/capture-options.md."""
    rows = "\n".join(
        f"| `{option.name}` | `{_cell(str(option.type))}` | `{option.default!r}` | `{env_variable(option.name)}`: "
        f"{_cell(option.metadata['env_form'])} | {_cell(option.metadata['doc'])} |"
        for option in fields()
    )
    return f"""# Options of diag.init

<!-- generated from diag/capture/config.py: python -m diag.capture.options_doc > docs/capture-options.md -->

`diag.init(trace_dir, **options)` takes the options below, as do the framework callbacks
(`DiagCallback(trace_dir, **options)`, `DiagTrainerCallback(trace_dir, **options)`, [integrations.md](integrations.md)) and
`diag.Trainer(session_options=...)`. They are the fields of `diag.capture.config.CaptureConfig`, a frozen dataclass:
`diag.init(trace_dir, config=CaptureConfig(...))` takes one built beforehand (options given beside it replace its
fields; the environment is not read then).

A misspelt option is a `TypeError` and a plainly wrong value a `ValueError` naming every such option, both raised
by `diag.init` before anything starts; any later failure of capture is one warning and the job runs without it.

| option | type | default | environment variable | meaning |
|---|---|---|---|---|
{rows}

## Environment variables

Every option can also be set as `DIAG_<OPTION>` in each rank's environment, so that a launcher (a job script,
a Slurm or Kubernetes spec) can turn capture's options without touching the training script:

```bash
DIAG_HANG_THRESHOLD_S=60 DIAG_TELEMETRY=0 DIAG_MEMORY_DEEP_STEPS=100,3 torchrun --nproc-per-node 8 train.py
```

- An option given to `diag.init` in the script wins over its variable; an empty variable counts as unset.
- Flags take `1`, `true`, `yes`, `on` or `0`, `false`, `no`, `off` (any case); `none` sets an option that may be
  None to None; `parallel` and `model_shape` are JSON.
- A malformed variable (`DIAG_TELEMETRY=maybe`, `DIAG_HANG_THRESHOLD_S=0`) is a `ValueError` from `diag.init`
  naming the variable, on every rank, before training starts.
- A variable that is nearly an option's (`DIAG_HANG_THRESHOLD` for `DIAG_HANG_THRESHOLD_S`, `diag_telemetry` for
  `DIAG_TELEMETRY`) is one warning naming the option it missed, and is ignored.
- `wandb` from the environment is `1` (the active W&B run) or `0`; a run object can only be given in the script.
- `CaptureConfig.from_environment(environ=os.environ, **options)` is what `diag.init` calls: the same rules, for a
  launcher or a test of your own.
"""
