"""Read the periodic dumps of PyTorch's debug server (``torch.distributed.debug.start_debug_server``) for triage.

What torch 2.13 writes (``torch/distributed/debug/_frontend.py``, ``PeriodicDumper``; ``_debug_handlers.py``):
rank 0's frontend process, every ``dump_interval`` seconds, asks every rank's worker server for each enabled
handler's data and writes one text file per handler and round into ``dump_dir``, for all ranks together:
``<handler>_<YYYYmmdd_HHMMSS>.txt`` (local time, one-second resolution: a later round in the same second
overwrites the file). The default handlers are ``stacks``, ``fr_trace`` and ``torchcomms_health_check``.

``stacks_<time>.txt``, plain text::

    PARTIAL DATA: 2/3 workers responded          <- only when a worker failed, then one line per failed rank:
      Rank 2: TimeoutError: ...                  <- status 408 timeout, 503 connection error, 404 no handler
                                                 <- (blank line)
    === Rank 0: http://host:port/handler/dump_traceback? ===
    <faulthandler.dump_traceback of every thread of the rank, "most recent call first">
    === Rank 2: http://host:port/handler/dump_traceback? ===
    Error: 408                                   <- a rank that did not answer

The thread that answered the request has ``<no Python frame>``; the main thread is the one whose outermost
frame is ``<module>``.

``fr_trace_<time>.txt`` is not a Flight Recorder dump: it is torch's own analysis of every rank's dump
(``flight_recorder.components.builder.build_db``) rendered as plain-text tables (groups, memberships,
collectives, NCCL calls). On gloo jobs torch 2.13 never writes it: ``build_db`` raises ``KeyError: ('0', 0)``
on gloo's unnamed default group, which the dumper logs and skips. Triage does not parse those tables: the
collective a rank waits in is taken from its stack instead, and the dump's file name is said in a note.

From the latest complete stacks dump (every rank answered; else the latest, with the ranks that did not answer
treated as ranks without a dump) each rank's main thread becomes the stack of its ``RankInfo.last_dump``, and
each rank whose main thread is inside a c10d collective becomes a pending row of that collective. The dumps
carry no sequence numbers: ranks inside the same collective (op and group object unknown) are taken to be in
one instance, ``stack:<op>`` at seq 0, whose members are all ranks. Only text is read: nothing executes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from diag.trace.loader import Skipped, TraceError, read_file_bytes
from diag.trace.records import HangDump
from diag.trace.schema import MAX_RANK
from diag.triage import sources
from diag.triage.flight_recorder import is_library_file

STACKS_RE = re.compile(r"^stacks_(\d{8}_\d{6})\.txt$")
FR_TRACE_RE = re.compile(r"^fr_trace_(\d{8}_\d{6})\.txt$")
RANK_HEADER_RE = re.compile(r"^=== Rank (\d+): (.*) ===$")
PARTIAL_RE = re.compile(r"^PARTIAL DATA: (\d+)/(\d+) workers responded$")
THREAD_RE = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+) \(most recent call first\):$")
FRAME_RE = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')
MAX_STACKS_BYTES = 64 << 20  # a dump of 16k ranks' stacks is tens of MB
MAX_FILES_TRIED = 50  # the newest stacks dumps looked at for a complete one
# c10d's collectives as their functions are named in distributed_c10d.py (a rank inside one waits in it)
COLLECTIVES = frozenset(
    {
        "all_reduce",
        "all_gather",
        "all_gather_into_tensor",
        "all_gather_object",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "all_to_all",
        "all_to_all_single",
        "broadcast",
        "broadcast_object_list",
        "reduce",
        "gather",
        "scatter",
        "barrier",
        "monitored_barrier",
        "send",
        "recv",
        "batch_isend_irecv",
    }
)


@dataclass
class StacksDump:
    """One ``stacks_<time>.txt``: each answering rank's threads (frames innermost last), and who did not answer."""

    path: Path
    world_size: int
    threads: dict[int, list[dict]] = field(default_factory=dict)  # rank -> [{name, ident, main, frames}]
    failed: dict[int, str] = field(default_factory=dict)  # rank -> why it gave no stacks

    @property
    def complete(self) -> bool:
        return not self.failed and len(self.threads) == self.world_size


def is_dump_dir(path: Path) -> bool:
    """A directory the debug server's periodic dumper wrote into (it holds a stacks or fr_trace dump)."""
    try:
        return path.is_dir() and any(STACKS_RE.match(p.name) or FR_TRACE_RE.match(p.name) for p in path.iterdir())
    except OSError:
        return False


def parse_stacks(path: Path) -> StacksDump:
    """Parse one stacks dump. Raises ValueError when the file is not one."""
    text = read_file_bytes(path, max_bytes=MAX_STACKS_BYTES).decode("utf-8", "replace")
    sections: dict[int, list[str]] = {}
    failed: dict[int, str] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        header = RANK_HEADER_RE.match(line)
        if header:
            rank = int(header.group(1))
            if rank > MAX_RANK:
                raise ValueError(f"rank {rank} is above {MAX_RANK}: not a real job's")
            current = sections.setdefault(rank, [])
            continue
        if current is None:
            failure = re.match(r"^\s+Rank (\d+): (.*)$", line)
            if failure and int(failure.group(1)) <= MAX_RANK:
                failed[int(failure.group(1))] = failure.group(2)[:300]
            continue
        current.append(line)
    if not sections:
        raise ValueError("no '=== Rank N: ... ===' section: not a debug server stacks dump")
    threads = {}
    for rank, lines in sections.items():
        if lines and lines[0].startswith("Error: "):
            failed.setdefault(rank, f"HTTP {lines[0][len('Error: ') :].strip()}")
            continue
        parsed = _threads(lines)
        if parsed:
            threads[rank] = parsed
            failed.pop(rank, None)
        else:
            failed.setdefault(rank, "no Python stack in its answer")
    return StacksDump(path, max(sections) + 1, threads, failed)


