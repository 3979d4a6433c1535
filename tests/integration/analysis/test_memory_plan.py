"""`diag memory-plan`'s formulas against the published worked examples (the ZeRO paper's 16 bytes per parameter
and its Table 1 / Figure 1 for a 7.5B model, Korthikanti et al.'s Table 2 for GPT-3 175B) and against a measured
run (the real H100 DDP run in the shared fixtures), its layout search, and the command."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO


def test_memory_plan_never_imports_torch():
    code = (
        "import sys; from click.testing import CliRunner; from diag.cli import main; "
        "r = CliRunner().invoke(main, ['memory-plan', '--params', '7e9', '--gpu-gib', '80']); "
        "assert r.exit_code == 0, r.output; print('torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env={**os.environ}, check=True
    )
    assert out.stdout.strip() == "False"
