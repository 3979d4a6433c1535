"""`diag samples` lists and copies the sample runs, `diag docs` prints the pages the help points to (here from
the checkout; tests/integration/packaging/test_plain_install.py checks the same from a wheel)."""

from __future__ import annotations

from click.testing import CliRunner

from diag.cli import main
from tests.conftest import REPO

SAMPLE_NAMES = sorted(p.name for p in (REPO / "sample_traces").iterdir() if p.is_dir())


def test_samples_lists_every_run_with_the_command_that_shows_it():
    result = CliRunner().invoke(main, ["samples"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert [line.split()[0] for line in lines] == SAMPLE_NAMES
    assert SAMPLE_NAMES == ["hang", "pipeline", "straggler", "straggler-h100", "straggler-h200"]
    hang = next(line for line in lines if line.startswith("hang "))
    assert f"diag triage {REPO / 'sample_traces' / 'hang'}" in hang


def test_a_copied_sample_is_a_run_the_commands_read(tmp_path):
    result = CliRunner().invoke(main, ["samples", "copy", "hang", str(tmp_path / "hang")])
    assert result.exit_code == 0, result.output
    assert "try: diag triage" in result.stderr
    assert sorted(p.name for p in (tmp_path / "hang").iterdir()) == ["rank00000", "rank00001", "rank00002"]
    triage = CliRunner().invoke(main, ["triage", str(tmp_path / "hang")])
    assert triage.exit_code == 1 and triage.stdout.startswith("HANG")


def test_copying_onto_a_directory_or_an_unknown_sample_is_refused(tmp_path):
    (tmp_path / "taken").mkdir()
    onto = CliRunner().invoke(main, ["samples", "copy", "hang", str(tmp_path / "taken")])
    assert onto.exit_code == 2 and "exists already" in onto.output
    assert list((tmp_path / "taken").iterdir()) == []
    unknown = CliRunner().invoke(main, ["samples", "copy", "nope", str(tmp_path / "x")])
    assert unknown.exit_code == 2 and "hang, pipeline" in unknown.output


def test_docs_lists_prints_and_locates_pages():
    listed = CliRunner().invoke(main, ["docs"])
    assert listed.exit_code == 0 and "diag docs cli" in listed.stdout and "diag docs analyze" in listed.stdout
    page = CliRunner().invoke(main, ["docs", "cli"])
    assert page.exit_code == 0 and page.stdout == (REPO / "docs" / "cli.md").read_text() + "\n"
    assert CliRunner().invoke(main, ["docs", "docs/kineto.md", "--path"]).stdout.strip() == str(
        REPO / "docs" / "kineto.md"
    )
    missing = CliRunner().invoke(main, ["docs", "nope"])
    assert missing.exit_code == 2 and "no page 'nope'" in missing.output
