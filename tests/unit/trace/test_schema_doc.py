from diag.trace.schema import render_markdown
from tests.conftest import REPO


def test_trace_format_doc_is_generated_from_the_schema():
    committed = (REPO / "docs" / "trace-format.md").read_text()
    assert committed == render_markdown(), "regenerate: python -m diag.trace.schema > docs/trace-format.md"
