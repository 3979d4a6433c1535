"""The bubble report is part of ``diag analyze``: JSON ``bubble`` key, a finding, text and HTML sections."""

import json

from click.testing import CliRunner

from diag.commands.analyze import command as analyze_command
from tests.conftest import REPO

SAMPLE = REPO / "sample_traces" / "pipeline"  # real 4-rank 1F1B run, stage 2 made twice as slow


def run_analyze(*args: str) -> str:
    result = CliRunner().invoke(analyze_command, [str(SAMPLE), "--no-cache", "--fail-on", "never", *args])
    assert result.exit_code == 0, result.output
    return result.output


def test_json_has_the_bubble_and_a_finding_naming_the_slow_stage():
    report = json.loads(run_analyze("--format", "json"))
    bubble = report["bubble"]
    assert bubble["schedule"] == "Schedule1F1B" and bubble["stages"] == 4 and bubble["microbatches"] == 8
    assert bubble["slowest_stage"] == 2 and bubble["measured_fraction"] > bubble["theoretical_fraction"]
    finding = next(f for f in report["findings"] if f["kind"] == "pipeline_bubble")
    assert finding["ranks"] == [2] and "rebalanc" in finding["advice"].lower()


def test_text_and_html_show_the_bubble(tmp_path):
    text = run_analyze()
    assert "Pipeline bubbles" in text and "slowest stage 2" in text
    run_analyze("--html", str(tmp_path / "report.html"))
    html = (tmp_path / "report.html").read_text()
    assert "Pipeline timeline" in html and "Pipeline bubbles" in html


def test_runs_without_pipeline_have_a_null_bubble():
    result = CliRunner().invoke(
        analyze_command,
        [str(REPO / "sample_traces" / "straggler"), "--no-cache", "--format", "json", "--fail-on", "never"],
    )
    assert result.exit_code == 0 and json.loads(result.output)["bubble"] is None
