"""The collectives only PyTorch's Flight Recorder sees, written into the trace.

Some collectives are issued from C++ where no Python wrapper sees them: DDP's gradient buckets when DDP keeps
its built-in path (diag's default on gloo, see ``Session``), DDP's constructor broadcasting its parameters.
Flight Recorder's ring buffer sees every collective of a process group, with its sequence number, sizes,
dtype and issue time (on gloo, no completion time). ``FlightRecorderFollower`` reads it on its own thread while
the job runs, and once more at finish, and writes the entries the Python-side recorder did not.
"""

from __future__ import annotations

import bisect
import os
import pickle
import threading
import time

from diag._warn import warn_once
from diag.capture import torch_private
from diag.trace.schema import COLLECTIVES, SCALAR_TYPES


def dump_bytes(stack_traces: bool = True) -> bytes | None:
    """This process's Flight Recorder dump as torch gives it (a pickle). NCCL groups record in NCCL's
    recorder on older torch, the others in the generic one: take whichever holds more."""
    best = None
    for dump in torch_private.flight_recorder_dumps():
        try:
            data = dump() if stack_traces else _dump_without_stacks(dump)
        except Exception:  # e.g. NCCL's recorder on a build without NCCL
            continue
        if data and (best is None or len(data) > len(best)):
            best = data
    return best


def _issued_in(group) -> int:
    try:
        return torch_private.sequence_number(group)
    except Exception:  # a group torch no longer numbers (destroyed), or a torch without the counter
        return -1


def _dump_without_stacks(dump) -> bytes:
    try:
        return dump(includeCollectives=True, includeStackTraces=False, onlyActive=False)
    except TypeError:  # a torch whose dump takes no options
        return dump()


def own_dump(stack_traces: bool = True) -> dict | None:
    """This process's Flight Recorder entries. It is our own memory, not a file, so plain unpickling is safe."""
    data = dump_bytes(stack_traces)
    return pickle.loads(data) if data else None


class StepSpans:
    """Wall-clock spans of recent steps, to tell which step a Flight Recorder entry was issued in."""

    KEPT = 50_000  # far more than the steps between two reads of the ring buffer

    def __init__(self):
        self._starts: list[int] = []
        self._spans: list[tuple[int, int, int]] = []  # (start_ns, end_ns, step), in start order
        self._lock = threading.Lock()

    def add(self, start_ns: int, end_ns: int, step: int) -> None:
        with self._lock:
            self._starts.append(start_ns)
            self._spans.append((start_ns, end_ns, step))
            if len(self._spans) > 2 * self.KEPT:
                del self._starts[: self.KEPT], self._spans[: self.KEPT]

    def step_at(self, wall_ns: int, open_step: tuple[int, int] | None = None) -> int:
        """The step whose span holds ``wall_ns``, else -1; ``open_step``: (start_ns, step) of a step not ended."""
        if open_step is not None and wall_ns >= open_step[0]:
            return open_step[1]
        with self._lock:
            i = bisect.bisect_right(self._starts, wall_ns) - 1
            if i >= 0:
                start_ns, end_ns, step = self._spans[i]
                if wall_ns <= end_ns:
                    return step
        return -1


