"""A benchmark's results table: each row is printed as a markdown row when it is added (the script's output stays
readable as it runs) and kept, so that ``save`` can write it as JSON with what it was measured on.

    table = Table("rows", ["table", "columns", "added (us)"])
    table.add("steps", 11, f"{added_us:.3f}")
    table.note(f"per training step: {per_step_us:.2f} us added")   # a line under the table
    table.save(args.json)                                          # when the script was given --json PATH

The saved file holds the command as it would be typed from the repository root (``--json`` left out: it only
says where to write), the machine (CPU model, CPU count, memory, torch version, platform; not the host name),
the UTC date, the git revision of the checkout, the load average when this module was imported (the script's
start) and when the table was saved, the columns, rows and notes. ``benchmarks/suite.py tables`` renders it
into docs/benchmarks.md with ``render``.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# taken at import, among the scripts' first imports: the load the benchmark started under
_LOAD_AT_START = os.getloadavg()


class Table:
    def __init__(self, name: str, columns: list[str]):
        self.name, self.columns = name, list(columns)
        self.rows: list[list[str]] = []
        self.notes: list[str] = []

    def add(self, *cells) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"{self.name}: {len(cells)} cells for {len(self.columns)} columns")
        if not self.rows:
            print("\n".join(_header(self.columns)))
        row = [str(cell) for cell in cells]
        self.rows.append(row)
        print(_markdown_row(row))

    def note(self, line: str) -> None:
        """A line that belongs with the table (a figure derived from its rows, a count, a check's outcome)."""
        self.notes.append(line)
        print(f"\n{line}" if self.rows and len(self.notes) == 1 else line)

    def save(self, path: str | Path | None) -> None:
        """Write the table and its context to ``path`` as JSON; nothing when ``path`` is None (no --json)."""
        if path is None:
            return
        result = {
            "name": self.name,
            "command": documented_command(sys.argv),
            "argv": list(sys.argv),
            "machine": machine(),
            "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
            "git_revision": git_revision(),
            "load_average_before": [round(x, 2) for x in _LOAD_AT_START],
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
            "columns": self.columns,
            "rows": self.rows,
            "notes": self.notes,
        }
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1) + "\n")


def add_json_option(parser) -> None:
    parser.add_argument("--json", metavar="PATH", help="also save the table and its context as JSON to PATH")


def load(path: str | Path) -> dict:
    return json.loads(Path(path).read_text())


def documented_command(argv: list[str]) -> str:
    """``argv`` as typed from the repository root, ``python3 benchmarks/<script>.py ...``, without ``--json``."""
    args, skip_next = [], False
    for arg in argv[1:]:
        if skip_next:
            skip_next = False
        elif arg == "--json":
            skip_next = True
        elif not arg.startswith("--json="):
            args.append(arg)
    return shlex.join(["python3", f"benchmarks/{Path(argv[0]).name}", *args])


def machine() -> dict:
    return {
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "memory_total_gib": round(_memory_total_bytes() / 2**30, 1),
        "torch": _torch_version(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_total_bytes() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _torch_version() -> str | None:
    """From the installed package's metadata: importing torch only to name its version would cost seconds."""
    if "torch" in sys.modules:
        return sys.modules["torch"].__version__
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def git_revision() -> str | None:
    """The checkout's short revision, with ``+`` when diag/ or benchmarks/ (results aside) differ from it."""
    try:
        revision = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                  text=True, timeout=10, check=True).stdout.strip()  # fmt: skip
        changed = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "diag", "benchmarks",
                                  ":(exclude)benchmarks/results"], cwd=REPO, timeout=10).returncode  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return revision + ("+" if changed else "")


def render(result: dict) -> str:
    """The markdown docs/benchmarks.md shows for a saved result: the table, its notes, then one line with the
    command, the machine, the date, the revision and the load average (1 minute) it ran under."""
    lines = _header(result["columns"]) + [_markdown_row(row) for row in result["rows"]]
    for note in result["notes"]:
        lines += ["", _wrapped(note)]
    m = result["machine"]
    machine_text = f"{m['cpu_model']}, {m['cpu_count']} CPUs, {m['memory_total_gib']:g} GiB, torch {m['torch']}"
    revision = f", git {result['git_revision']}" if result.get("git_revision") else ""
    before, after = result["load_average_before"][0], result["load_average_after"][0]
    provenance = (
        f"*`{result['command']}` on {machine_text}; {result['date_utc']} UTC{revision}; "
        f"load average {before:.2f} before, {after:.2f} after.*"
    )
    return "\n".join(lines + ["", _wrapped(provenance)])


def _header(columns: list[str]) -> list[str]:
    return [_markdown_row(columns), f"|{'---|' * len(columns)}"]


def _markdown_row(cells: list[str]) -> str:
    """Cells as given (a ``|`` in one escaped, so that it does not end the cell)."""
    escaped = [cell.replace("|", r"\|") for cell in cells]
    return f"| {' | '.join(escaped)} |"


def _wrapped(paragraph: str) -> str:
    """At the docs' 120 columns; markdown joins the lines again (inside a code span too)."""
    return textwrap.fill(paragraph, width=120, break_long_words=False, break_on_hyphens=False)
