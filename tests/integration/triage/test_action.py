"""What `diag triage` says to do next (diag/triage/action.py): fix the code, restart, or evict, with the hosts
and GPUs concerned. End to end on the bundled hang and in the fault sample (tests/faults: each triage fault's
expected action); here each rule on verdicts built around it."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO


def test_the_bundled_hang_says_what_to_do_in_text_and_json():
    hang = str(REPO / "sample_traces" / "hang")
    run = [sys.executable, "-m", "diag", "triage", hang]
    verdict = json.loads(subprocess.run([*run, "--format", "json"], capture_output=True, text=True).stdout)
    assert (verdict["action"], verdict["hosts"], verdict["gpus"]) == ("fix_code", ["vm"], [])
    assert "data loader" in verdict["action_why"]
    text = subprocess.run(run, capture_output=True, text=True).stdout
    assert "next: FIX THE CODE (host vm): a rank waited for its data loader" in text
