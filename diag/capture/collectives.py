"""Records every collective and point-to-point operation a rank issues.

Three sources together cover what a training job issues:
* wrappers of the ``torch.distributed`` functions (explicit calls, FSDP2's all-gathers and reduce-scatters,
  send/recv), installed once per process and recording only while a session is active;
* for DDP's gradient buckets, which the C++ reducer issues unseen, either a DDP communication hook that times
  each bucket (``ddp_buckets="hook"``), or, cheaper, DDP's built-in path with the buckets read from Flight
  Recorder and the step's exposed communication timed from its last gradient (``"flight_recorder"``);
* Flight Recorder (``flight_recorder.py``) for whatever else torch issues from C++.

Each record carries the c10d sequence number of its group (the number Flight Recorder and NCCL's watchdog
report), so records line up across ranks and with Flight Recorder dumps. Durations are issue to
completion as the host sees it: exact for gloo. On NCCL the host sees only the launch: with
TORCH_NCCL_ENABLE_TIMING=1 a row waits for the CUDA-event duration ProcessGroupNCCL's completion hook reports
(``DeviceDurationJoin``); without it, rows carry host times.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import itertools
import logging
import os
import threading
import time
from dataclasses import dataclass

from diag._warn import warn_once
from diag.capture import torch_private
from diag.capture.components import Component
from diag.capture.flight_recorder import FlightRecorderFollower
from diag.trace.schema import COLLECTIVES

log = logging.getLogger("diag")

# op name -> (name of the parameter holding what this rank sends, reported op name)
_OPS: dict[str, tuple[str, str]] = {
    "all_reduce": ("tensor", "all_reduce"),
    "all_reduce_coalesced": ("tensors", "all_reduce_coalesced"),
    "broadcast": ("tensor", "broadcast"),
    "reduce": ("tensor", "reduce"),
    "all_gather": ("tensor", "all_gather"),
    "all_gather_coalesced": ("input_tensor_list", "all_gather_coalesced"),
    "all_gather_into_tensor": ("input_tensor", "all_gather"),
    "all_gather_single": ("input_tensor", "all_gather"),
    "reduce_scatter": ("input_list", "reduce_scatter"),
    "reduce_scatter_tensor": ("input", "reduce_scatter"),
    "reduce_scatter_single": ("input", "reduce_scatter"),
    "all_to_all": ("input_tensor_list", "all_to_all"),
    "all_to_all_single": ("input", "all_to_all"),
    "gather": ("tensor", "gather"),
    "scatter": ("tensor", "scatter"),
    "barrier": ("", "barrier"),
    "send": ("tensor", "send"),
    "recv": ("tensor", "recv"),
    "isend": ("tensor", "send"),
    "irecv": ("tensor", "recv"),
}
_PEER_PARAMS = ("dst", "src")  # for send/recv only
_P2P = {"send", "recv", "isend", "irecv"}


@dataclass(slots=True)
class PendingCollective:
    step: int
    pg: str
    seq: int
    op: str
    bytes: int
    dtype: str
    peer: int | None
    start_us: int
    start_ns: int  # perf_counter_ns, for the duration
    blocking: bool
    source: str
    c10d_seq_before: int  # the group's c10d counter before the call: tells whether a failed call was issued

    def as_dict(self) -> dict:
        return {
            k: getattr(self, k) for k in ("pg", "seq", "op", "bytes", "dtype", "peer", "start_us", "step", "source")
        }

    def mark(self) -> dict:
        """What the heartbeat's ``groups`` says of it (diag.trace.records.CollectiveMark)."""
        return {k: getattr(self, k) for k in ("seq", "op", "bytes", "dtype", "step", "start_us")}


