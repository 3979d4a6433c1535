"""The frameworks stay optional: diag never imports them, and a missing one is an ImportError naming the
extra to install."""

import subprocess
import sys


def test_importing_diag_imports_no_framework():
    code = (
        "import sys, diag, diag.integrations; "
        "print(sorted(m for m in ('lightning', 'pytorch_lightning', 'transformers', 'accelerate') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
