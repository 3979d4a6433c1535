"""Reading ``memory_deep.json``, the deep memory mode's side file (keys: ``schema.MEMORY_DEEP_KEYS``).

Plain JSON through the loader's size- and depth-limited reader: nothing in a trace directory is ever executed
(capture converts torch's snapshot to JSON before writing; it never writes a pickle). The values are checked
field by field by ``diag.analysis.memory_deep``; here a file is kept only when it is a JSON object of this
format, else skipped with its reason.
"""

from __future__ import annotations

from pathlib import Path

from diag.trace.schema import MEMORY_DEEP_FILE, MEMORY_DEEP_FORMAT, rank_dir_name

MAX_MEMORY_DEEP_BYTES = 4 << 20  # diag writes tens of KB: top stacks and modules only


def read_memory_deep(trace_dir: Path, ranks: list[int], skipped: list) -> dict[int, dict]:
    """rank -> the parsed memory_deep.json of each rank directory that has one."""
    from diag.trace.loader import Skipped, load_json_limited

    out = {}
    for rank in ranks:
        path = Path(trace_dir) / rank_dir_name(rank) / MEMORY_DEEP_FILE
        try:  # no exists() first: in a directory at mode 000 it raises PermissionError
            value = load_json_limited(path, max_bytes=MAX_MEMORY_DEEP_BYTES)
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as exc:
            skipped.append(Skipped(str(path), f"unreadable: {exc}"))
            continue
        if not isinstance(value, dict) or value.get("format") != MEMORY_DEEP_FORMAT:
            skipped.append(Skipped(str(path), f"not a {MEMORY_DEEP_FORMAT} object: not read"))
            continue
        out[rank] = value
    return out
