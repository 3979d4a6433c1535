"""Ask a running job's PyTorch debug server for every rank's state now, instead of waiting for its next dump.

The debug server's frontend (``torch.distributed.debug.start_debug_server``, on rank 0's host, port 25999 by
default) answers ``GET /stacks`` with every rank's Python stacks and ``GET /fr_trace_json`` with every rank's
Flight Recorder dump as JSON, each fetched from the ranks' worker servers when asked, rendered into one HTML
page: per rank an ``<h2>Rank N: WORKER_URL</h2>`` heading, then the answer in a ``<pre>`` block, or ``<p>Failed to
fetch: status=S</p>`` before it. Torch renders the answers without escaping them, so a stack's ``<module>`` is
in the page as it is: the blocks are cut out by their markers, never parsed as HTML.

``pull`` writes what it fetched into a directory, in the formats triage already reads: the stacks as the
periodic dumper's ``stacks_<YYYYmmdd_HHMMSS>.txt`` (so ``diag triage DIR`` judges it as a dump of the debug
server, ``debug_server.py``), each rank's Flight Recorder JSON as ``flight_recorder/rank_<N>`` (``diag triage
DIR/flight_recorder`` for sequence numbers). ``profile`` runs torch.profiler for a few seconds on the ranks
chosen, through their worker servers' ``torch_profile`` handler, and saves each Chrome trace.

Only http and https URLs are fetched, with a timeout; what comes back is text, written as text, and read by
triage's own parsers (nothing executes). The debug server itself has no authentication: torch says to run it
only on a trusted network.
"""

from __future__ import annotations

import html
import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from diag.trace.schema import MAX_RANK

PULL_TIMEOUT_S = 60.0  # the frontend waits up to its fetch_timeout (60 s by default) for each worker
MAX_PAGE_BYTES = 256 << 20  # every rank's stacks or Flight Recorder JSON of a large job in one page
FLIGHT_RECORDER_DIR = "flight_recorder"
RANK_BLOCK_RE = re.compile(r"<h2>Rank (\d+): (.*?)</h2>")
FAILED_RE = re.compile(r"^\s*<p>Failed to fetch: status=(\d+)</p>")
PRE_RE = re.compile(r"<pre>(.*)</pre>", re.DOTALL)
WORKER_HANDLER_RE = re.compile(r"^(https?://[^/?#\s]+)/handler/")


class PullError(Exception):
    """The debug server could not be asked, or its answer is not what it renders."""


@dataclass
class RankAnswer:
    rank: int
    worker_url: str  # the rank's worker server, http://host:port
    text: str | None  # its answer; None when it did not answer
    status: int = 200


@dataclass
class Pulled:
    directory: Path
    stacks_file: Path
    answered: list[int] = field(default_factory=list)
    failed: dict[int, int] = field(default_factory=dict)  # rank -> HTTP status of the worker's answer
    flight_recorder: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def said(self) -> list[str]:
        """What was saved where, and which ranks did not answer: for the user, a line each."""
        lines = [f"pulled the stacks of {len(self.answered)} ranks into {self.stacks_file}"]
        if self.failed:
            lines.append(f"ranks that did not answer: {', '.join(map(str, sorted(self.failed)))}")
        if self.flight_recorder:
            lines.append(
                f"{len(self.flight_recorder)} Flight Recorder dumps in {self.directory / FLIGHT_RECORDER_DIR} "
                "(diag triage that directory for sequence numbers)"
            )
        return lines + self.notes


def frontend_url(url: str) -> str:
    """The frontend's base URL, checked: http or https, a host, no query. Raises PullError."""
    parsed = urllib.parse.urlsplit(url.strip())
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise PullError(f"{url!r} is not an http:// or https:// URL of the debug server (e.g. http://node0:25999)")
    if parsed.query or parsed.fragment:
        raise PullError(f"{url!r}: give the debug server's address only, without a query")
    return f"{parsed.scheme}://{parsed.netloc}{parsed.path.rstrip('/')}"


def rank_answers(page: str) -> list[RankAnswer]:
    """Each rank's block of a page the frontend rendered (raw or JSON answers). Raises PullError when the page
    has none."""
    headings = list(RANK_BLOCK_RE.finditer(page))
    if not headings:
        raise PullError("the page has no 'Rank N: ...' blocks: not the debug server's answer (a proxy's page?)")
    answers = []
    for i, heading in enumerate(headings):
        rank = int(heading.group(1))
        if rank > MAX_RANK:
            raise PullError(f"rank {rank} is above {MAX_RANK}: not a real job's")
        end = headings[i + 1].start() if i + 1 < len(headings) else len(page)
        block = page[heading.end() : end]
        worker = WORKER_HANDLER_RE.match(html.unescape(heading.group(2)).strip())
        failed = FAILED_RE.match(block)
        body = PRE_RE.search(block)
        text = html.unescape(body.group(1)) if body else None
        status = int(failed.group(1)) if failed else 200
        answers.append(RankAnswer(rank, worker.group(1) if worker else "", None if failed else text, status))
    return answers


