"""What docs/cli.md promises of the command line besides exit codes: shell completion through click (the
subcommands, which the lazy group lists without importing them, and their options), and help that never
imports torch or dash and points to pages `diag docs` can print."""

from __future__ import annotations


def test_help_points_to_pages_diag_docs_prints():
    from click.testing import CliRunner

    from diag.cli import main

    runner = CliRunner()
    helps = "".join(runner.invoke(main, [c, "--help"]).output for c in ("analyze", "compare", "telemetry"))
    assert "docs/" not in helps  # a plain install has no docs/ folder: help names `diag docs PAGE`
    for name in ("kineto", "scale", "compare", "prometheus"):
        assert f"diag docs {name}" in " ".join(helps.split()), name
        printed = runner.invoke(main, ["docs", name])
        assert printed.exit_code == 0 and printed.output.startswith("#"), name


def test_no_help_names_a_docs_file_a_plain_install_lacks():
    """Every command's and subcommand's help (before: doctor's said docs/triage.md, docs' docs/analyze.md)."""
    import click
    from click.testing import CliRunner

    from diag.cli import main

    runner = CliRunner()
    with click.Context(main) as ctx:
        names = [[name] for name in main.list_commands(ctx)]
        for name in list(names):
            command = main.get_command(ctx, name[0])
            if isinstance(command, click.Group):
                names += [[name[0], sub] for sub in command.list_commands(ctx)]
    for name in [[], *names]:
        result = runner.invoke(main, [*name, "--help"])
        assert result.exit_code == 0, name
        assert "docs/" not in result.output, (name, result.output)