def _threads(lines: list[str]) -> list[dict]:
    """faulthandler's text as HangDump threads: frames innermost last, the main thread marked."""
    threads: list[dict] = []
    for line in lines:
        head = THREAD_RE.match(line)
        if head:
            threads.append({"name": head.group(1), "ident": head.group(2), "main": False, "frames": []})
            continue
        frame = FRAME_RE.match(line)
        if frame and threads:
            threads[-1]["frames"].insert(
                0, {"file": frame.group(1), "line": int(frame.group(2)), "name": frame.group(3)}
            )
    threads = [t for t in threads if t["frames"]]
    main = next((t for t in threads if t["frames"][0]["name"] == "<module>"), threads[0] if threads else None)
    if main is not None:
        main["main"] = True
    return threads


def read_debug_server_dir(path: Path) -> sources.TriageInput:
    """A TriageInput from the latest complete stacks dump in ``path``. Raises TraceError when none is readable."""
    skipped: list[Skipped] = []
    names = sorted((m.group(1), p) for p in path.iterdir() if (m := STACKS_RE.match(p.name)))
    chosen: StacksDump | None = None
    latest: StacksDump | None = None
    for _, file in reversed(names[-MAX_FILES_TRIED:]):
        try:
            dump = parse_stacks(file)
        except (OSError, ValueError) as exc:
            skipped.append(Skipped(str(file), str(exc)))
            continue
        latest = latest or dump
        if dump.complete:
            chosen = dump
            break
    fr_tables = sorted(p.name for p in path.iterdir() if FR_TRACE_RE.match(p.name))
    if latest is None:
        reasons = "; ".join(str(s) for s in skipped[:3]) or "no stacks_<time>.txt in it"
        raise TraceError(f"{path}: no readable stacks dump of PyTorch's debug server: {reasons}")
    dump = chosen or latest
    notes = [_which_note(dump, latest, len(names))]
    if dump.failed:
        lost = ", ".join(f"rank {r}: {why}" for r, why in sorted(dump.failed.items())[:8])
        notes.append(f"ranks that did not answer the debug server, judged as ranks without a dump ({lost})")
    if fr_tables:
        notes.append(
            f"{fr_tables[-1]} (and {len(fr_tables) - 1} older) holds torch's table rendering of its own Flight "
            "Recorder analysis, not the dumps: not read (point triage at Flight Recorder dumps for sequence numbers)"
        )
    notes.append(
        "from stacks alone: a collective is known by the function a rank waits in, not its group and sequence "
        "number; ranks inside the same collective are taken to wait for each other"
    )
    return _triage_input(path, dump, skipped, notes)


def _which_note(dump: StacksDump, latest: StacksDump, count: int) -> str:
    if dump is latest:
        return f"judged from the latest debug server stacks dump, {dump.path.name} (of {count})"
    return (
        f"judged from {dump.path.name}, the latest complete stacks dump of {count}; the later {latest.path.name} "
        f"lacks ranks {sorted(latest.failed) or sorted(set(range(latest.world_size)) - set(latest.threads))}"
    )


def _triage_input(path: Path, dump: StacksDump, skipped: list[Skipped], notes: list[str]) -> sources.TriageInput:
    ranks, rows = {}, []
    for rank in range(dump.world_size):
        threads = dump.threads.get(rank)
        if not threads:
            ranks[rank] = sources.RankInfo(rank, has_data=False)
            continue
        record = HangDump(rank=rank, reason=f"debug server stacks dump {dump.path.name}", threads=tuple(threads))
        ranks[rank] = sources.RankInfo(rank, last_dump=record, dumps=1)
        frames = record.main_frames()
        op = _collective_waited_in(frames)
        if op is not None:
            site = _user_site(frames)
            rows.append((rank, f"stack:{op}", 0, op, 0, "", "", False, float("nan"), -1, site, "debug_server", ""))
    ops = pd.DataFrame(rows, columns=sources.OPS_COLUMNS)
    groups = {pg: list(range(dump.world_size)) for pg in ops["pg"].unique()}
    groups.setdefault("0", list(range(dump.world_size)))
    return sources.TriageInput(path, "debug_server", dump.world_size, ops, ranks, groups, skipped, None, notes)


def _collective_waited_in(frames: list[dict]) -> str | None:
    """The c10d collective the main thread is inside (frames innermost last), None when it is in none."""
    for frame in reversed(frames):
        if str(frame.get("file", "")).endswith("distributed_c10d.py") and frame.get("name") in COLLECTIVES:
            return str(frame["name"])
    return None


def _user_site(frames: list[dict]) -> str:
    for frame in reversed(frames):
        if not is_library_file(str(frame.get("file", ""))):
            return f"{frame.get('file')}:{frame.get('line')} in {frame.get('name')}"
    return ""
