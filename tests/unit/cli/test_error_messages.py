"""An error message may quote a file (a JSON parser shows the bytes around the place it gave up): printed by
any command, it carries no terminal escape, only its printable spelling."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from diag.cli import main

ESCAPES = "\x1b]0;pwned\x07\x1b]52;c;ZXZpbA==\x07\x1b[2J"


@pytest.mark.parametrize("command", [["analyze", "--no-cache"], ["compare", "--no-cache"]])
def test_an_error_quoting_a_file_prints_no_terminal_escape(tmp_path, command):
    # a Kineto trace the parser refuses inside a string holding escapes: its message quotes them
    (tmp_path / "rank0.pt.trace.json").write_text('{"traceEvents": [{"ph": "X", "name": "' + ESCAPES + '", "cat": 1}')
    runs = [str(tmp_path)] * (2 if command[0] == "compare" else 1)
    result = CliRunner().invoke(main, [command[0], *runs, *command[1:]])
    assert result.exit_code == 2, (result.output, result.exception)
    assert "corrupt or truncated JSON" in result.output
    assert "\x1b" not in result.output and "\x07" not in result.output, repr(result.output)
    assert "\\x1b]0;pwned\\x07" in result.output  # said, as its escape
