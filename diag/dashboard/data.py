"""The dashboard's data: a ``LiveTrace`` that loads a trace directory once, then reads only what was appended,
and immutable ``Snapshot``s of it that the pages draw from.

Reading and analysing happen on a background thread (``LiveTrace.start``); callbacks only read the latest
snapshot, so a 1,024-rank analysis that takes seconds never blocks a page. What a page shows comes from the
``Report``, or, for series over every recorded step or sample that the Report does not carry, from the analysis
that owns them (``report.all_step_times``, ``mfu.per_step_throughput``, ``telemetry.throttled_samples``,
``memory.oom_steps``). This module only selects, aligns and reduces them for display (per rank x step matrices,
fleet bands over steps), always to a bounded size so that no figure grows with the number of ranks or steps.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from diag.analysis.columns import analysed_columns
from diag.analysis.engine import BATCH_RANKS, rank_sources, read_shard
from diag.analysis.partitioned import (
    ANALYSED_COLUMNS,
    RANK_TABLES,
    AnalysedColumnsReader,
    collectives_reducer,
    poll_in_workers,
    rank_tables_runner,
    release_arrow_memory,
)
from diag.processes import PARTITIONED_MIN_RANKS, Workers, release_heap_memory, worker_count
from diag.trace.loader import Trace, TraceError, TraceReader, assemble_trace, empty_table, find_rank_dirs
from diag.trace.schema import TABLES
from diag.views.format import printable

STALE_AFTER_S = 30.0  # a rank whose newest record is this much older than the freshest rank's is stale
POLL_INTERVAL_S = 2.0
TRIAGE_MIN_INTERVAL_S = 30.0  # triage re-reads the whole directory: not more often than this

# State of a rank, as the pages show it.
LIVE, STALE, FINISHED, NO_DATA = "live", "stale", "finished", "no data"


@dataclass
class Snapshot:
    """Everything one version of the pages draws. Never mutated after publication, except the memo cache."""

    version: int
    trace_dir: Path
    trace: Trace | None = None
    report: object | None = None  # diag.analysis.report.Report
    times: pd.DataFrame | None = None  # rank, step, data_wait_us, compute_us, wait_us, busy_us, iteration_us
    rank_states: pd.DataFrame | None = None  # rank, state, last_record_us, behind_s
    run_state: str = "loading"  # loading, running, finished, quiet
    error: str | None = None  # nothing could be read: why, and what was expected
    analysis_error: str | None = None
    analysing: bool = False  # published before its full report (many ranks, first load): analysis_error says so
    # many ranks: "computed", "cache" (diag analyze's .diag-cache entry), or PRELIMINARY (the per-step tables
    # alone, published while the full report is computed)
    report_source: str | None = None
    views_pending: bool = False  # many ranks: published with its report before memory_view and telemetry_view
    views_error: str | None = None  # many ranks: why memory_view and telemetry_view could not be read
    # many ranks: memory and telemetry are never held whole; these compact views (rank_table_views) stand in
    # for trace.memory and telemetry_frame(trace) on the pages (None: few ranks, the trace's tables are whole)
    memory_view: pd.DataFrame | None = None
    telemetry_view: pd.DataFrame | None = None
    loaded_at_s: float = 0.0  # wall clock of this snapshot
    last_new_rows_s: float | None = None  # wall clock when new rows last arrived
    triage: dict | None = None  # Verdict.to_json(), when triage ran
    triage_note: str | None = None
    _memo: dict = field(default_factory=dict, repr=False)

    def memo(self, key, build):
        """Figure data computed once per snapshot (several callbacks draw from the same aggregation)."""
        if key not in self._memo:
            self._memo[key] = build()
        return self._memo[key]


class LiveTrace:
    """Incremental view of one trace directory. ``refresh()`` reads what was appended and publishes a new
    ``Snapshot`` when anything changed; ``start()`` runs it every ``poll_interval_s`` on a daemon thread."""

    def __init__(
        self,
        trace_dir: str | Path,
        poll_interval_s: float = POLL_INTERVAL_S,
        stale_after_s: float = STALE_AFTER_S,
        triage: bool = True,
        cache: bool = True,
        workers: int | None = None,
    ):
        self.trace_dir = Path(trace_dir)
        # worker processes of the per-rank work (the user's --workers; None: diag.processes.worker_count decides)
        self.workers = workers
        self._first_workers: Workers | None = None  # forked by start(), before this object's threads run
        # many ranks: read the report `diag analyze` cached for the files as they are (.diag-cache), and cache
        # the one computed here, under the same key (see _report_cache)
        self.use_cache = cache
        # called with each new snapshot before it is published, on the poll thread: the app fills the
        # snapshot's memo with the figures' aggregations there, so that callbacks only draw
        self.prepare: Callable[[Snapshot], None] | None = None
        self.poll_interval_s = poll_interval_s
        self.stale_after_s = stale_after_s
        self.triage_enabled = triage
        self._reader = TraceReader(self.trace_dir)
        self.partitioned: bool | None = None  # decided at the first read, from the number of ranks
        self._ranks_at_start = 0
        self._tables: dict[str, pd.DataFrame] = {}
        self._pending: dict[str, list[pd.DataFrame]] = {}  # rows read since the last publication
        self._dirty = False  # something was read that the published snapshot lacks
        # When analysing takes long (a large run), publish at most every twice that: the poll thread keeps
        # reading what is appended in between, and callbacks keep drawing the last snapshot.
        self._next_publish_s = 0.0
        self._manifests: dict[int, dict] = {}
        self._nccl_logs: dict = {}  # rank -> NcclLog, as the reader last parsed them
        self._heartbeats: dict[int, dict] = {}
        self._events: list[pd.DataFrame] = []
        self._skipped: list = []
        self._ranks: list[int] = []
        self._last_record_us: dict[int, int] = {}
        self._last_new_rows_s: float | None = None
        self._triage_at_s = 0.0
        self._last_failure: str | None = None  # the last unexpected failure of a poll, said once
        self._triage_thread: threading.Thread | None = None
        self._triage_result: tuple[dict | None, str | None] = (None, "triage has not run yet")
        self._lock = threading.Lock()  # the poll and triage threads both publish snapshots
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.snapshot = Snapshot(version=0, trace_dir=self.trace_dir)

    # -- reading ------------------------------------------------------------------------------------------
    def refresh(self) -> bool:
        """Read what was appended; publish a new snapshot if anything changed. Never raises: a file that cannot
        be read is named in the snapshot's skipped list by the loader and the other ranks' rows of the same poll
        are kept; anything else unexpected is said once (on stderr) and the last snapshot stays."""
        try:
            return self._refresh()
        except Exception as exc:  # noqa: BLE001 - the live view outlives a bad file or a bug in one poll
            if process_exiting():
                return False  # its thread pools refuse work ("cannot schedule new futures"): nobody is looking
            message = f"could not read {self.trace_dir}: {type(exc).__name__}: {str(exc)[:300]}"
            if self.snapshot.trace is None:
                self._publish_error(message)
            elif message != self._last_failure:
                print(printable(f"diag dashboard: {message}; showing the last data read"), file=sys.stderr)
            self._last_failure = message
            return False

    def _refresh(self) -> bool:
        try:
            if self.partitioned is None:
                self._choose_reader()
            data = self._first_poll_in_workers() if self.snapshot.trace is None else None
            data = data if data is not None else self._reader.poll()
        except (TraceError, OSError) as exc:
            self._publish_error(str(exc))
            return False
        if self.partitioned:  # give back what Arrow's pool and glibc keep of the parse buffers, as diag analyze does
            release_arrow_memory()
            release_heap_memory()
        changed = self._absorb(data)
        if not self._ranks:
            self._publish_error(
                f"no diag traces in {self.trace_dir}: expected rank00000/, rank00001/, ... sub-directories written by diag.init"
            )
            return False
        self._dirty |= changed
        if self._dirty and (self.snapshot.trace is None or time.monotonic() >= self._next_publish_s):
            self._publish()
            return True
        self._publish_states_only()
        return False

    def _choose_reader(self) -> None:
        """Many ranks: read every table but the collectives, which the analyses reduce rank by rank."""
        self._ranks_at_start = len(find_rank_dirs(self.trace_dir)) if self.trace_dir.is_dir() else 0
        self.partitioned = self._ranks_at_start > PARTITIONED_MIN_RANKS
        if self.partitioned:
            per_rank = ("collectives", *RANK_TABLES)  # reduced or viewed rank by rank, never loaded whole
            # the columns the analyses read: the step's components, which only the Compare page reads, are read
            # again rank by rank when it needs them (with_step_components)
            tables = tuple(t for t in TABLES if t not in per_rank)
            self._reader = AnalysedColumnsReader(self.trace_dir, tables=tables)

    def _first_poll_in_workers(self) -> dict | None:
        """Many ranks, the first read: every rank's per-step tables read by worker processes on every core, as
        ``diag analyze`` loads them (``poll_in_workers``; the reader reads on from where they stopped). Threads
        here read under the GIL, one core's worth: ~25 s of the first page at 16,384 ranks. None: read here.
        The workers are those ``start`` forked, else forked now if ``worker_count`` allows it (not beside other
        threads, unless the user asked for workers)."""
        workers, self._first_workers = self._first_workers, None
        if workers is None and self.partitioned:
            workers = Workers(worker_count(self._ranks_at_start, self.workers))
        if workers is None or workers.count < 2:
            return None
        with workers:
            return poll_in_workers(workers, self._reader)

    def _fork_first_readers(self) -> None:
        """Many ranks, nothing read yet: fork the first read's workers now, on the thread that starts polling
        and before this object's threads (a server's may already run: ``worker_count`` then says 1, and the
        first read is done here by threads)."""
        try:
            if self.partitioned is None:
                self._choose_reader()
            if self.partitioned:
                workers = Workers(worker_count(self._ranks_at_start, self.workers))
                workers.start()  # one worker: nothing forked, the first read is done here
                self._first_workers = workers
        except (TraceError, OSError):  # a directory not readable yet, or no fork: the poll thread reads it itself
            self.partitioned = None

    def _absorb(self, data: dict) -> bool:
        changed = False
        for name in TABLES:
            new = data.get(name)
            if new is None:  # not read (the collectives of a partitioned trace)
                self._tables.setdefault(name, empty_table(TABLES[name]))
                continue
            if len(new):
                changed = True
                self._note_records(name, new)
                self._pending.setdefault(name, []).append(new)
            elif name not in self._tables:
                self._tables[name] = new
        for record in data["manifests"]:
            if self._manifests.get(record["rank"]) != record:  # a new rank, or finished: re-analyse
                self._manifests[record["rank"]] = record
                changed = True
        # heartbeats are rewritten by the watchdog thread even while training is stuck: they say the process
        # lives (triage uses them), not that the rank makes progress, so they count neither as new data nor
        # for staleness
        for record in _records(data["heartbeats"]):
            self._heartbeats[record["rank"]] = record
        if len(data["events"]):
            self._events.append(data["events"])
            changed = True
        self._skipped.extend(data["skipped"])
        if data["ranks"] != self._ranks:
            self._ranks = list(data["ranks"])
            changed = True
        if data.get("nccl_logs", {}) != self._nccl_logs:
            self._nccl_logs = dict(data["nccl_logs"])
            changed = True
        if changed:
            self._last_new_rows_s = time.time()
        return changed

    def _note_records(self, name: str, new: pd.DataFrame) -> None:
        """Newest instant each rank wrote (on its own clock), from the rows just read."""
        instant = _record_instant_us(name, new)
        if instant is None:
            return
        newest = instant.groupby(new["rank"].to_numpy()).max()
        for rank, t_us in newest.items():
            self._last_record_us[int(rank)] = max(self._last_record_us.get(int(rank), 0), int(t_us))

    def _trace(self) -> Trace:
        for name, parts in self._pending.items():  # appended once per publication, not once per poll
            old = self._tables.get(name)
            self._tables[name] = _concat([old, *parts] if old is not None and len(old) else parts)
        self._pending.clear()
        events = pd.concat(self._events, ignore_index=True) if self._events else pd.DataFrame()
        data = {
            **self._tables,
            "manifests": list(self._manifests.values()),
            "heartbeats": pd.DataFrame(list(self._heartbeats.values())),
            "events": events,
            "skipped": list(self._skipped),
            "ranks": list(self._ranks),
            "nccl_logs": dict(self._nccl_logs),
        }
        if isinstance(self._reader, AnalysedColumnsReader):  # it left columns out: those that held a value
            data["left_out_values"] = frozenset(self._reader.left_out_values)
        return assemble_trace(self.trace_dir, data)

    # -- publishing ---------------------------------------------------------------------------------------
    def _publish(self) -> None:
        started = time.monotonic()
        self._dirty = False
        cache, cached = self._report_cache() if self.partitioned else (None, None)
        trace = self._trace()
        if self.partitioned and self.snapshot.trace is None and len(trace.steps) and cached is None:
            self._publish_before_analysis(trace)
        snap = Snapshot(version=0, trace_dir=self.trace_dir, trace=trace, loaded_at_s=time.time())
        snap.last_new_rows_s = self._last_new_rows_s
        snap.rank_states = rank_states(trace, self._last_record_us, self.stale_after_s)
        snap.run_state = run_state(snap.rank_states, self._last_new_rows_s, self.stale_after_s)
        try:
            snap.report, snap.times = self._analyse(trace, cache, cached)
            if self.partitioned and snap.report is not None:
                snap.report_source = "cache" if cached is not None else "computed"
                # the memory and telemetry views read every rank's files again (a minute at 16,384 ranks):
                # the report and every other page first, the Memory and GPU telemetry pages right after
                snap.views_pending = True
            if snap.report is None:
                snap.analysis_error = "no steps recorded yet (steps.csv is empty or missing in every rank directory)"
        except Exception as exc:  # a trace the analyses cannot handle must not take the dashboard down
            snap.analysis_error = f"analysis failed: {exc!r}"
            traceback.print_exc()
        snap.triage, snap.triage_note = self._triage_result
        if self.prepare is not None:
            self.prepare(snap)
        with self._lock:
            snap.version = self.snapshot.version + 1
            self.snapshot = snap
        if snap.views_pending:
            self._publish_views(trace)
        took_s = time.monotonic() - started
        self._next_publish_s = time.monotonic() + (2 * took_s if took_s > 1.0 else 0.0)
        self._maybe_triage()

    def _publish_views(self, trace: Trace) -> None:
        """Many ranks: the memory and telemetry views, read rank by rank after the report was published, in a
        new version of the current snapshot (the same data and memo: the pages that did not need them are not
        aggregated again)."""
        try:
            memory, telemetry = rank_table_views(trace)
        except Exception as exc:  # the other pages stay; these two say why they cannot be drawn
            traceback.print_exc()
            memory, telemetry = None, None
            note = f"memory and telemetry could not be read: {exc!r}"
        else:
            note = None
        self._replace(memory_view=memory, telemetry_view=telemetry, views_pending=False, views_error=note)
        if self.prepare is not None:
            self.prepare(self.snapshot)

    def _publish_before_analysis(self, trace: Trace) -> None:
        """Many ranks, first load: publish what the per-step tables alone say before the collectives, memory and
        telemetry are reduced (minutes at 16,384 ranks): rank states, the rank groups and pickers, and the
        preliminary report (``preliminary_report``: stragglers, MFU, the timeline and health from the steps, with
        the waits the ranks measured themselves). The pages that need the collectives, memory or telemetry say
        they are being computed; the full report replaces this one when it is done."""
        snap = Snapshot(version=0, trace_dir=self.trace_dir, trace=trace, loaded_at_s=time.time())
        snap.last_new_rows_s = self._last_new_rows_s
        snap.rank_states = rank_states(trace, self._last_record_us, self.stale_after_s)
        snap.run_state = run_state(snap.rank_states, self._last_new_rows_s, self.stale_after_s)
        snap.analysing = True
        snap.analysis_error = (
            f"the collectives, memory and telemetry of {len(trace.ranks_found):,} ranks are being reduced rank by "
            f"rank (started {time.strftime('%H:%M:%S')}); the full report replaces this one when it is done"
        )
        try:
            snap.report, snap.times = preliminary_report(trace)
            snap.report_source = PRELIMINARY
        except Exception:  # the full analysis may still succeed: publish the ranks without a report meanwhile
            traceback.print_exc()
        snap.triage, snap.triage_note = self._triage_result
        if self.prepare is not None:
            self.prepare(snap)
        with self._lock:
            snap.version = self.snapshot.version + 1
            self.snapshot = snap

    def _analyse(self, trace: Trace, cache=None, cached=None):
        """(report, per rank-step times of every step). Few ranks: the collectives are loaded, and the times of
        every step come from them (all_step_times). Many ranks: ``partitioned_report``."""
        from diag.analysis.report import all_step_times, analyze

        if not len(trace.steps):
            return None, None
        if not self.partitioned:
            times = all_step_times(trace)
            return analyze(trace), compact_times(times.frame) if times is not None else None
        return partitioned_report(trace, cache, cached, self.workers)

    def _report_cache(self):
        """(the trace directory's cache, the report cached there for the files as they are now, or None).

        The cache's key is the signature of every rank file (name, size, mtime), taken here, after the last
        read; the tables held are those files only if nothing was appended since that read, so the reader
        polls once more: rows found mean the tables are newer than the key, and the cache is neither read nor
        written for this publication (the rows are kept for it). ``partitioned_report`` writes the computed
        report only if the signature is still the same after the analysis (the files did not change under it).
        Never raises: a cache that cannot be used is no cache."""
        from diag.analysis.report_cache import open_cache, report_from_state

        if not self.use_cache:
            return None, None
        try:
            cache = open_cache(self.trace_dir, no_cache=False)
            if cache is None or self._absorb(self._reader.poll()):
                return None, None
            state = cache.get_result(report_cache_name())
        except (TraceError, OSError):
            return None, None
        return cache, report_from_state(state, self.trace_dir) if state is not None else None

    def _publish_states_only(self) -> None:
        """No new rows: the data stays, but ranks may have become stale and the run quiet."""
        snap = self.snapshot
        if snap.trace is None:
            return
        states = rank_states(snap.trace, self._last_record_us, self.stale_after_s)
        state = run_state(states, self._last_new_rows_s, self.stale_after_s)
        if state != snap.run_state or not states["state"].equals(snap.rank_states["state"]):
            self._replace(rank_states=states, run_state=state)

    def _publish_error(self, message: str) -> None:
        if self.snapshot.error != message:
            with self._lock:
                self.snapshot = Snapshot(
                    self.snapshot.version + 1, self.trace_dir, error=message, loaded_at_s=time.time(), run_state="error"
                )

    def _replace(self, **changes) -> None:
        """Publish a copy of the current snapshot with ``changes`` and a new version. The data is the same, so
        the memo of aggregations is shared."""
        with self._lock:
            current = self.snapshot
            self.snapshot = dataclasses.replace(current, version=current.version + 1, **changes)

    def _maybe_triage(self) -> None:
        """The triage verdict, from the triage package. It reads the whole directory itself, so it runs on
        its own thread, at most every ``TRIAGE_MIN_INTERVAL_S``."""
        busy = self._triage_thread is not None and self._triage_thread.is_alive()
        if not self.triage_enabled or busy or time.time() - self._triage_at_s < TRIAGE_MIN_INTERVAL_S:
            return
        self._triage_at_s = time.time()
        self._triage_thread = threading.Thread(target=self._triage, name="diag-dashboard-triage", daemon=True)
        self._triage_thread.start()

    def _triage(self) -> None:
        self._triage_result = run_triage(self.trace_dir)
        verdict, note = self._triage_result
        self._replace(triage=verdict, triage_note=note)

    def wait_for_triage(self, timeout_s: float = 60.0) -> None:
        if self._triage_thread is not None:
            self._triage_thread.join(timeout_s)

    # -- background thread --------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            if self.snapshot.version == 0:  # nothing read yet: its workers are forked here, before the poll thread
                self._fork_first_readers()
            self._thread = threading.Thread(target=self._run, name="diag-dashboard-poll", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stops polling, and waits (a while) for the poll and triage threads to end their reads: a read cut off
        by the interpreter's exit can abort the process from inside pyarrow."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.wait_for_triage(timeout_s=10)
        if self._first_workers is not None and not (self._thread is not None and self._thread.is_alive()):
            self._first_workers.close()  # stopped before the first read used them
            self._first_workers = None

    def _run(self) -> None:
        if self.snapshot.version == 0:  # never read (diag dashboard on many ranks serves before the first load)
            self._refresh_quietly()
        while not self._stop.wait(self.poll_interval_s):
            if not self._refresh_quietly():
                return

    def _refresh_quietly(self) -> bool:
        """One refresh on the poll thread; False when the process is exiting."""
        try:
            self.refresh()
        except Exception:  # keep polling: a bad read now may be a good one later
            if not process_exiting():
                traceback.print_exc()
        return not process_exiting()


def process_exiting() -> bool:
    """Whether the interpreter is exiting, when the thread pools a poll reads with refuse work: from the start of
    threading's shutdown, which runs the pools' exit hooks before it stops the main thread (and the pools' idle
    threads then shut down a pool the poll is still submitting to, so the error does not always say "interpreter
    shutdown")."""
    return getattr(threading, "_SHUTTING_DOWN", False) or not threading.main_thread().is_alive()


def report_cache_name() -> str:
    """The name `diag analyze` caches its report under with its default options (no --steps, --peak-tflops,
    --flops-per-step): what the dashboard analyses."""
    from diag.analysis.report_cache import result_name

    return result_name("report", None, None, None)


PRELIMINARY = "preliminary"  # Snapshot.report_source of a report from the per-step tables alone


def preliminary_report(trace: Trace):
    """(report, per rank-step times) of a many-rank trace from its per-step tables alone, in seconds where the
    full report takes minutes: ``analyze`` with no collectives reduced and no memory or telemetry read, every
    step's times split with the waits the ranks measured themselves (steps' comm_wait_us), as with a cached
    report. Its stragglers, MFU, timeline and health are the steps'; its communication, memory and telemetry
    sections are empty until the full report (``partitioned_report``) replaces it: the pages say so. A straggler's
    cause and cost may change then (a throttled GPU reads as compute; waits matched per collective are not the
    ranks' own)."""
    from diag.analysis.report import analyze

    return analyze(trace, reduce_collectives=lambda window: None), own_wait_times(trace)


def own_wait_times(trace: Trace) -> pd.DataFrame:
    """Every rank-step's times (compact_times), split with the waits the ranks measured themselves (steps'
    comm_wait_us): what the pages draw when the collectives were not reduced (a preliminary or cached report)."""
    from diag.analysis.report import _pipeline_stages
    from diag.analysis.stragglers import rank_step_times

    return compact_times(rank_step_times(trace.steps, None, _pipeline_stages(trace)).frame)


def partitioned_report(trace: Trace, cache=None, cached=None, workers: int | None = None):
    """(report, per rank-step times) of a many-rank trace, as `diag analyze` makes it.

    ``cached``: the report `diag analyze` (or an earlier server) cached for these files: used as it is, and every
    step's times are split with the waits the ranks measured themselves (steps' comm_wait_us), the collectives
    not being read at all. Else the collectives are reduced rank by rank ONCE, for the report's window, with the
    engine as `diag analyze` runs them (worker processes when ``diag.processes.worker_count`` says so,
    which beside a server's threads is only with ``workers`` given) and each rank's memory and telemetry analysed
    by the analysis engine in the same workers (one pool, forked for both); the report is then cached under
    ``cache``'s key when the files are still the ones that key names. The times of every step are split with
    the reduced waits; a step outside the window (warm-up, a step not every rank finished yet, a failed one)
    has only the wait its rank measured itself."""
    from diag.analysis.report import _pipeline_stages, analyze
    from diag.analysis.stragglers import rank_step_times
    from diag.trace.cache import signature

    if cached is not None:
        return cached, own_wait_times(trace)
    count = worker_count(len(trace.ranks_found), workers)
    reduced = []
    with Workers(count) as workers:  # one pool for the memory, telemetry and collectives passes
        tables = rank_tables_runner(trace, workers)
        reducer = collectives_reducer(trace, workers)

        def reduce_once(window):
            reduced.append(reducer(window))
            return reduced[-1]

        report = analyze(trace, reduce_collectives=reduce_once, run_ranks=tables)
    if cache is not None:
        try:
            if signature(cache.path) == cache.key:  # the files the report was made from: cache it, as diag analyze
                cache.put_result(report_cache_name(), report.to_state(), create=True)
        except OSError:
            pass  # a cache that cannot be written is no cache
    waits = reduced[-1] if reduced else None
    times = rank_step_times(trace.steps, waits.per_rank_step if waits is not None else None, _pipeline_stages(trace))
    return report, compact_times(times.frame)


def _records(frame: pd.DataFrame) -> list[dict]:
    """Rows as dicts without the NaNs a frame of differing JSON files fills in (NaN != NaN would make
    every poll look like a change)."""
    if frame.empty:
        return []
    out = []
    for record in frame.to_dict("records"):
        clean = {k: v for k, v in record.items() if not (isinstance(v, float) and np.isnan(v))}
        clean["rank"] = int(clean["rank"])
        out.append(clean)
    return out


def _concat(parts: list[pd.DataFrame]) -> pd.DataFrame:
    """Rows of ``parts`` in order, keeping category columns categorical (concat of different categories
    gives object)."""
    if len(parts) == 1:
        return parts[0]
    out = pd.concat(parts, ignore_index=True)
    for column in parts[-1].columns:
        if isinstance(parts[-1][column].dtype, pd.CategoricalDtype) and not isinstance(
            out[column].dtype, pd.CategoricalDtype
        ):
            out[column] = out[column].astype("category")
    return out


# The per rank-step times the pages draw (figures, pages.py): the split of a step, and the whole iteration for
# the throughput and a rank's line. The frame rank_step_times gives also has data_wait_us, duration_us and peers,
# which no page reads: 12 bytes a rank-step less (~0.2 GB at 16,384 ranks x 1,000 steps).
TIMES_COLUMNS = ("rank", "step", "compute_us", "wait_us", "busy_us", "iteration_us")


def compact_times(frame: pd.DataFrame) -> pd.DataFrame:
    """The per rank-step times as the figures need them (TIMES_COLUMNS): rank and step as int32, durations as
    float32 (half the memory of float64: 16 M rank-steps at 16,384 ranks x 1,000 steps; float32 keeps 7 digits,
    plenty for a figure in ms)."""
    out = {}
    for column in TIMES_COLUMNS:
        values = frame[column]
        if column in ("rank", "step"):
            out[column] = values.to_numpy(dtype="int32")
        else:
            out[column] = values.to_numpy(dtype="float32", na_value=np.nan)
    return pd.DataFrame(out)


# Columns the pages draw beyond what the analyses read (partitioned.ANALYSED_COLUMNS): the step's components,
# for the Compare page (diag.analysis.compare.summarize_run). Above 64 ranks the server does not hold them
# (16,384 ranks x 1,000 steps: 0.26-0.5 GB): with_step_components reads them when the Compare page needs them.
VIEW_EXTRA_COLUMNS = {"steps": ("device_us", "forward_us", "backward_us", "optimizer_us")}


def view_columns() -> dict[str, tuple[str, ...]]:
    return {
        name: (*keep, *(c for c in VIEW_EXTRA_COLUMNS.get(name, ()) if c not in keep))
        for name, keep in ANALYSED_COLUMNS.items()
    }


class ViewColumnsReader(AnalysedColumnsReader):
    """The loader's incremental reader with each rank's per-step tables cut, as soon as they are read, to the
    columns the analyses and the pages use, and whole microsecond counts that fit kept as int32
    (partitioned.AnalysedColumnsReader, with the Compare page's few extra columns)."""

    def kept_columns(self) -> dict[str, tuple[str, ...]]:
        return view_columns()


def with_step_components(trace: Trace) -> Trace:
    """``trace`` with a steps table that has the step's components (forward, backward, optimizer, device time),
    which the server does not hold above 64 ranks: the steps of every rank read again, a rank at a time, narrow
    (ViewColumnsReader), and assembled as the loader does (one run, its latest restart). For the Compare page's
    summary only; nothing keeps it. Rows appended since the snapshot's read are there too: the summary selects
    the report's window."""
    if all(c in trace.steps for c in VIEW_EXTRA_COLUMNS["steps"]):
        return trace
    data = ViewColumnsReader(trace.path, tables=("steps",)).poll()
    for name in TABLES:
        if name != "steps":
            data[name] = empty_table(TABLES[name])
    steps = assemble_trace(trace.path, data).steps
    del data
    release_arrow_memory()
    return dataclasses.replace(trace, steps=steps)


MEMORY_VIEW_COLUMNS = ("allocated_bytes", "rss_bytes", "reserved_bytes", "ooms")
TELEMETRY_VIEW_COLUMNS = ("util_pct", "sm_clock_mhz", "power_w", "temp_c")


def rank_table_views(trace: Trace) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Memory and telemetry of every rank, read a batch of ranks at a time (the loader's per-rank read, an
    earlier run's rows cut: engine.read_shard) and kept only as the pages draw them: the memory
    readings a step's band and a rank's line need, and telemetry_frame's columns, as float32 (~16 bytes a
    reading instead of ~100 as loaded). 16,384 ranks x 1,000 steps: ~0.3 GB for memory, ~0.1 GB for telemetry."""
    from concurrent.futures import ThreadPoolExecutor

    from diag.trace.loader import READ_THREADS

    tasks = rank_sources(trace)
    batches = [tasks[i : i + BATCH_RANKS] for i in range(0, len(tasks), BATCH_RANKS)]
    offsets = {int(r): float(o) for r, o in trace.clock_offsets_us().items()}
    with ThreadPoolExecutor(max_workers=READ_THREADS) as pool:
        parts = list(pool.map(lambda batch: _batch_views(batch, offsets), batches))
    memory = pd.concat([m for m, _ in parts], ignore_index=True) if parts else pd.DataFrame()
    telemetry = pd.concat([t for _, t in parts], ignore_index=True) if parts else pd.DataFrame()
    del parts
    release_arrow_memory()  # the batches' parse buffers and whole frames: nothing reuses them
    release_heap_memory()
    if len(telemetry):  # seconds since the first sample, as telemetry_frame gives them
        aligned = telemetry.pop("aligned_us").to_numpy()
        telemetry["t_s"] = ((aligned - aligned.min()) / 1e6).astype("float32")
    return memory, telemetry


def _batch_views(tasks: list, offsets: dict[int, float]) -> tuple[pd.DataFrame, pd.DataFrame]:
    from diag.analysis.telemetry import throttled_samples

    columns = {name: analysed_columns()[name] for name in RANK_TABLES}
    shard, _ = read_shard(tasks, columns)  # what it skipped, the report's load already said
    mem, tel = shard.table("memory"), shard.table("telemetry")
    memory = pd.DataFrame({"rank": mem["rank"].to_numpy(dtype="int32"), "step": mem["step"].to_numpy(dtype="int32")})
    for column in MEMORY_VIEW_COLUMNS:
        memory[column] = mem[column].to_numpy(dtype="float32", na_value=np.nan)
    telemetry = pd.DataFrame(
        {"rank": tel["rank"].to_numpy(dtype="int32"), "gpu": tel["gpu"].to_numpy(dtype="int32", na_value=-1)}
    )
    for column in TELEMETRY_VIEW_COLUMNS:
        telemetry[column] = tel[column].to_numpy(dtype="float32", na_value=np.nan)
    shift = tel["rank"].map(offsets).fillna(0.0).to_numpy(dtype="float64")
    telemetry["aligned_us"] = tel["time_us"].to_numpy(dtype="float64", na_value=np.nan) - shift
    telemetry["throttled"] = throttled_samples(tel["throttle_reasons"]).astype("float32")
    return memory, telemetry


def one_rank_table(trace_dir: Path, rank: int, name: str) -> pd.DataFrame:
    """One rank's whole table, read on demand from its own files only (drill-down at thousands of ranks)."""
    from diag.trace.loader import to_frame

    reader = TraceReader(trace_dir, tables=(name,))
    rank_dir = reader.rank_dirs().get(rank)
    if rank_dir is None:
        return empty_table(TABLES[name])
    tables = reader.read_rank(rank, rank_dir).tables
    return to_frame([tables[name]] if name in tables else [], TABLES[name], rank_column=True)


def _record_instant_us(name: str, frame: pd.DataFrame) -> pd.Series | None:
    if name in ("steps", "phases", "microbatches"):
        return frame["start_us"].astype("int64") + frame["duration_us"].astype("int64")
    if name == "collectives":
        return frame["start_us"].astype("int64")
    if "time_us" in frame:
        return frame["time_us"].astype("int64")
    return None


def run_triage(trace_dir: Path) -> tuple[dict | None, str | None]:
    try:
        from diag.triage.analysis import triage
        from diag.triage.sources import read_input
    except ImportError as exc:
        return None, f"no triage data: the triage package is not available ({exc})"
    try:
        return triage(read_input(trace_dir)).to_json(), None
    except Exception as exc:
        return None, f"no triage data: triage could not read this trace ({exc})"


# -- pure functions of a trace ------------------------------------------------------------------------------
def rank_states(trace: Trace, last_record_us: dict[int, int], stale_after_s: float) -> pd.DataFrame:
    """Per rank: finished (manifest says so), no data, stale (its newest record is ``stale_after_s`` older
    than the freshest rank's, on rank 0's clock), or live."""
    ranks = sorted(set(trace.ranks_found) | set(trace.ranks_missing))
    offsets = _manifest_values(trace, "clock_offset_us", ranks)
    finished = _manifest_values(trace, "finished", ranks)
    last = pd.Series({r: last_record_us.get(r, np.nan) for r in ranks}, dtype="float64")
    aligned = last - offsets.fillna(0).astype("float64")
    newest = aligned.max() if aligned.notna().any() else np.nan
    behind_s = (newest - aligned) / 1e6
    states = []
    for rank in ranks:
        if finished.get(rank) is True:
            states.append(FINISHED)
        elif pd.isna(aligned[rank]):
            states.append(NO_DATA)
        elif behind_s[rank] > stale_after_s:
            states.append(STALE)
        else:
            states.append(LIVE)
    return pd.DataFrame(
        {"rank": ranks, "state": states, "last_record_us": last.to_numpy(), "behind_s": behind_s.to_numpy()}
    )


def run_state(states: pd.DataFrame, last_new_rows_s: float | None, stale_after_s: float) -> str:
    if len(states) and (states["state"] == FINISHED).all():
        return "finished"
    if last_new_rows_s is not None and time.time() - last_new_rows_s > stale_after_s:
        return "quiet"  # nothing appended for a while and not every rank finished: ended badly, or hung
    return "running"


def _manifest_values(trace: Trace, name: str, ranks: list[int]) -> pd.Series:
    """A manifest field of each rank (None where a rank has no manifest)."""
    values = [getattr(trace.manifests[r], name) if r in trace.manifests else None for r in ranks]
    return pd.Series(values, index=ranks, dtype="object")


# -- aggregation for figures --------------------------------------------------------------------------------
@dataclass
class Matrix:
    """A rank x step matrix reduced to at most ``max_rows`` rank groups and ``max_cols`` step windows."""

    values: np.ndarray  # rows x cols, NaN where nothing was recorded
    argmax_rank: np.ndarray  # rows x cols: the rank holding each cell's value (for clicks)
    row_first_rank: np.ndarray
    row_last_rank: np.ndarray
    col_first_step: np.ndarray
    col_last_step: np.ndarray


def bin_edges(values: np.ndarray, max_bins: int) -> np.ndarray:
    """Bin index of each sorted unique value: contiguous groups of equal width, at most ``max_bins``."""
    width = max(1, int(np.ceil(len(values) / max_bins)))
    return np.arange(len(values)) // width


def unique_index(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sorted distinct values, position of each value among them): np.unique's return_inverse, in one linear
    pass for the small non-negative integers that ranks and steps are (np.unique sorts: ~1 s per 16 M rows)."""
    values = np.asarray(values)
    if not len(values):
        return values, np.zeros(0, dtype="int64")
    lo, hi = int(values.min()), int(values.max())
    if values.dtype.kind not in "iu" or hi - lo > 4 * len(values) + 1024:
        return np.unique(values, return_inverse=True)
    present = np.zeros(hi - lo + 1, dtype=bool)
    present[values - lo] = True
    position = np.cumsum(present) - 1
    return np.flatnonzero(present) + lo, position[values - lo]


def per_rank_matrix(frame: pd.DataFrame, column: str) -> tuple[np.ndarray, np.ndarray]:
    """(ranks, ranks x steps float64 matrix of ``column``, NaN where a rank has no such step)."""
    ranks, rank_at = unique_index(frame["rank"].to_numpy())
    steps, step_at = unique_index(frame["step"].to_numpy())
    dense = np.full((len(ranks), len(steps)), np.nan)
    dense[rank_at, step_at] = frame[column].to_numpy(dtype="float64", na_value=np.nan)
    return ranks, dense


def rank_step_matrix(frame: pd.DataFrame, column: str, max_rows: int = 256, max_cols: int = 250) -> Matrix:
    """Max of ``column`` per (rank group, step window): max, so one slow rank stays visible in its group.

    The rows are placed in a dense ranks x steps float32 matrix (64 MB at 16,384 x 1,000) cut into equal
    blocks, each reduced with one vectorised argmax: no sort of the 16 M rank-steps (the sort took 0.7 s per
    matrix at 1,024 ranks, ~12 s at 16,384). A (rank, step) given twice keeps its last row."""
    ranks, rank_at = unique_index(frame["rank"].to_numpy())
    steps, step_at = unique_index(frame["step"].to_numpy())
    row_of_rank = bin_edges(ranks, max_rows)
    col_of_step = bin_edges(steps, max_cols)
    n_rows, n_cols = int(row_of_rank[-1]) + 1, int(col_of_step[-1]) + 1
    rows_per_block = max(1, int(np.ceil(len(ranks) / max_rows)))
    cols_per_block = max(1, int(np.ceil(len(steps) / max_cols)))
    dense = np.full((n_rows * rows_per_block, n_cols * cols_per_block), -np.inf, dtype="float32")
    values = frame[column].to_numpy(dtype="float32", na_value=np.nan)
    values = np.where(np.isnan(values), -np.inf, values)  # never the max of a block; a block of only these is NaN
    dense[rank_at, step_at] = values
    blocks = dense.reshape(n_rows, rows_per_block, n_cols, cols_per_block).transpose(0, 2, 1, 3)
    blocks = blocks.reshape(n_rows, n_cols, rows_per_block * cols_per_block)
    at = blocks.argmax(axis=2)  # first of equal maxima: the lowest rank, then the earliest step
    top = np.take_along_axis(blocks, at[..., None], axis=2)[..., 0].astype("float64")
    rank_index = np.arange(n_rows)[:, None] * rows_per_block + at // cols_per_block
    who = np.append(ranks, -1)[np.minimum(rank_index, len(ranks))].astype("int32")  # int32: half the payload
    empty = np.isneginf(top)
    return Matrix(
        values=np.where(empty, np.nan, top),
        argmax_rank=np.where(empty, -1, who).astype("int32"),
        row_first_rank=_group_bounds(ranks, row_of_rank, np.min),
        row_last_rank=_group_bounds(ranks, row_of_rank, np.max),
        col_first_step=_group_bounds(steps, col_of_step, np.min),
        col_last_step=_group_bounds(steps, col_of_step, np.max),
    )


def _group_bounds(values: np.ndarray, groups: np.ndarray, how) -> np.ndarray:
    return np.array([how(values[groups == g]) for g in range(int(groups[-1]) + 1)]) if len(values) else np.zeros(0)


def per_rank_quantiles(frame: pd.DataFrame, column: str) -> pd.DataFrame:
    """rank, p5, p50, p95 of ``column`` over the rank's steps (a rank's distribution in three numbers)."""
    if frame.empty:
        return pd.DataFrame(columns=["rank", "p5", "p50", "p95"])
    ranks, dense = per_rank_matrix(frame, column)  # a sort per rank's row, not pandas' grouped sort of all rows
    quantile = np.quantile if not np.isnan(dense).any() else np.nanquantile
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a rank without a value: NaN, as pandas gives
        p5, p50, p95 = quantile(dense, [0.05, 0.5, 0.95], axis=1)
    return pd.DataFrame({"rank": ranks, "p5": p5, "p50": p50, "p95": p95})


def fleet_band(frame: pd.DataFrame, x: str, column: str, max_points: int = 500) -> pd.DataFrame:
    """Per value of ``x`` (a step, a time), or per window of them beyond ``max_points``: the min, median and
    max of ``column`` over all ranks' rows, at the window's mean ``x``."""
    values = frame[[x, column]].dropna()
    if values.empty:
        return pd.DataFrame(columns=["x", "min", "median", "max"])
    xs = values[x].to_numpy(dtype="float64")
    unique = np.unique(xs)
    if len(unique) <= max_points:
        bins = np.searchsorted(unique, xs)
    else:
        edges = np.linspace(unique[0], unique[-1], max_points + 1)
        bins = np.clip(np.searchsorted(edges, xs, side="right") - 1, 0, max_points - 1)
    g = values[column].astype("float64").groupby(bins)
    out = pd.DataFrame({"x": pd.Series(xs).groupby(bins).mean(), "min": g.min(), "median": g.median(), "max": g.max()})
    return out.reset_index(drop=True)


def downsample(frame: pd.DataFrame, max_points: int = 1000) -> pd.DataFrame:
    """Every k-th row so at most ``max_points`` remain (for per-step series that are already aggregated)."""
    if len(frame) <= max_points:
        return frame
    return frame.iloc[:: int(np.ceil(len(frame) / max_points))]


def one_rank(frame: pd.DataFrame, rank: int | None, max_points: int = 1000) -> pd.DataFrame:
    if rank is None or frame.empty:
        return frame.iloc[0:0]
    return downsample(frame[frame["rank"] == rank], max_points)


def pipeline_degree(trace: Trace | None) -> int:
    """Pipeline-parallel degree from the manifests' layout (1 when not pipelined or unknown)."""
    if trace is None:
        return 1
    pipeline, parallel = trace.first_manifest_value("pipeline"), trace.first_manifest_value("parallel")
    return (pipeline and pipeline.stages) or (parallel and parallel.pp) or 1


def telemetry_frame(trace: Trace) -> pd.DataFrame:
    """Telemetry with ``t_s`` (seconds since the first sample, on rank 0's clock) and ``throttled`` (1 when a
    reason that slows a busy GPU was set: the telemetry analysis's ``throttled_samples``)."""
    from diag.analysis.telemetry import throttled_samples

    tel = trace.telemetry
    if tel.empty:
        return tel.assign(t_s=pd.Series(dtype="float64"), throttled=pd.Series(dtype="float64"))
    offsets = _manifest_values(trace, "clock_offset_us", sorted(tel["rank"].unique())).fillna(0).astype("float64")
    aligned = tel["time_us"].to_numpy(dtype="float64") - offsets.reindex(tel["rank"]).to_numpy()
    out = tel[["rank", "gpu", "util_pct", "sm_clock_mhz", "power_w", "temp_c"]].astype(
        {c: "float64" for c in ("util_pct", "sm_clock_mhz", "power_w", "temp_c")}
    )
    return out.assign(
        t_s=(aligned - aligned.min()) / 1e6, throttled=throttled_samples(tel["throttle_reasons"]).astype("float64")
    )


# -- rank groups: drill-down at thousands of ranks --------------------------------------------------------------
MAX_RANK_GROUPS = 256  # a group picker longer than this is no help; beyond, ranks go in contiguous blocks


@dataclass(frozen=True)
class RankGroup:
    label: str
    ranks: tuple[int, ...]

    @property
    def key(self) -> int:
        return self.ranks[0]  # the picker's value: its first rank (stable while ranks are added)


def rank_groups(trace: Trace, max_groups: int = MAX_RANK_GROUPS) -> list[RankGroup]:
    """The run's ranks in groups to pick from before picking a rank: one per node (the manifests' host) when
    every rank names its host and there are 2 to ``max_groups`` nodes, else contiguous blocks of ranks, at most
    ``max_groups`` of them."""
    ranks = sorted(set(trace.ranks_found) | set(trace.ranks_missing))
    hosts = {r: m.host for r, m in trace.manifests.items() if m.host}
    if ranks and all(r in hosts for r in ranks):
        by_host: dict[str, list[int]] = {}
        for rank in ranks:
            by_host.setdefault(hosts[rank], []).append(rank)
        if 1 < len(by_host) <= max_groups:
            groups = sorted(by_host.items(), key=lambda item: item[1][0])
            return [RankGroup(f"{host}: {_span_text(members)}", tuple(members)) for host, members in groups]
    width = max(1, int(np.ceil(len(ranks) / max_groups)))
    blocks = [ranks[i : i + width] for i in range(0, len(ranks), width)]
    return [RankGroup(_span_text(block), tuple(block)) for block in blocks]


def _span_text(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    contiguous = ranks[-1] - ranks[0] + 1 == len(ranks)
    return f"ranks {ranks[0]}-{ranks[-1]}" if contiguous else f"{len(ranks)} ranks from {ranks[0]}"


def median_busy_ms(times: pd.DataFrame | None) -> dict[int, float]:
    """Each rank's median busy time per step (compute and data wait, not waiting for peers; ms): what tells a
    slow rank in a synchronous job, for the pickers' labels."""
    if times is None or times.empty or "busy_us" not in times:
        return {}
    return (times.groupby("rank")["busy_us"].median() / 1000).to_dict()


def group_options(snap: Snapshot) -> list[dict]:
    """The group picker's options: each group with its slowest rank's median busy time."""
    if snap.trace is None:
        return []
    busy = snap.memo("median_busy_ms", lambda: median_busy_ms(snap.times))
    options = []
    for group in snap.memo("rank_groups", lambda: rank_groups(snap.trace)):
        worst = max((busy[r] for r in group.ranks if r in busy), default=None)
        suffix = f" (slowest {worst:.1f} ms busy/step)" if worst is not None else ""
        options.append({"label": group.label + suffix, "value": group.key})
    return options


def rank_options(snap: Snapshot, group_key: int | None) -> list[dict]:
    """The rank picker's options: the ranks of the group picked (``group_key``: its first rank), slowest
    first, each with its median busy time and state."""
    if snap.trace is None or group_key is None:
        return []
    group = next((g for g in snap.memo("rank_groups", lambda: rank_groups(snap.trace)) if g.key == group_key), None)
    if group is None:
        return []
    busy = snap.memo("median_busy_ms", lambda: median_busy_ms(snap.times))
    states = {}
    if snap.rank_states is not None:
        states = dict(zip(snap.rank_states["rank"].tolist(), snap.rank_states["state"].tolist(), strict=False))
    ordered = sorted(group.ranks, key=lambda r: (-busy.get(r, -1.0), r))
    options = []
    for rank in ordered:
        time_text = f", {busy[rank]:.1f} ms busy/step" if rank in busy else ""
        options.append({"label": f"rank {rank}{time_text}, {states.get(rank, NO_DATA)}", "value": rank})
    return options
