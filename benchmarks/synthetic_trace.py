"""The synthetic trace the benchmarks that analyse one read: written once into its directory, then reused."""

from __future__ import annotations

import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def generate_if_missing(trace_dir: str | Path, ranks: int | None, steps: int = 1000) -> None:
    """A synthetic format-2 trace of ``ranks`` ranks x ``steps`` steps in ``trace_dir`` unless it holds one
    already (its ``planted.json``); nothing when ``ranks`` is None."""
    if ranks is None or (Path(trace_dir) / "planted.json").exists():
        return
    sys.path.insert(0, str(REPO))
    from diag.testing.synthetic import generate

    started = time.perf_counter()
    generate(trace_dir, ranks, steps, trace_format=2)
    print(f"generated {ranks} ranks x {steps} steps in {time.perf_counter() - started:.0f} s", flush=True)
