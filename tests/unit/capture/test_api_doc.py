"""docs/api.md is generated from the API's own docstrings and signatures (``python -m diag.api_doc``): what
``help(diag.step)`` says and what the page says are the same text."""

import inspect

import diag
from diag.api_doc import CALLBACKS, render_markdown
from tests.conftest import REPO


def test_api_doc_is_generated_from_the_code():
    committed = (REPO / "docs" / "api.md").read_text()
    assert committed == render_markdown(), "regenerate: python -m diag.api_doc > docs/api.md"


def test_every_public_name_is_documented_with_its_signature():
    page = render_markdown()
    for name in diag.__all__:
        obj = getattr(diag, name)
        assert len(inspect.getdoc(obj) or "") > 60, f"diag.{name} needs a docstring a user can act on"
        assert f"## `diag.{name}(" in page
    for qualified, _, _ in CALLBACKS:
        assert f"### `{qualified}(trace_dir, **init_options)`" in page


def test_docstring_code_blocks_become_markdown_code_blocks():
    page = render_markdown()
    assert "```python\nfor micro_batches in diag.wrap_loader(loader):" in page  # diag.step's accumulation loop
    assert "``" not in page.replace("```", "")  # reST's double backticks are gone


def test_the_api_doc_is_linked_from_the_readme():
    assert "docs/api.md" in (REPO / "README.md").read_text()