class CollectiveRecorder(Component):
    """Turns issued collectives into ``collectives`` rows and keeps those still pending (for hang dumps)."""

    def __init__(self, session):
        self.session = session
        self._pending: dict[int, PendingCollective] = {}
        self._ids = itertools.count()
        # id(group) -> (group, trace name): the group is held so that its id is never another group's
        self._groups: dict[int, tuple[object, str]] = {}
        self._p2p_counts: dict[str, int] = {}  # point-to-point ops seen per group
        self._counts_p2p_in_seq: dict[str, bool] = {}  # does the group's c10d counter include p2p ops?
        self.seen_seqs: dict[str, set[int]] = {}  # recent collective seqs per group, to fill gaps at finish
        # per group, the last collective handed to it and the last seen complete: the heartbeat's ``groups``,
        # from which diag triage judges a rank without reading its tables (one dict store per collective)
        self.last_issued: dict[str, PendingCollective] = {}
        self.last_completed: dict[str, PendingCollective] = {}
        self.device_times = DeviceDurationJoin(self._write)
        self.flight_recorder = FlightRecorderFollower(
            self, session.step_spans, session.open_step, max(1.0, session.writer.flush_interval_s)
        )
        self._device_timed: set[str] = set()  # NCCL groups whose durations come from the completion hook
        # per step: latest issue and latest completion of asynchronous ops, for their exposed wait
        self._async_last_issue_ns = 0
        self._async_last_end_ns = 0

    # -- issuing ----------------------------------------------------------------------------------------
    def begin(self, op: str, group, tensors, peer, blocking: bool, source: str) -> int:
        nbytes, dtype = _size_of(tensors)
        pg_name = self.group_name(group)
        c10d_seq = _sequence_number(group)
        entry = PendingCollective(
            step=self.session.current_step_or_none(),
            pg=pg_name,
            seq=self._expected_sequence_number(pg_name, op, c10d_seq),  # known while a blocking call hangs
            op=op,
            bytes=nbytes,
            dtype=dtype,
            peer=peer,
            start_us=time.time_ns() // 1000,
            start_ns=time.perf_counter_ns(),
            blocking=blocking,
            source=source,
            c10d_seq_before=c10d_seq,
        )
        token = next(self._ids)
        self._pending[token] = entry
        return token

    def issued(self, token: int, group) -> None:
        """The op was handed to the process group: its sequence number is now known."""
        entry = self._pending.get(token)
        if entry is not None:
            entry.seq = self._sequence_number(entry, group)
            if entry.peer is None:
                self.last_issued[entry.pg] = entry
            if not entry.blocking:
                self._async_last_issue_ns = max(self._async_last_issue_ns, entry.start_ns)

    def completed(self, token: int) -> None:
        end_ns = time.perf_counter_ns()
        entry = self._pending.pop(token, None)
        if entry is None:
            return
        duration_us = (end_ns - entry.start_ns) / 1000
        if entry.peer is None:
            last = self.last_completed.get(entry.pg)
            if last is None or entry.seq > last.seq:  # futures may complete out of order
                self.last_completed[entry.pg] = entry
        if entry.blocking:
            self.session.add_comm_wait(duration_us)
        else:
            self._async_last_end_ns = max(self._async_last_end_ns, end_ns)
        if entry.pg in self._device_timed and entry.op not in ("send", "recv"):
            self.device_times.host_done((entry.pg, entry.seq), entry, duration_us)
        else:
            self._write(entry, duration_us)

    def failed(self, token: int, group, error: BaseException | None = None) -> None:
        """The call raised (a timeout, a closed peer, bad arguments). If the group's counter moved it was issued:
        keep it, with no duration, so the trace shows what the rank was doing, and record the error with its time
        (a ``collective_error`` event): when the others timed out tells who had not arrived. Otherwise forget it."""
        entry = self._pending.get(token)
        if entry is not None and _sequence_number(group) > entry.c10d_seq_before >= 0:
            self.issued(token, group)
            self.completed_untimed(token)
            if error is not None:
                self._record_error(entry, error)
        else:
            self.abandon(token)

    def _record_error(self, entry: PendingCollective, error: BaseException) -> None:
        writer = self.session.writer
        writer.event(
            "collective_error",
            rank=self.session.rank,
            step=entry.step,
            op=entry.op,
            pg=entry.pg,
            seq=entry.seq,
            peer=entry.peer,
            start_us=entry.start_us,
            error=f"{type(error).__name__}: {error}"[:2000],
        )
        writer.flush()  # rare, and the process often ends next: the record must reach the disk

    def completed_untimed(self, token: int) -> None:
        """Issued, but its completion cannot be observed: write it with an empty duration."""
        entry = self._pending.pop(token, None)
        if entry is not None:
            self._write(entry, None)

    def abandon(self, token: int) -> None:
        """The call raised before anything was issued: forget it."""
        self._pending.pop(token, None)

    def exposed_async_wait_us(self) -> float:
        """Time from the last asynchronous issue to the last completion this step: the part of
        DDP/FSDP communication that compute did not hide. Resets for the next step."""
        wait_ns = max(0, self._async_last_end_ns - self._async_last_issue_ns) if self._async_last_issue_ns else 0
        self._async_last_issue_ns = self._async_last_end_ns = 0
        return wait_ns / 1000

    def pending(self) -> list[dict]:
        return [e.as_dict() for e in list(self._pending.values())]

    def group_progress(self) -> dict[str, dict]:
        """Per group, the last collective issued and the last completed, for the heartbeat (any thread)."""
        marks = {}
        for key, table in (("issued", self.last_issued), ("completed", self.last_completed)):
            for pg, entry in list(table.items()):
                marks.setdefault(pg, {})[key] = entry.mark()
        return marks

    def unsequenced_since_ns(self) -> int | None:
        """Wall-clock start (ns) of the oldest blocking collective still in progress: it is marked seen only when
        it returns, so Flight Recorder entries from then on may be one it will record itself."""
        starts = [e.start_us for e in list(self._pending.values()) if e.blocking]
        return min(starts) * 1000 if starts else None

    def flush_pending(self) -> None:
        """At finish: ops that never completed are written with an empty duration."""
        self.device_times.drain()
        for token in list(self._pending):
            entry = self._pending.pop(token, None)
            if entry is not None:
                self._write(entry, None)

    def stop(self) -> None:
        if active_recorder() is self:
            activate(None)
        self.flush_pending()
        if default_backend() is not None:
            self.flight_recorder.stop()

    def _write(self, entry: PendingCollective, duration_us: float | None) -> None:
        self.session.writer.append(
            "collectives",
            COLLECTIVES.row(
                step=entry.step,
                pg=entry.pg,
                seq=entry.seq,
                op=entry.op,
                bytes=entry.bytes,
                dtype=entry.dtype,
                peer=entry.peer,
                start_us=entry.start_us,
                duration_us=None if duration_us is None else round(duration_us, 1),
                blocking=int(entry.blocking),
                source=entry.source,
            ),
        )

    def _names_a_destroyed_group(self, group) -> bool:
        """A group object not seen before whose trace name an earlier group object had, which torch no longer
        knows: torch names groups afresh after ``destroy_process_group()``."""
        try:
            name = self.session.trace_group_name(group.group_name)
            earlier = [known for known, known_name in self._groups.values() if known_name == name]
            live = torch_private.process_group_names() if earlier else {}
        except Exception:  # cannot tell: keep the names as they are
            return False
        return bool(earlier) and all(known not in live for known in earlier)

    def groups_destroyed(self, group) -> None:
        """``destroy_process_group(group)`` returned. ``None`` (every group, the usual way to re-initialise):
        the groups made next are a new generation (``Session.trace_group_name``), whose numbering starts again,
        and Flight Recorder is followed afresh; the old groups' state is dropped (and the objects released)."""
        if group is not None:
            self._groups.pop(id(group), None)
            return
        self.session.pg_generation += 1
        self._groups.clear()
        for state in (self._p2p_counts, self._counts_p2p_in_seq, self.seen_seqs, self.last_issued):
            state.clear()
        self.last_completed.clear()
        self.flight_recorder.restart()
        log.info("diag: process groups destroyed; new groups are recorded as generation %d", self.session.pg_generation)

    def _expected_sequence_number(self, pg_name: str, op: str, c10d_seq: int) -> int:
        """The number the op will get once issued (see ``_sequence_number``)."""
        if op in ("send", "recv"):
            return self._p2p_counts.get(pg_name, 0) + 1
        if c10d_seq < 0:
            return -1
        return c10d_seq + 1 - (self._p2p_counts.get(pg_name, 0) if self._counts_p2p_in_seq.get(pg_name) else 0)

    def _sequence_number(self, entry: PendingCollective, group) -> int:
        """Number ops as Flight Recorder does: collectives by the group's collective counter, point-to-point
        ops by a separate counter. Gloo's c10d counter also counts point-to-point ops, so they are taken out."""
        if entry.op in ("send", "recv"):
            count = self._p2p_counts[entry.pg] = self._p2p_counts.get(entry.pg, 0) + 1
            return count
        seq = _sequence_number(group)
        if seq >= 0 and self._counts_p2p_in_seq.get(entry.pg):
            seq -= self._p2p_counts.get(entry.pg, 0)
        seen = self.seen_seqs.setdefault(entry.pg, set())
        seen.add(seq)
        if len(seen) > 50_000:  # Flight Recorder's buffer is far shorter: forget the oldest
            self.seen_seqs[entry.pg] = {s for s in seen if s > seq - 20_000}
        return seq

    def group_name(self, group) -> str:
        """The trace's name of a process group, registering it in the manifest the first time."""
        known = self._groups.get(id(group))
        if known is not None and known[0] is group:
            return known[1]
        if self._names_a_destroyed_group(group):  # destroy_process_group called where no wrapper saw it
            _safely(self.flight_recorder.read, True)  # what the old groups issued, under their names
            self.groups_destroyed(None)
        name = self.session.register_process_group(group)
        self._groups[id(group)] = (group, name)
        backend = backend_of(group)
        self._counts_p2p_in_seq[name] = backend == "gloo"
        if backend == "nccl" and self.device_times.register(group, name):
            self._device_timed.add(name)
        return name