def stacks_text(answers: list[RankAnswer]) -> str:
    """The answers as the periodic dumper writes ``stacks_<time>.txt`` (debug_server.parse_stacks reads it)."""
    failed = [a for a in answers if a.text is None]
    parts = []
    if failed:
        parts.append(f"PARTIAL DATA: {len(answers) - len(failed)}/{len(answers)} workers responded")
        parts += [f"  Rank {a.rank}: HTTP {a.status}" for a in failed]
        parts.append("")
    for answer in answers:
        parts.append(f"=== Rank {answer.rank}: {answer.worker_url}/handler/dump_traceback? ===")
        parts.append(answer.text if answer.text is not None else f"Error: {answer.status}")
    return "\n".join(parts) + "\n"


def pull(url: str, directory: str | Path, timeout_s: float = PULL_TIMEOUT_S, flight_recorder: bool = True) -> Pulled:
    """Every rank's stacks (and Flight Recorder dumps) from the debug server at ``url``, now, into
    ``directory`` (made if missing). Raises PullError when the stacks cannot be had."""
    base = frontend_url(url)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    answers = rank_answers(_get(f"{base}/stacks", timeout_s))
    stacks_file = _new_stacks_file(directory)
    stacks_file.write_text(stacks_text(answers))
    pulled = Pulled(directory, stacks_file, [a.rank for a in answers if a.text is not None])
    pulled.failed = {a.rank: a.status for a in answers if a.text is None}
    if flight_recorder:
        try:
            pulled.flight_recorder = _save_flight_recorder(base, directory / FLIGHT_RECORDER_DIR, timeout_s)
        except PullError as exc:  # the stacks are the verdict's; the dumps add sequence numbers when they come
            pulled.notes.append(f"no Flight Recorder dumps: {exc}")
    return pulled


def profile(
    url: str, ranks: list[int], duration_s: float, directory: str | Path, timeout_s: float = PULL_TIMEOUT_S
) -> dict[int, Path | str]:
    """torch.profiler for ``duration_s`` on each of ``ranks`` at once, through their worker servers (found in
    the frontend's stacks page): rank -> its Chrome trace file in ``directory``, or why there is none."""
    answers = {a.rank: a for a in rank_answers(_get(f"{frontend_url(url)}/stacks", timeout_s))}
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d_%H%M%S")

    def one(rank: int) -> Path | str:
        worker = answers.get(rank)
        if worker is None or not worker.worker_url:
            return f"rank {rank} is not among the debug server's workers"
        try:
            # a worker's handlers answer POST only, as the frontend asks them
            trace = _fetch(
                f"{worker.worker_url}/handler/torch_profile?duration={duration_s:g}", timeout_s + duration_s, "POST"
            )
            json.loads(trace)  # a Chrome trace is JSON: anything else is an error page
        except (PullError, ValueError) as exc:
            return f"no profile: {exc}"[:300]
        path = directory / f"profile_rank{rank}_{stamp}.json"
        path.write_text(trace)
        return path

    with ThreadPoolExecutor(max_workers=min(32, max(1, len(ranks)))) as pool:
        return dict(zip(ranks, pool.map(one, ranks), strict=True))


def _save_flight_recorder(base: str, directory: Path, timeout_s: float) -> list[Path]:
    answers = rank_answers(_get(f"{base}/fr_trace_json", timeout_s))
    directory.mkdir(parents=True, exist_ok=True)
    saved = []
    for answer in answers:
        if answer.text is None:
            continue
        path = directory / f"rank_{answer.rank}"
        path.write_text(answer.text)
        saved.append(path)
    return saved


def _new_stacks_file(directory: Path) -> Path:
    """``stacks_<time>.txt`` at the current second, or the next free second: a pull never overwrites one."""
    now = time.time()
    for offset in range(3600):
        path = directory / f"stacks_{time.strftime('%Y%m%d_%H%M%S', time.localtime(now + offset))}.txt"
        if not path.exists():
            return path
    raise PullError(f"{directory} holds a stacks dump for every second of the next hour")


def _get(url: str, timeout_s: float) -> str:
    return _fetch(url, timeout_s, "GET")


def _fetch(url: str, timeout_s: float, method: str) -> str:
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):  # a worker URL from the page: never file://
        raise PullError(f"refused to fetch {url!r}: not http or https")
    data = b"" if method == "POST" else None
    request = urllib.request.Request(url, data=data, headers={"User-Agent": "diag"}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310 - scheme checked above
            data = response.read(MAX_PAGE_BYTES + 1)
    except urllib.error.HTTPError as exc:
        raise PullError(f"{url}: HTTP {exc.code}") from exc
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise PullError(f"{url}: {getattr(exc, 'reason', exc)}") from exc
    if len(data) > MAX_PAGE_BYTES:
        raise PullError(f"{url}: more than {MAX_PAGE_BYTES >> 20} MB")
    return data.decode("utf-8", "replace")
