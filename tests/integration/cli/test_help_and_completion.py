"""What docs/cli.md promises of the command line besides exit codes: shell completion through click (the
subcommands, which the lazy group lists without importing them, and their options), and help that never
imports torch or dash and points to pages `diag docs` can print."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

DIAG_AS_INSTALLED = "from diag.cli import main; main(prog_name='diag')"  # the `diag` script's name


def _complete(words: str, env_extra: dict | None = None) -> list[str]:
    parts = words.split(" ")
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "_DIAG_COMPLETE": "bash_complete",
        "COMP_WORDS": words,
        "COMP_CWORD": str(len(parts) - 1),
    }
    out = subprocess.run([sys.executable, "-c", DIAG_AS_INSTALLED], capture_output=True, text=True, env=env, cwd=REPO)
    assert out.returncode == 0, out.stderr
    return [line.split(",", 1)[1] for line in out.stdout.splitlines() if "," in line]


def test_bash_completion_script_is_what_docs_cli_md_sources():
    env = {**os.environ, "PYTHONPATH": str(REPO), "_DIAG_COMPLETE": "bash_source"}
    out = subprocess.run([sys.executable, "-c", DIAG_AS_INSTALLED], capture_output=True, text=True, env=env)
    assert "complete -o nosort -F _diag_completion diag" in out.stdout
    assert "_DIAG_COMPLETE=bash_source diag" in (REPO / "docs" / "cli.md").read_text()


def test_subcommands_and_options_complete():
    assert set(_complete("diag ")) >= {"analyze", "compare", "triage", "export", "dashboard", "samples", "docs"}
    assert _complete("diag tri") == ["triage"]
    assert "--fail-on" in _complete("diag analyze --fa")
    assert _complete("diag analyze --fail-on ") == ["high", "medium", "low", "never"]


@pytest.mark.parametrize("command", ["analyze", "compare", "triage", "export", "dashboard", "samples", "docs"])
def test_help_imports_neither_torch_nor_dash(command):
    code = (
        "import sys; from click.testing import CliRunner; from diag.cli import main; "
        f"r = CliRunner().invoke(main, [{command!r}, '--help']); assert r.exit_code == 0, r.output; "
        "print(sorted(m for m in ('torch', 'dash', 'waitress', 'tqdm') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