class FlightRecorderFollower:
    """Writes the Flight Recorder entries the Python-side recorder did not see, while the job runs.

    Started at ``diag.init`` whatever the parallelism (DDP's C++ buckets, DTensor and functional collectives,
    anything issued from C++). The ring buffer keeps the last TORCH_FR_BUFFER_SIZE entries (2000 by default),
    shared by every process group, and a dump decodes all of them, about 14 us per entry, on this thread. A
    thread checks the groups' sequence counters every ``CHECK_INTERVAL_S`` and reads the ring when something is
    new and ``read_interval_s`` (1 s; longer where one read costs over ``MAX_READ_SHARE`` of it) has passed, or
    at once when ``READ_AT_FILL`` of the ring is new (checking more often when collectives come faster than a
    quarter ring per check); a SIGTERM and finish read it once more. So a SIGKILL loses about
    ``read_interval_s`` + ``flush_interval_s`` of these rows. A ring overtaken
    between two reads is one warning with the count lost (raise TORCH_FR_BUFFER_SIZE).
    Entries younger than ``SETTLE_NS`` wait for the next read: a Python wrapper marks its collective as seen
    just after issuing it."""

    CHECK_INTERVAL_S = 0.25
    MIN_CHECK_INTERVAL_S = 0.005
    READ_AT_FILL = 0.5
    MAX_READ_SHARE = 0.02  # of the time between two time-based reads, spent reading (and holding the GIL)
    SETTLE_NS = 100_000_000

    def __init__(self, recorder, steps: StepSpans, open_step, read_interval_s: float = 1.0):
        self.recorder = recorder
        self.steps = steps
        self._open_step = open_step  # () -> (start_ns, step) of the step in progress, or None
        self.since_ns = time.time_ns()
        self.ddp_groups: dict[str, object] = {}  # pg name -> group whose DDP buckets come from here
        self._done: dict[str, int] = {}  # per group, the highest seq written or found already recorded
        self._ring_size = _ring_size_from_environment()
        # at most this long between a collective and its row reaching the writer (then flush_interval_s to
        # the disk): what a SIGKILL loses. Reads only when something is new, on this thread, not training's.
        self.read_interval_s = max(float(read_interval_s), self.CHECK_INTERVAL_S)
        self._issued_at_read = 0
        self._read_at = time.monotonic()
        self.reads = 0
        self._last_read_s = 0.0
        self.entries_lost = 0  # collectives the ring dropped before a read (warned about once)
        self.read_s = 0.0  # thread time spent reading: what following costs (docs/benchmarks.md)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def follow_ddp(self, pg_name: str, group) -> None:
        """Take DDP's buckets in this group from Flight Recorder (labelled ``ddp``)."""
        self.ddp_groups[pg_name] = group
        self.start()

    def restart(self) -> None:
        """After ``destroy_process_group()``: the ring's entries so far are the old groups' (read just before);
        the new groups, named as the old ones were, are followed from now, from their first collective."""
        with self._lock:
            self.since_ns = time.time_ns()
            self._done.clear()
            self.ddp_groups.clear()

    def _trace_name(self, entry: dict) -> str:
        return self.recorder.session.trace_group_name(entry.get("process_group", ("",))[0])

    def stop(self) -> int:
        """At finish: stop the thread and write everything still unwritten. Returns the rows written."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        return self.read(final=True)

    def start(self) -> None:
        """Follow the ring while the job runs, whatever the parallelism: DDP's buckets, DTensor's and the
        functional collectives' ops and anything else issued from C++ are only seen here."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="diag-flight-recorder", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        self._safely_note_baseline()
        wait_s, checked_at, issued_at_check = self.CHECK_INTERVAL_S, time.monotonic(), 0
        while not self._stop.wait(wait_s):
            try:
                issued = self._issued_in_all_groups()
                now = time.monotonic()
                wait_s = self._next_wait_s((issued - issued_at_check) / max(now - checked_at, 1e-3))
                checked_at, issued_at_check = now, issued
                new = issued - self._issued_at_read
                due = new >= self.READ_AT_FILL * self._ring_size
                if due or (new > 0 and now - self._read_at >= self._time_based_interval_s()):
                    self._issued_at_read = issued
                    self.read(final=False)
            except Exception as exc:
                warn_once("flight-recorder-follow", f"stopped reading Flight Recorder while running ({exc!r})")
                return

    def _time_based_interval_s(self) -> float:
        """``read_interval_s``, longer where one read costs more than MAX_READ_SHARE of it (a ring of tens of
        thousands of entries): a whole-ring dump holds the GIL the training thread needs."""
        return max(self.read_interval_s, self._last_read_s / self.MAX_READ_SHARE)

    def _next_wait_s(self, issued_per_s: float) -> float:
        """Check often enough that a quarter of the ring at most fills between two checks: a job issuing
        collectives faster than CHECK_INTERVAL_S allows (a small ring, tensor parallel's many small ops) is
        read before the ring overtakes it. The counters are cheap; the reads stay one per half ring."""
        if issued_per_s <= 0:
            return self.CHECK_INTERVAL_S
        return min(self.CHECK_INTERVAL_S, max(self.MIN_CHECK_INTERVAL_S, 0.25 * self._ring_size / issued_per_s))

    def _safely_note_baseline(self) -> None:
        """Each group's last collective issued before diag started: the next one is the first to account for,
        so a ring that overtook the first read is seen as such (not taken for a group's first sighting)."""
        try:
            dump = own_dump(stack_traces=False) or {}
            with self._lock:
                for entry in dump.get("entries", []):
                    if entry.get("is_p2p") or (entry.get("time_created_ns") or 0) >= self.since_ns:
                        continue
                    pg = self._trace_name(entry)
                    self._done[pg] = max(self._done.get(pg, 0), int(entry.get("collective_seq_id", -1)))
        except Exception as exc:
            warn_once("flight-recorder-follow", f"cannot read Flight Recorder ({exc!r}); C++ collectives may be lost")

    def _issued_in_all_groups(self) -> int:
        """Operations issued so far in every process group: they all share the ring."""
        try:
            groups = torch_private.process_groups()
        except Exception:  # a torch without that registry: the followed groups only
            groups = list(self.ddp_groups.values())
        return sum(max(_issued_in(group), 0) for group in groups)

    def read(self, final: bool) -> int:
        with self._lock:
            started = time.thread_time()
            self._read_at = time.monotonic()
            dump = own_dump(stack_traces=False)
            rows = []
            if dump:
                entries = dump.get("entries", [])
                self._ring_size = max(self._ring_size, len(entries))
                until_ns = None if final else self._settled_until_ns()
                rows = self._rows(entries, until_ns)
                for row in rows:
                    self.recorder.session.writer.append("collectives", row)
            self.reads += 1
            self._last_read_s = time.thread_time() - started
            self.read_s += self._last_read_s
            return len(rows)

    def _settled_until_ns(self) -> int:
        """Entries issued before this are the follower's to write: older than SETTLE_NS, and older than any
        blocking Python-side collective still in progress (a slow first all_reduce waiting for a late rank)."""
        until_ns = time.time_ns() - self.SETTLE_NS
        unsequenced_ns = self.recorder.unsequenced_since_ns()
        return until_ns if unsequenced_ns is None else min(until_ns, unsequenced_ns - 1_000_000)

    def _rows(self, entries: list[dict], until_ns: int | None) -> list[tuple]:
        seen = self.recorder.seen_seqs
        open_step = self._open_step()
        fresh = [e for e in entries if not e.get("is_p2p") and (e.get("time_created_ns") or 0) >= self.since_ns]
        fresh.sort(key=lambda e: e.get("record_id", 0))  # issue order
        self._warn_if_overwritten(fresh)
        rows = []
        for entry in fresh:
            pg = self._trace_name(entry)
            seq = int(entry.get("collective_seq_id", -1))
            done = self._done.setdefault(pg, 0)  # a group with no collective before diag starts at seq 1
            if seq <= done or (until_ns is not None and entry["time_created_ns"] >= until_ns):
                continue
            self._done[pg] = seq
            if seq in seen.get(pg, ()):
                continue
            op = str(entry.get("profiling_name", "")).split(":")[-1]
            step = self.steps.step_at(entry["time_created_ns"], open_step)
            ddp_bucket = pg in self.ddp_groups and op == "all_reduce" and step >= 0
            rows.append(_row(entry, pg, seq, op, step, "ddp" if ddp_bucket else "fr"))
        return rows

    def _warn_if_overwritten(self, fresh: list[dict]) -> None:
        """The ring wrapped between two reads: a group's oldest entry is past the next one to account for."""
        oldest: dict[str, int] = {}
        for entry in fresh:
            oldest.setdefault(self._trace_name(entry), int(entry.get("collective_seq_id", -1)))
        lost = sum(max(0, first_seq - self._done.get(pg, 0) - 1) for pg, first_seq in oldest.items())
        self.entries_lost += lost
        if lost:
            warn_once(
                "flight-recorder-overwritten",
                f"Flight Recorder's ring buffer wrapped before diag read it: {lost} collectives were lost from it; "
                "those issued from C++ (DDP buckets, DTensor) are not in the trace; raise TORCH_FR_BUFFER_SIZE "
                "(2000 by default)",
            )


