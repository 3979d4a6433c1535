"""docs/triage.md tells a user what each source triage reads adds, in one table, so that they know what to
save beside a trace: diag's own, Flight Recorder's dumps, PyTorch's debug server (dumped and asked now) and
NCCL RAS."""

from tests.conftest import REPO

SOURCES = (
    "diag's trace",
    "Flight Recorder dumps",
    "debug server, its periodic dumps",
    "debug server, asked now",
    "NCCL RAS",
)


def _section(page: str, heading: str) -> str:
    start = page.index(f"## {heading}\n")
    end = page.find("\n## ", start + 1)
    return page[start : end if end != -1 else None]


def test_triage_doc_says_what_each_source_adds():
    table = _section((REPO / "docs" / "triage.md").read_text(), "What each source adds")
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| source")]
    for source in SOURCES:
        (row,) = [r for r in rows if source in r.split("|")[1]]
        what_it_adds = row.split("|")[3].strip()
        assert len(what_it_adds) > 60, (source, what_it_adds)
