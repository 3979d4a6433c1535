"""``pip install diag`` is the analysis alone: every analysis command runs with torch, dash, plotly and waitress
absent, and a part whose extra is missing (capture, the dashboard, the HTML reports) says which to install.

The packages are made absent in a fresh interpreter (``sys.modules[name] = None``: an import of them raises
ImportError, as on a machine without them) rather than in a second virtual environment, which would need the
package index to install diag's remaining dependencies."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SAMPLES = REPO / "sample_traces"
OPTIONAL = ("torch", "dash", "plotly", "waitress", "flask", "pynvml")


def _without(missing: tuple[str, ...], code: str, tmp_path: Path) -> subprocess.CompletedProcess:
    block = "".join(f"sys.modules[{name!r}] = None; " for name in missing)
    return subprocess.run(
        [sys.executable, "-c", f"import sys; {block}{code}"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )


def _diag_without(missing: tuple[str, ...], tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return _without(missing, f"sys.argv = ['diag', *{list(args)!r}]; from diag.cli import main; main()", tmp_path)


@pytest.mark.parametrize(
    "args",
    [
        ("analyze", str(SAMPLES / "straggler"), "--no-cache", "--fail-on", "never"),
        ("analyze", str(SAMPLES / "pipeline"), "--no-cache", "--format", "json", "--fail-on", "never"),
        ("triage", str(SAMPLES / "hang")),
        ("compare", str(SAMPLES / "straggler"), str(SAMPLES / "straggler")),
        ("export", str(SAMPLES / "straggler"), "--perfetto", "out.json"),
        ("samples",),
    ],
    ids=["analyze", "analyze-json", "triage", "compare", "export", "samples"],
)
def test_the_analysis_commands_run_without_the_optional_packages(args, tmp_path):
    result = _diag_without(OPTIONAL, tmp_path, *args)
    assert result.returncode in (0, 1), result.stderr[-3000:]  # 1: a problem found (triage's hang sample)
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "args, missing",
    [
        (("analyze", str(SAMPLES / "straggler"), "--no-cache", "--html", "r.html"), ("plotly",)),
        (("compare", str(SAMPLES / "straggler"), str(SAMPLES / "straggler"), "--format", "html"), ("plotly",)),
        (("dashboard", str(SAMPLES / "straggler")), ("dash",)),
        (("dashboard", str(SAMPLES / "straggler")), ("waitress",)),
        (("demo", "traces/demo"), ("torch",)),
    ],
    ids=["analyze-html", "compare-html", "dashboard-dash", "dashboard-waitress", "demo"],
)
def test_a_part_without_its_extra_says_what_to_install(args, missing, tmp_path):
    result = _diag_without(missing, tmp_path, *args)
    assert result.returncode == 2, result.stderr[-3000:]  # an input the user can act on, not a problem found
    assert "Traceback" not in result.stderr
    extra = "capture" if missing == ("torch",) else "dashboard"
    assert f"pip install 'diag[{extra}]'" in result.stderr
    assert missing[0] in result.stderr.split("pip install")[0]  # names what is missing
    assert not (tmp_path / "r.html").exists() and not (tmp_path / "traces").exists()


def test_capture_without_torch_warns_once_and_the_loop_runs(tmp_path):
    code = (
        "import warnings; warnings.simplefilter('always'); import diag\n"
        "print(type(diag.init('trace')).__name__)\n"
        "for _ in range(3):\n"
        "    with diag.step():\n"
        "        pass\n"
        "diag.finish(); print('trained')"
    )
    result = _without(("torch",), code, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["DisabledSession", "trained"]
    assert result.stderr.count("pip install 'diag[capture]'") == 1