def _ring_size_from_environment() -> int:
    for name in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        try:
            size = int(os.environ.get(name, "0"))
        except ValueError:
            continue
        if size > 0:
            return size
    return 2000  # torch's default


def _row(entry: dict, pg: str, seq: int, op: str, step: int, source: str) -> tuple:
    """A ``collectives`` row for a Flight Recorder entry. Its duration is known only where Flight Recorder
    timed it (NCCL with TORCH_NCCL_ENABLE_TIMING=1)."""
    dtypes = entry.get("input_dtypes") or []
    numel = sum(_numel(size) for size in entry.get("input_sizes") or [])
    duration_ms = entry.get("duration_ms")
    return COLLECTIVES.row(
        step=step,
        pg=pg,
        seq=seq,
        op=op,
        bytes=numel * SCALAR_TYPES.get(dtypes[0], ("", 0))[1] if dtypes else 0,
        dtype=SCALAR_TYPES.get(dtypes[0], (str(dtypes[0]).lower(), 0))[0] if dtypes else "",
        start_us=entry["time_created_ns"] // 1000,
        duration_us=None if duration_ms is None else round(float(duration_ms) * 1000, 1),
        blocking=0,
        source=source,
    )


def _numel(size) -> int:
    count = 1
    for dim in size:
        count *= int(dim)
    return count