class DeviceDurationJoin:
    """Device durations of NCCL collectives, from ProcessGroupNCCL's completion hook.

    On NCCL the host sees only the launch; with TORCH_NCCL_ENABLE_TIMING=1 NCCL's watchdog thread reports each
    collective's CUDA-event duration later. A row waits here, keyed by (group, seq), until both halves are
    known, whichever comes first; at finish the rows still waiting are written with their host duration.
    """

    MAX_WAITING = 10_000  # rows or durations kept unmatched at most (C++-issued ops have no row)

    def __init__(self, write):
        self._write = write
        self._rows: dict[tuple, tuple] = {}
        self._durations: dict[tuple, float] = {}
        self._lock = threading.Lock()

    def register(self, group, pg_name: str) -> bool:
        if os.environ.get("TORCH_NCCL_ENABLE_TIMING", "0").lower() not in ("1", "true"):
            return False
        try:
            torch_private.register_on_completion_hook(group, lambda info: self._on_completion(pg_name, info))
            return True
        except Exception as exc:
            warn_once("nccl-completion-hook", f"no NCCL device durations ({exc!r}); collectives carry host times")
            return False

    def _on_completion(self, pg_name: str, info) -> None:
        try:  # runs on NCCL's watchdog thread: it must never raise
            duration = info.active_duration
            seconds = duration.total_seconds() if hasattr(duration, "total_seconds") else float(duration)
            if seconds >= 0:
                self.device_done((pg_name, int(info.seq)), seconds * 1e6)
        except Exception as exc:
            warn_once("nccl-completion", f"could not read an NCCL completion ({exc!r})")

    def host_done(self, key: tuple, entry, host_duration_us: float) -> None:
        with self._lock:
            device_us = self._durations.pop(key, None)
            if device_us is None:
                self._rows[key] = (entry, host_duration_us)
                overflow = self._pop_oldest(self._rows)
        if device_us is not None:
            self._write(entry, device_us)
        elif overflow is not None:
            self._write(*overflow)

    def device_done(self, key: tuple, device_us: float) -> None:
        with self._lock:
            waiting = self._rows.pop(key, None)
            if waiting is None:
                self._durations[key] = device_us
                self._pop_oldest(self._durations)
        if waiting is not None:
            self._write(waiting[0], device_us)

    def drain(self, wait_s: float = 2.0) -> None:
        deadline = time.monotonic() + wait_s
        while self._rows and time.monotonic() < deadline:
            time.sleep(0.01)  # the watchdog thread reports completions a little later
        with self._lock:
            rows, self._rows = list(self._rows.values()), {}
        for entry, host_duration_us in rows:
            self._write(entry, host_duration_us)

    def _pop_oldest(self, table: dict):
        return table.pop(next(iter(table))) if len(table) > self.MAX_WAITING else None


