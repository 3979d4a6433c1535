"""``diag docs``: diag's documentation (docs/*.md), installed with it, printed or located. Never imports torch."""

from __future__ import annotations

import click

from diag.commands import docs_dir
from diag.commands.exit_codes import InputError


@click.command("docs")
@click.argument("name", required=False)
@click.option("--path", "path_only", is_flag=True, help="Print where the page is instead of the page.")
def command(name, path_only):
    """Print a page of diag's documentation (markdown), or list the pages given no NAME.

    \b
    Examples:
      diag docs                 the pages and where they are
      diag docs analyze         every key of the report
      diag docs kineto | less
    """
    root = docs_dir()
    if root is None:
        raise InputError("diag's documentation is not installed with this copy (see README.md in its source)")
    pages = {p.stem: p for p in sorted(root.glob("*.md"))}
    if name is None:
        click.echo(f"{root}:")
        for stem in pages:
            click.echo(f"  diag docs {stem}")
        return
    page = pages.get(name.removesuffix(".md").removeprefix("docs/"))
    if page is None:
        raise InputError(f"no page {name!r}: the pages are {', '.join(pages)}")
    click.echo(str(page) if path_only else page.read_text(encoding="utf-8"))
