"""Renderers of an analysis Report: text, markdown, JSON, self-contained HTML. They format, never compute."""

from __future__ import annotations


def render(report, fmt: str) -> str:
    if fmt == "json":
        from diag.views.json_view import render_json

        return render_json(report)
    from diag.views.text import render_markdown, render_text

    return render_markdown(report) if fmt == "markdown" else render_text(report)