def _size_of(tensors) -> tuple[int, str]:
    if tensors is None:
        return 0, ""
    if isinstance(tensors, (list, tuple)):
        if not tensors:
            return 0, ""
        return sum(t.numel() * t.element_size() for t in tensors), _dtype_name(tensors[0])
    return tensors.numel() * tensors.element_size(), _dtype_name(tensors)


def _dtype_name(tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def start_recorder(session) -> CollectiveRecorder | None:
    if not (session.config.collectives and session.writer.enabled):
        session.capture_status["collectives"] = "off"
        return None
    recorder = CollectiveRecorder(session)
    install_wrappers()
    activate(recorder)
    recorder.flight_recorder.start()  # C++-issued collectives (DDP buckets, DTensor) from the first step
    session.capture_status["collectives"] = "on: torch.distributed calls; C++-issued ones from Flight Recorder"
    return recorder


def default_backend() -> str | None:
    """The default process group's backend, or None before ``init_process_group`` (and after its destruction)."""
    try:
        import torch.distributed as dist

        return str(dist.get_backend()) if dist.is_available() and dist.is_initialized() else None
    except Exception:
        return None


def backend_of(group) -> str:
    try:
        import torch.distributed as dist

        return str(dist.get_backend(group))
    except Exception:
        return ""


def _sequence_number(group) -> int:
    try:
        return torch_private.sequence_number(group)
    except Exception:
        return -1


# -- wrappers of torch.distributed ------------------------------------------------------------------------

_active: CollectiveRecorder | None = None  # the recorder of the active session, or None


def active_recorder() -> CollectiveRecorder | None:
    """The recorder of the active session, or None (the wrappers record only while there is one)."""
    return _active


_local = threading.local()  # depth of wrapped calls, so that nested ones are not counted twice
_installed = False
_install_lock = threading.Lock()


def activate(recorder: CollectiveRecorder | None) -> None:
    global _active
    _active = recorder


def install_wrappers() -> None:
    """Wrap the torch.distributed functions once per process; they record only while a session is active."""
    global _installed
    with _install_lock:
        if _installed:
            return
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        for name in _OPS:
            original = getattr(c10d, name, None)
            if original is None or getattr(original, "__diag_wrapped__", False):
                continue
            wrapper = _make_wrapper(name, original)
            setattr(c10d, name, wrapper)
            if getattr(dist, name, None) is original:
                setattr(dist, name, wrapper)
        _install_destroy_wrapper(c10d, dist)
        _install_functional_wait()
        _installed = True


def _install_destroy_wrapper(c10d, dist) -> None:
    """``destroy_process_group``: Flight Recorder is read once more first (the old groups' C++-issued
    collectives), and the recorder told after (``CollectiveRecorder.groups_destroyed``)."""
    original = getattr(c10d, "destroy_process_group", None)
    if original is None or getattr(original, "__diag_wrapped__", False):
        return

    @functools.wraps(original)
    def destroy_process_group(*args, **kwargs):
        recorder = _active
        if recorder is None:
            return original(*args, **kwargs)
        group = args[0] if args else kwargs.get("group")
        if group is None or group is _safe_default_group():
            group = None
            _safely(recorder.flight_recorder.read, True)
        result = original(*args, **kwargs)
        _safely(recorder.groups_destroyed, group)
        return result

    destroy_process_group.__diag_wrapped__ = True
    c10d.destroy_process_group = destroy_process_group
    if getattr(dist, "destroy_process_group", None) is original:
        dist.destroy_process_group = destroy_process_group


def _safe_default_group():
    try:
        return _default_group()
    except Exception:  # no default group any more
        return None


def _install_functional_wait() -> None:
    """Time the host's waits on functional collectives (DTensor, tensor parallel): issued from C++, they
    reach the trace through Flight Recorder, but their waits happen in ``wait_tensor``, which
    ``AsyncCollectiveTensor`` looks up in its module at each wait. The waited time is the step's exposed
    communication (``comm_wait_us``), as for a blocking ``dist.all_reduce``. Two clock reads per wait."""
    try:
        funcol = torch_private.functional_collectives()
    except Exception:  # a torch without functional collectives
        return
    original = getattr(funcol, "wait_tensor", None)
    if original is None or getattr(original, "__diag_wrapped__", False):
        return
    from torch.compiler import is_compiling

    @functools.wraps(original)
    def wait_tensor(tensor):
        recorder = _active
        if recorder is None or is_compiling():  # traced: no clock read, no graph break
            return original(tensor)
        start_ns = time.perf_counter_ns()
        result = original(tensor)
        _safely(recorder.session.add_comm_wait, (time.perf_counter_ns() - start_ns) / 1000)
        return result

    wait_tensor.__diag_wrapped__ = True
    funcol.wait_tensor = wait_tensor


def _make_wrapper(name: str, original):
    params = list(inspect.signature(original).parameters)
    input_param, op = _OPS[name]
    positions = {p: params.index(p) for p in (input_param, "group", "async_op", *_PEER_PARAMS) if p in params}
    is_p2p = name in _P2P
    always_async = name in ("isend", "irecv")
    from torch.compiler import is_compiling

    def argument(args, kwargs, param, default=None):
        if param in kwargs:
            return kwargs[param]
        index = positions.get(param)
        return args[index] if index is not None and index < len(args) else default

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        recorder = _active
        # traced by torch.compile: torch's own function, which dynamo turns into a functional collective
        if recorder is None or getattr(_local, "depth", 0) or is_compiling():
            return original(*args, **kwargs)
        token = None
        try:
            group = argument(args, kwargs, "group") or _default_group()
            blocking = not always_async and not argument(args, kwargs, "async_op", False)
            peer = None
            if is_p2p:
                peer = argument(args, kwargs, "dst") if "dst" in positions else argument(args, kwargs, "src")
            tensors = argument(args, kwargs, input_param) if input_param else None
            token = recorder.begin(op, group, tensors, peer, blocking, getattr(_local, "source", "py"))
        except Exception as exc:
            warn_once("collective-record", f"could not record a {name} ({exc!r}); it runs unrecorded")
        _local.depth = getattr(_local, "depth", 0) + 1
        try:
            result = original(*args, **kwargs)
        except BaseException as exc:
            if token is not None:
                _safely(recorder.failed, token, group, exc)
            raise
        finally:
            _local.depth -= 1
        if token is not None:
            _finish(recorder, token, group, result, blocking)
        return result

    wrapper.__diag_wrapped__ = True
    return wrapper


def _finish(recorder: CollectiveRecorder, token: int, group, result, blocking: bool) -> None:
    try:
        recorder.issued(token, group)
        if blocking or result is None:
            recorder.completed(token)
            return
    except Exception as exc:
        recorder.abandon(token)
        warn_once("collective-finish", f"could not record a collective ({exc!r})")
        return
    try:
        future = result.get_future()
    except RuntimeError:  # gloo's isend/irecv works have no future: recorded, with no duration
        recorder.completed_untimed(token)
        return
    future.then(lambda _fut: _safely(recorder.completed, token))


def _safely(function, *args) -> None:
    """Run a recording step from a completion callback, where an exception would fail the user's future."""
    try:
        function(*args)
    except Exception as exc:
        warn_once("collective-callback", f"could not record a collective's completion ({exc!r})")


def _default_group():
    return torch_private.default_group()


# -- DDP gradient buckets -----------------------------------------------------------------------------------


class LastGradientWait:
    """The exposed communication of a DDP backward when no hook times DDP's buckets: from the moment the step's
    last gradient is accumulated (DDP launches its last bucket then) until the backward call returns, which is
    after DDP's end-of-backward callback has waited for every bucket. A rank that waits here for its peers is
    not the slow one. Which parameter's gradient comes last is learnt in the first backward; afterwards one
    hook, on that parameter, is all that runs inside the backward."""

    def __init__(self, ddp_model, add_wait):
        from diag.capture.hooks import compiling, listen_to_backward

        self._compiling = compiling
        self._add_wait = add_wait
        self._last_ns = 0
        self._last_param_id: int | None = None
        params = [p for p in ddp_model.parameters() if p.requires_grad]
        self._handles = {id(p): p.register_post_accumulate_grad_hook(self._on_gradient) for p in params}
        listen_to_backward(self)

    def _on_gradient(self, param) -> None:
        if self._compiling():  # traced by compiled autograd: no clock read, no graph break; this wait goes untimed
            return
        try:
            self._last_ns = time.perf_counter_ns()
            self._last_param_id = id(param)
        except Exception as exc:
            warn_once("ddp-exposed-wait", f"cannot time DDP's exposed communication ({exc!r})")

    def on_backward_start(self, _start_ns: int) -> None:
        pass

    def on_backward_end(self, start_ns: int, end_ns: int) -> None:
        try:
            if self._last_ns < start_ns:  # no gradient of this model in that backward
                return
            self._add_wait((end_ns - self._last_ns) / 1000)
            self._last_ns = 0
            if len(self._handles) > 1 and self._last_param_id in self._handles:
                for key in [k for k in self._handles if k != self._last_param_id]:
                    self._handles.pop(key).remove()
        except Exception as exc:
            warn_once("ddp-exposed-wait", f"cannot time DDP's exposed communication ({exc!r})")

    def remove(self) -> None:
        from diag.capture.hooks import stop_listening_to_backward

        stop_listening_to_backward(self)
        for handle in self._handles.values():
            handle.remove()
        self._handles.clear()


def install_ddp_hook(ddp_model, recorder_getter, on_user_hook=None) -> bool:
    """Register a communication hook on a DDP model that does DDP's own averaging all-reduce and records it.
    Returns False (and DDP keeps its built-in path) if the model already has a hook.

    DDP's built-in path divides each gradient by the world size while copying it into its bucket; with a hook
    the reducer only copies, so dividing in the hook would cost one more pass over every gradient (most of
    the cost of a Python hook on CPU). The hook asks the process group to average instead (``ReduceOp.AVG``,
    which NCCL and gloo on torch 2.13 do as part of the reduction), and divides itself only where the backend
    refuses AVG."""
    import torch.distributed as dist
    from torch.compiler import is_compiling

    group = ddp_model.process_group
    group_size = group.size()
    average = dist.AllreduceOptions()
    average.reduceOp = dist.ReduceOp.AVG
    backend_averages = [True]  # until the backend refuses AVG once

    def all_reduce_average(buffer):
        if backend_averages[0]:
            try:
                return group.allreduce([buffer], average)
            except (RuntimeError, ValueError):  # refused before anything was issued
                backend_averages[0] = False
        buffer.div_(group_size)
        return group.allreduce([buffer])

    user = {}  # the user's own hook once registered: {"hook": ..., "state": ...}

    def hook(_state, bucket):
        if user:
            return _call_user_hook(user["hook"], user["state"], bucket)
        buffer = bucket.buffer()
        recorder = None if is_compiling() else recorder_getter()  # traced: the all-reduce alone, no recording
        token = None
        if recorder is not None:
            try:
                token = recorder.begin("all_reduce", group, buffer, None, False, "ddp")
            except Exception:
                token = None
        work = all_reduce_average(buffer)  # what DDP's reducer calls; skips the Python layer of dist.all_reduce
        if token is not None:
            recorder.issued(token, group)

        def done(fut):
            if token is not None:
                _safely(recorder.completed, token)
            return fut.value()[0]

        return work.get_future().then(done)

    try:
        ddp_model.register_comm_hook(None, hook)
        _take_over_hook_registration(ddp_model, user, on_user_hook)
        return True
    except RuntimeError as exc:
        warn_once(
            "ddp-hook",
            f"DDP already has a communication hook ({exc}); its collectives are recorded as issued, not timed "
            "per bucket (register it after diag.instrument to have diag time around it)",
        )
        return False


def _call_user_hook(user_hook, state, bucket):
    """Run the user's communication hook (PowerSGD, fp16/bf16 compression) in diag's place, unchanged: the
    collectives it issues through torch.distributed are recorded by the wrappers, labelled ``ddp``, with
    their real sizes and dtypes (a compressed bucket is half the bytes), each with its own sequence number."""
    previous = getattr(_local, "source", None)
    _local.source = "ddp"
    try:
        return user_hook(state, bucket)
    finally:
        if previous is None:
            del _local.source
        else:
            _local.source = previous


def _take_over_hook_registration(ddp_model, user: dict, on_user_hook) -> None:
    """DDP accepts one communication hook and diag's is registered: a user's later
    ``register_comm_hook`` / ``_register_builtin_comm_hook`` would raise "can only be called once". On this
    model, they record the user's hook instead, which diag's hook then calls in its place (DDP's checks and
    its once-only rule kept)."""
    import torch.distributed as dist

    def register_comm_hook(state, hook):
        if user:
            raise RuntimeError("register_comm_hook or register_builtin_comm_hook can only be called once.")
        ddp_model._check_comm_hook(hook)
        with contextlib.suppress(Exception):  # DDP's usage logging only
            ddp_model.logger._set_comm_hook_name(hook.__qualname__)
        ddp_model._comm_hooks.append((hook, state))
        user.update(hook=hook, state=state)
        if on_user_hook is not None:
            _safely(on_user_hook)

    def register_builtin_comm_hook(comm_hook_type):
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        builtin = {
            dist.BuiltinCommHookType.ALLREDUCE: default_hooks.allreduce_hook,
            dist.BuiltinCommHookType.FP16_COMPRESS: default_hooks.fp16_compress_hook,
        }.get(comm_hook_type)
        if builtin is None:
            raise RuntimeError(f"unknown built-in communication hook {comm_hook_type}")
        register_comm_hook(ddp_model.process_group, builtin)

    ddp_model.register_comm_hook = register_comm_hook
    ddp_model._register_builtin_comm_hook = register_builtin_comm_hook
