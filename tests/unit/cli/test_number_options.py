"""Number options other than intervals (peaks, FLOPs, thresholds, GPU sizes) refuse nan and inf as usage errors
(exit status 2) before anything is read: nan passes every range bound, so a peak of nan TFLOP/s reached the MFU
formula as a traceback, and one of inf read as 0% MFU."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from diag.cli import main
from tests.reliability.corpus import SAMPLE

COMMANDS = {
    "--peak-tflops": ["analyze", str(SAMPLE), "--no-cache"],
    "--flops-per-step": ["analyze", str(SAMPLE), "--no-cache"],
    "--threshold-pct": ["compare", str(SAMPLE), str(SAMPLE), "--no-cache"],
    "--run-noise-pct": ["compare", str(SAMPLE), str(SAMPLE), "--no-cache"],
    "--gpu-gib": ["memory-plan", "--params", "7e9", "--gpus", "8"],
    "--overhead-gib": ["memory-plan", "--params", "7e9", "--gpus", "8"],
}


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
@pytest.mark.parametrize("option", sorted(COMMANDS))
def test_number_options_refuse_values_that_are_not_finite(option, value):
    result = CliRunner().invoke(main, [*COMMANDS[option], option, value])
    assert result.exit_code == 2, (option, value, result.output, result.exception)
    assert "is not a finite number" in result.output or "is not in the range" in result.output, result.output
    assert "Traceback" not in result.output


def test_a_finite_number_is_still_taken():
    result = CliRunner().invoke(main, [*COMMANDS["--gpu-gib"], "--gpu-gib", "80"])
    assert result.exit_code == 0, result.output
