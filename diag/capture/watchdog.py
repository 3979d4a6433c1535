"""Hang watchdog and heartbeat: what ``diag triage`` needs when a job stops making progress.

A daemon thread (1) rewrites ``heartbeat.json`` every ``heartbeat_interval_s``, so a rank whose process is
gone (SIGKILL, OOM-killer, segfault) can be told from one that is alive and stuck: its heartbeat stops and no
exit record follows; (2) when a collective, the current step or the data loader has been pending longer than
``pending_threshold_s``, writes once per stall a hang dump: pending collectives with their sequence numbers,
Python stacks of all threads, the Flight Recorder dump (``fr_dump.pkl``, bytes as torch gave them), and the
rank's step and phase. The same dump is written on SIGTERM / SIGUSR1 and at an abnormal exit (uncaught
exception, interpreter exit without ``diag.finish``); fatal signals (SIGSEGV, SIGABRT, ...) get their stacks
from faulthandler into ``fatal_stacks.txt``.

The training thread is never touched: the thread only reads a few session attributes. Any failure is one
warning and the watchdog degrades (first the failing part, then the whole thread), never raising.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import json
import os
import select
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

from diag._warn import warn_once
from diag.capture import torch_private
from diag.capture.components import Component
from diag.capture.flight_recorder import dump_bytes
from diag.trace.records import ExitRecord, GroupProgress, HangDump, Heartbeat, PendingOp, Stall
from diag.trace.schema import (
    CAPTURE_STOPPED,
    FATAL_STACKS_FILE,
    FR_DUMP_FILE,
    STACKS_PREFIX,
    hang_dump_name,
    hang_dump_number,
)

MAX_PENDING_IN_HEARTBEAT = 8
GAP_INTERVALS = 3  # a tick this many intervals late means the process was frozen
SIGTERM_GRACE_S = 2.0  # time the main thread gets to run the Python handler before the watchdog ends the process


def _now_us() -> int:
    return time.time_ns() // 1000


class Watchdog(Component):
    """Heartbeat and hang dumps for one session. ``start()`` from the thread that called ``diag.init``."""

    def __init__(self, session, pending_threshold_s: float, heartbeat_interval_s: float):
        self.session = session
        self.pending_threshold_s = float(pending_threshold_s)
        self.heartbeat_interval_s = max(0.05, float(heartbeat_interval_s))
        self.dumps_written = 0
        self._dumps_before = 0  # dumps an earlier attempt (a restart into the same directory) left: not overwritten
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._dump_lock = threading.RLock()  # a signal handler may interrupt a dump on the main thread
        self._stall_key = None  # what the current stall is about; a dump is written once per key
        self._stall_record: Stall | None = None  # the stall the heartbeat describes (see _describe_stall)
        self._progress = None  # last observed (step, phase, pending seqs) and when it changed
        self._progress_since_us = _now_us()
        self._exit: ExitRecord | None = None  # how the process is ending, once known
        self._previous_handlers: dict[int, object] = {}
        self._previous_excepthook = None
        self._wakeup_read = self._wakeup_write = -1
        self._previous_wakeup_fd = -1
        self._signal_handled_us: dict[int, int] = {}  # signal -> when the main thread's handler ran
        self._signal_dumped_us: dict[int, int] = {}  # signal -> when its dump was written
        self._signal_dump_done: dict[int, threading.Event] = {}  # signal -> set once its records are on disk
        self._fatal_file = None
        self._fatal_path = None
        self._in_signal_handler = False  # a second SIGTERM must not cut the first one's dump short
        self._pid = os.getpid()  # a forked child (DataLoader worker) inherits the handlers, not the rank

    # -- lifecycle ------------------------------------------------------------------------------------------
    def start(self) -> None:
        self._pid = os.getpid()
        self._dumps_before = _highest_dump_number(self.session.writer.rank_dir)
        os.register_at_fork(after_in_child=self._after_fork_in_child)
        self._install_signal_handlers()
        self._install_exit_hooks()
        self._enable_faulthandler()
        self._write_heartbeat("running")
        self._thread = threading.Thread(target=self._run, name="diag-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Called by diag.finish: a clean end, recorded as such in the heartbeat."""
        if self._exit is None:
            self._exit = ExitRecord(how="finished")
        self._stop.set()
        self._wake()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=max(2.0, 2 * self.heartbeat_interval_s))
        self._safely("heartbeat", self._write_heartbeat, "finished")
        # the recorder's state at the end lets triage work from Flight Recorder dumps alone (a rank that
        # finished early shows which collectives it never issued)
        self._safely("flight-recorder", self._write_flight_recorder)
        self._safely("restore", self._restore_handlers)

    # -- the thread -------------------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            for signum in self._wait_for_tick():
                self._safely("signal", self._on_signal_in_thread, signum)
            self._safely("gap", self._note_gap, _now_us())  # even when stopping: a frozen rank may finish at once
            if self._stop.is_set():
                return
            try:
                self._tick()
            except Exception as exc:  # never let a bug here become a dead thread that hides the heartbeat
                warn_once("watchdog-tick", f"hang watchdog failed ({exc!r}); heartbeats and hang dumps are off")
                return

    def _wait_for_tick(self) -> list[int]:
        """Sleep one heartbeat interval, waking early when a signal arrives (through the wakeup fd)."""
        if self._wakeup_read < 0:
            self._stop.wait(self.heartbeat_interval_s)
            return []
        ready, _, _ = select.select([self._wakeup_read], [], [], self.heartbeat_interval_s)
        if not ready:
            return []
        try:
            data = os.read(self._wakeup_read, 64)
        except OSError:
            return []
        return [b for b in data if b in (signal.SIGTERM, signal.SIGUSR1)]

    def _tick(self) -> None:
        now_us = _now_us()
        pending = self._pending()
        self._note_progress(pending, now_us)
        stall = self._stall(pending, now_us)
        if stall is None:
            self._stall_key = None
        elif stall[0] != self._stall_key:
            self._stall_key = stall[0]
            self.dump(f"stall: {stall[1]}", pending)
        self._stall_record = None if stall is None else self._describe_stall(stall, pending, now_us)
        self._write_heartbeat("stalled" if stall else "running", pending)

    def _describe_stall(self, stall, pending: list[dict], now_us: int) -> Stall:
        """What the heartbeat says of a stall (the Prometheus hang metrics read it): the collective pending
        longest, or none when the step itself made no progress."""
        if stall[0][0] == "collective":
            oldest = min(pending, key=lambda p: p.get("start_us") or now_us)
            since_us = oldest.get("start_us") or now_us
            what = {"pg": oldest.get("pg"), "seq": oldest.get("seq"), "op": oldest.get("op")}
        else:
            since_us, what = self._progress_since_us, {"pg": None, "seq": None, "op": None}
        return Stall(**what, since_us=since_us, seconds=(now_us - since_us) / 1e6, reason=stall[1])

    def _note_gap(self, now_us: int) -> None:
        """A tick far later than its interval: the whole process was frozen (SIGSTOP, a debugger, the host
        stalled) and its heartbeat looked stale meanwhile; triage tells that from a rank busy computing."""
        last_us, self._last_tick_us = getattr(self, "_last_tick_us", 0), now_us
        if last_us and now_us - last_us > max(1e6, GAP_INTERVALS * self.heartbeat_interval_s * 1e6):
            self.session.writer.event("heartbeat_gap", start_us=last_us, end_us=now_us)

    def _note_progress(self, pending: list[dict], now_us: int) -> None:
        session = self.session
        progress = (
            session.current_step,
            session.last_step,
            session.current_phase,
            tuple(p.get("seq") for p in pending),
        )
        if progress != self._progress:
            self._progress, self._progress_since_us = progress, now_us

    def _stall(self, pending: list[dict], now_us: int) -> tuple[object, str] | None:
        """(key, description) of what has been pending longer than the threshold, or None."""
        threshold_us = self.pending_threshold_s * 1e6
        if pending:
            oldest = min(pending, key=lambda p: p.get("start_us") or now_us)
            age_us = now_us - (oldest.get("start_us") or now_us)
            if age_us > threshold_us:
                what = f"{oldest.get('op')} seq {oldest.get('seq')} in group {oldest.get('pg')}"
                return ("collective", oldest.get("pg"), oldest.get("start_us")), f"{what} pending {age_us / 1e6:.1f} s"
        session = self.session
        busy = session.current_step is not None or session.current_phase is not None
        idle_us = now_us - self._progress_since_us
        if busy and idle_us > threshold_us:
            where = (
                f"step {session.current_step}"
                if session.current_step is not None
                else f"after step {session.last_step}"
            )
            phase = f", phase {session.current_phase}" if session.current_phase else ""
            return ("progress", self._progress), f"no progress for {idle_us / 1e6:.1f} s ({where}{phase})"
        return None

    # -- what is written ----------------------------------------------------------------------------------------
    def _pending(self) -> list[dict]:
        try:
            pending = [dict(p) for p in self.session.pending_collectives()]
        except Exception as exc:
            warn_once("watchdog-pending", f"cannot read pending collectives ({exc!r})")
            return []
        for entry in pending:
            if entry.get("seq", -1) == -1:  # a blocking op gets its seq only when it returns: ask c10d now
                entry["seq"] = _current_seq(entry.get("pg"), self.session.trace_group_name)
                entry["seq_inferred"] = True
        return pending

    def _state(self) -> dict:
        session = self.session
        return {
            "rank": session.rank,
            "pid": os.getpid(),
            "time_us": _now_us(),
            "step": session.current_step,
            "last_step": session.last_step,
            "phase": session.current_phase,
            "step_started_us": session.step_started_us,
        }

    def _last_seqs(self) -> dict[str, int]:
        """Highest collective seq each group completed, so a rank killed before its rows reached the disk
        still says how far it got."""
        try:
            seen = getattr(getattr(self.session, "recorder", None), "seen_seqs", None) or {}
            return {str(pg): max(seqs) for pg, seqs in list(seen.items()) if seqs}
        except Exception:  # a set changing under us: skip this beat's number
            return {}

    def _groups(self) -> dict[str, GroupProgress] | None:
        """Per group, the last collective issued and completed (None when collectives are not recorded)."""
        recorder = getattr(self.session, "recorder", None)
        if recorder is None:
            return None
        try:
            marks = recorder.group_progress()
        except Exception as exc:  # a dict changing under us: this beat says nothing of the groups
            warn_once("watchdog-groups", f"cannot read the groups' last collectives ({exc!r})")
            return None
        return {pg: GroupProgress.from_json(progress) for pg, progress in marks.items()}

    def _write_heartbeat(self, state: str, pending: list[dict] | None = None) -> None:
        heartbeat = self._heartbeat(state, pending)
        with self._dump_lock:  # the writer renames one fixed temp file: one writer at a time
            self.session.writer.write_heartbeat(heartbeat.to_json())

    def stopped_heartbeat(self) -> dict:
        """The last heartbeat once capture stopped (the writer's last words): state ``capture_stopped``, which
        later beats, no longer written, never replace. Triage reads what the rank did after it as unknown."""
        return self._heartbeat(CAPTURE_STOPPED, None).to_json()

    def _heartbeat(self, state: str, pending: list[dict] | None) -> Heartbeat:
        pending = self._pending() if pending is None else pending
        return Heartbeat(
            **self._state(),
            state=state if self._exit is None else self._exit.how or state,
            interval_s=self.heartbeat_interval_s,
            threshold_s=self.pending_threshold_s,
            pending=_pending_ops(pending[:MAX_PENDING_IN_HEARTBEAT]),
            pending_count=len(pending),
            stall=self._stall_record if state == "stalled" else None,
            last_seq=self._last_seqs(),
            dumps_written=self.dumps_written,
            exit=self._exit,
            groups=self._groups(),
        )

    def dump(self, reason: str, pending: list[dict] | None = None) -> None:
        """Write one hang dump now (any thread). Errors become one warning."""
        self._safely("dump", self._dump, reason, pending)

    def _dump(self, reason: str, pending: list[dict] | None) -> None:
        with self._dump_lock:
            self.dumps_written += 1
            number = self._dumps_before + self.dumps_written
            writer = self.session.writer
            pending = self._pending() if pending is None else pending
            threads = _thread_stacks()
            name = hang_dump_name(number)
            fr_file, fr_error = self._write_flight_recorder()
            record = HangDump(
                **self._state(),
                reason=reason,
                pending=_pending_ops(pending),
                threads=tuple(threads),
                fr_dump=fr_file,
                fr_error=fr_error,
                exit=self._exit,
            )
            writer.write_text(name, json.dumps(record.to_json(), indent=1, default=str))
            writer.write_text(f"{STACKS_PREFIX}{number:03d}.txt", _stacks_text(threads, reason))
            writer.event("watchdog_dump", reason=reason, file=name, step=record.step, phase=record.phase)
            writer.flush()

    def _write_flight_recorder(self) -> tuple[str | None, str | None]:
        if "torch" not in sys.modules:  # never import torch from here; without it there is no recorder
            return None, "torch not imported"
        if not self.session.writer.enabled:  # already warned about: no file of capture's is written any more
            return None, "trace writer off"
        try:
            data = dump_bytes()
        except Exception as exc:
            return None, repr(exc)[:300]
        if not data:
            return None, "Flight Recorder is off (set TORCH_FR_BUFFER_SIZE, e.g. 2000)"
        try:
            self.session.writer.replace_file(FR_DUMP_FILE, data)
        except OSError as exc:  # a full disk: no half-written temp file is left behind; the rest is dumped
            return None, repr(exc)[:300]
        return FR_DUMP_FILE, None

    # -- signals and exits ---------------------------------------------------------------------------------------
    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            warn_once("watchdog-signals", "diag.init ran outside the main thread: no hang dump on SIGTERM/SIGUSR1")
            return
        for signum in (signal.SIGTERM, signal.SIGUSR1):
            try:
                self._previous_handlers[signum] = signal.signal(signum, self._on_signal)
            except (ValueError, OSError) as exc:
                warn_once(f"watchdog-signal-{signum}", f"cannot handle signal {signum} ({exc})")
        self._install_wakeup_fd()

    def _install_wakeup_fd(self) -> None:
        """Python runs signal handlers only when the main thread returns to the interpreter, never while it is
        blocked in a collective. The wakeup fd is written from the C handler at once, so this thread can dump."""
        try:
            read_fd, write_fd = os.pipe()
            os.set_blocking(write_fd, False)
            previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
            if previous != -1:  # someone else (asyncio) owns it: give it back and rely on the handler alone
                signal.set_wakeup_fd(previous)
                os.close(read_fd)
                os.close(write_fd)
                return
            self._wakeup_read, self._wakeup_write = read_fd, write_fd
        except (ValueError, OSError) as exc:
            warn_once("watchdog-wakeup", f"signal wakeup unavailable ({exc}); SIGTERM dumps wait for the main thread")

    def _on_signal(self, signum, frame) -> None:
        """Main-thread handler: dump (unless the thread just did), then what the previous handler would do."""
        self._signal_handled_us[signum] = _now_us()
        if self._in_signal_handler:
            return  # a repeated signal interrupting our own handler: the outer call finishes the job
        self._in_signal_handler = True
        try:
            if self._in_owner_process():
                self._record_signal(signum)
        finally:
            self._in_signal_handler = False
        previous = self._previous_handlers.get(signum, signal.SIG_DFL)
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL and signum == signal.SIGTERM:
            self._die_by(signum)
        # SIGUSR1 with no previous handler means "dump now": diag takes it over instead of terminating.

    def _on_signal_in_thread(self, signum: int) -> None:
        self._record_signal(signum)
        if signum != signal.SIGTERM or self._previous_handlers.get(signum) != signal.SIG_DFL:
            return
        if signal.getsignal(signum) != self._on_signal:
            return  # a handler installed after diag's owns the signal now (checkpoint, then exit): never end it
        deadline = time.monotonic() + SIGTERM_GRACE_S
        while time.monotonic() < deadline:  # the main thread may still run the handler (and chain) itself
            if signum in self._signal_handled_us:
                return
            time.sleep(0.05)
        self._die_by(signum)  # main thread stuck in C: end the process as SIGTERM would have

    def _record_signal(self, signum: int) -> None:
        """Both the main-thread handler and the thread see each signal: the first one dumps."""
        now_us = _now_us()
        with self._dump_lock:
            if signum == signal.SIGTERM and self._exit is None:
                self._exit = ExitRecord(how="terminated", signal="SIGTERM", time_us=now_us)
            in_progress = now_us - self._signal_dumped_us.get(signum, 0) < 1_000_000
            if in_progress:
                done = self._signal_dump_done.get(signum)
            else:
                self._signal_dumped_us[signum] = now_us
                done = self._signal_dump_done[signum] = threading.Event()
        if in_progress:
            # The other thread is writing this signal's records. Wait for them (bounded): on SIGTERM the main
            # thread's handler ends the process next, and ending it mid-dump lost the exit record, so a job
            # stopped from outside read as ranks that died.
            if done is not None:
                done.wait(SIGTERM_GRACE_S)
            return
        try:
            if signum == signal.SIGTERM:  # the process may end any moment now: the records first
                self._safely("flush", self._flush_records)
            self.dump(f"signal {signal.Signals(signum).name}")
            self._safely("heartbeat", self._write_heartbeat, "running")
        finally:
            done.set()

    def _flush_records(self, exiting: bool = False) -> None:
        """Everything capture holds to the disk: Flight Recorder's unread entries, then the writer's buffers.
        ``exiting``: the process ends without issuing more, so every entry is written, the newest too (a row
        left unwritten would read, beside the dump written next, as a collective that never returned)."""
        recorder = getattr(self.session, "recorder", None)
        if recorder is not None and "torch" in sys.modules:
            recorder.flight_recorder.read(final=exiting)
        self.session.writer.flush()

    def _die_by(self, signum: int) -> None:
        self._safely("flush", self.session.writer.flush)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signum, signal.SIG_DFL)
        else:
            _reset_to_default_in_c(signum)
        os.kill(os.getpid(), signum)

    def _install_exit_hooks(self) -> None:
        self._previous_excepthook = sys.excepthook
        sys.excepthook = self._excepthook
        atexit.register(self._at_exit)

    def _excepthook(self, exc_type, exc, tb) -> None:
        if self._exit is None and self._in_owner_process():
            text = "".join(traceback.format_exception(exc_type, exc, tb))[-4000:]
            self._exit = ExitRecord(
                how="exception", error=f"{exc_type.__name__}: {exc}"[:2000], traceback=text, time_us=_now_us()
            )
            self._safely("flush", self._flush_records, True)  # the rows before the dump, as on SIGTERM
            self.dump(f"uncaught {exc_type.__name__}")
        (self._previous_excepthook or sys.__excepthook__)(exc_type, exc, tb)

    def _at_exit(self) -> None:
        if self._stop.is_set() or not self._in_owner_process():
            return  # diag.finish ran (a clean end), or this is a forked child exiting
        if self._exit is None:
            self._exit = ExitRecord(how="exited_without_finish", time_us=_now_us())
            self._safely("flush", self._flush_records, True)
            self.dump("process exiting without diag.finish")
        self._stop.set()
        self._safely("heartbeat", self._write_heartbeat, self._exit.how)
        self._safely("flush", self.session.writer.flush)

    def _in_owner_process(self) -> bool:
        return os.getpid() == self._pid

    def _after_fork_in_child(self) -> None:
        """The child shares the wakeup pipe: its signals would reach the parent's watchdog thread (which
        would then dump, and on SIGTERM end the parent). Give the child its own, empty, wakeup fd."""
        if self._wakeup_write < 0 or self._stop.is_set():
            return
        with contextlib.suppress(ValueError, OSError):
            signal.set_wakeup_fd(-1)
        for fd in (self._wakeup_read, self._wakeup_write):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._wakeup_read = self._wakeup_write = -1

    def _enable_faulthandler(self) -> None:
        if faulthandler.is_enabled():
            return  # the user's own faulthandler set-up wins
        try:
            path = self.session.writer.rank_dir / FATAL_STACKS_FILE
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o644)
            self._fatal_file = open(fd, "w")  # noqa: SIM115 - kept open for faulthandler
            self._fatal_path = path  # the file object's name is its descriptor
            faulthandler.enable(file=self._fatal_file, all_threads=True)
        except (OSError, ValueError, RuntimeError) as exc:
            warn_once("watchdog-faulthandler", f"no stacks on fatal signals ({exc})")

    def _restore_handlers(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for signum, previous in self._previous_handlers.items():
                if signal.getsignal(signum) == self._on_signal:
                    signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
            if self._wakeup_write >= 0:
                signal.set_wakeup_fd(-1)
                os.close(self._wakeup_read)
                os.close(self._wakeup_write)
                self._wakeup_read = self._wakeup_write = -1
        if sys.excepthook == self._excepthook:
            sys.excepthook = self._previous_excepthook or sys.__excepthook__
        atexit.unregister(self._at_exit)
        if self._fatal_file is not None:
            faulthandler.disable()
            path = self._fatal_path
            self._fatal_file.close()
            self._fatal_file = None
            if os.path.getsize(path) == 0:
                os.unlink(path)

    def _wake(self) -> None:
        if self._wakeup_write >= 0:
            with contextlib.suppress(OSError):
                os.write(self._wakeup_write, b"\0")

    def _safely(self, what: str, function, *args) -> None:
        try:
            function(*args)
        except Exception as exc:
            warn_once(f"watchdog-{what}", f"hang watchdog: {what} failed ({exc!r}); going on without it")


def start_watchdog(session) -> Watchdog | None:
    config = session.config
    if not (config.watchdog and session.writer.enabled):
        session.capture_status["watchdog"] = "off"
        return None
    threshold_s, heartbeat_s = config.hang_threshold_s, config.heartbeat_interval_s
    try:
        watchdog = Watchdog(session, threshold_s, heartbeat_s)
        watchdog.start()
        session.capture_status["watchdog"] = f"on: hang dump after {threshold_s} s, heartbeat every {heartbeat_s} s"
        return watchdog
    except Exception as exc:
        session.capture_status["watchdog"] = f"off: {exc!r}"
        warn_once("watchdog", f"hang watchdog unavailable ({exc!r})")
        return None


def _highest_dump_number(rank_dir: Path) -> int:
    """The highest ``hang_dump_NNN.json`` number in ``rank_dir`` (0 when none, or unreadable)."""
    try:
        numbers = [hang_dump_number(name) for name in os.listdir(rank_dir)]
    except OSError:
        return 0
    return max((n for n in numbers if n is not None), default=0)


def _thread_stacks() -> list[dict]:
    """Every Python thread's stack, innermost frame last (traceback order), main thread first."""
    names = {t.ident: t for t in threading.enumerate()}
    main_ident = threading.main_thread().ident
    stacks = []
    for ident, frame in sys._current_frames().items():
        thread = names.get(ident)
        frame = _outside_watchdog(frame) if ident == threading.get_ident() else frame
        frames = [
            {"file": f.filename, "line": f.lineno, "name": f.name, "code": f.line}
            for f in (traceback.extract_stack(frame) if frame is not None else [])
        ]
        stacks.append(
            {
                "ident": ident,
                "name": thread.name if thread else f"thread-{ident}",
                "main": ident == main_ident,
                "daemon": bool(thread.daemon) if thread else None,
                "frames": frames,
            }
        )
    return sorted(stacks, key=lambda s: (not s["main"], s["name"]))


def _outside_watchdog(frame):
    """The frame the dumping thread was in before the watchdog's own code (signal handler, excepthook)."""
    outer = frame
    while frame is not None:
        if frame.f_code.co_filename == __file__:
            outer = frame.f_back
        frame = frame.f_back
    return outer


def _stacks_text(threads: list[dict], reason: str) -> str:
    lines = [f"# diag hang dump: {reason}"]
    for thread in threads:
        lines.append(f"\nThread {thread['name']}{' (main)' if thread['main'] else ''}:")
        for frame in thread["frames"]:
            lines.append(f'  File "{frame["file"]}", line {frame["line"]}, in {frame["name"]}')
            if frame.get("code"):
                lines.append(f"    {frame['code']}")
    return "\n".join(lines) + "\n"


def _current_seq(pg_name, trace_name) -> int:
    """The c10d sequence number of the group the trace calls ``pg_name`` now (-1 if unknown)."""
    try:
        for group, name in torch_private.process_group_names().items():
            if trace_name(name) == str(pg_name):
                return torch_private.sequence_number(group)
    except Exception:
        pass
    return -1


def _reset_to_default_in_c(signum: int) -> None:
    """signal.signal only works on the main thread; libc's signal() works on any."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.signal.restype = ctypes.c_void_p
    libc.signal.argtypes = (ctypes.c_int, ctypes.c_void_p)
    libc.signal(signum, 0)  # SIG_DFL


def _pending_ops(pending: list[dict]) -> tuple[PendingOp, ...]:
    """The recorder's pending collectives (dicts of PendingCollective.as_dict, seq filled in) as records."""
    return tuple(op for op in map(PendingOp.from_json, pending) if op is not None)
