"""Make ``sample_traces/hang/``: a real 3-rank gloo job on CPU where rank 1's data loader blocks forever before
step 3. Ranks 0 and 2 wait in the step's first gradient all_reduce until the 8 s process-group timeout ends
them; rank 1's watchdog dumps its stack after 2 s without progress, and it is then sent SIGTERM, as a
launcher does to the survivors of a failed job. The job is ``tests/triage/hang_job.py`` (scenario
``loader``); Flight Recorder is on (TORCH_FR_BUFFER_SIZE=2000), so each rank directory also holds
``fr_dump.pkl``.

    python sample_traces/make_hang_sample.py          # about 20 s
    diag triage sample_traces/hang
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from tests.triage.jobs import run_scenario  # noqa: E402 - the repository root must be on the path first


def main() -> None:
    target = HERE / "hang"
    with tempfile.TemporaryDirectory() as tmp:
        trace = run_scenario("loader", Path(tmp))
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(trace, target)
    for empty in target.glob("rank*/fatal_stacks.txt"):  # faulthandler's file, empty when no fatal signal
        if empty.stat().st_size == 0:
            empty.unlink()
    report = subprocess.run([sys.executable, "-m", "diag", "triage", str(target)], capture_output=True, text=True)
    (HERE / "hang.triage.txt").write_text(report.stdout)
    print(report.stdout)


if __name__ == "__main__":
    main()
