"""``python -m diag.api_doc > docs/api.md``: the reference of diag's Python API, generated from its docstrings
and signatures, so that ``help(diag.step)`` and the page say the same.

The framework callbacks are read from their source (``ast``), so that writing the page needs neither Lightning
nor transformers installed; everything else is read from the objects themselves, which import nothing heavy.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path

import diag

PACKAGE = Path(diag.__file__).parent
# the framework callbacks: (the name users import, the module's file, the class)
CALLBACKS = (
    ("diag.integrations.lightning.DiagCallback", "integrations/lightning.py", "DiagCallback"),
    ("diag.integrations.huggingface.DiagTrainerCallback", "integrations/huggingface.py", "DiagTrainerCallback"),
)
# classes whose own methods are part of the API, besides their constructor
METHODS = {"Trainer": ("fit",)}


def render_markdown() -> str:
    parts = [
        "# Python API",
        "",
        "<!-- generated from the docstrings: python -m diag.api_doc > docs/api.md -->",
        "",
        "Capture runs inside the training processes (`import diag` imports torch only when capture starts);",
        "`diag.load` and the command line read traces anywhere, without torch. The options of `diag.init` are",
        "listed in [capture-options.md](capture-options.md), with their `DIAG_*` environment variables.",
        "",
    ]
    for name in diag.__all__:
        parts += _section(f"diag.{name}", getattr(diag, name))
    parts += ["## Framework callbacks", ""]
    for qualified, path, class_name in CALLBACKS:
        signature, doc = _class_from_source(PACKAGE / path, class_name)
        parts += [f"### `{qualified}{signature}`", "", _markdown(doc), ""]
    return "\n".join(parts).rstrip() + "\n"


def _section(qualified: str, obj) -> list[str]:
    doc = inspect.getdoc(obj) or ""
    if obj is diag.init:  # its options have a page of their own
        doc = doc.split("\n\nOptions:", 1)[0]
    lines = [f"## `{qualified}{_signature(obj)}`", "", _markdown(doc), ""]
    for method in METHODS.get(getattr(obj, "__name__", ""), ()):
        member = getattr(obj, method)
        lines += [f"### `{qualified}.{method}{_signature(member, drop_self=True)}`", ""]
        lines += [_markdown(inspect.getdoc(member) or ""), ""]
    return lines


def _signature(obj, drop_self: bool = False) -> str:
    signature = inspect.signature(obj)
    if drop_self:
        signature = signature.replace(parameters=list(signature.parameters.values())[1:])
    return str(signature).replace("'", "")


def _class_from_source(path: Path, class_name: str) -> tuple[str, str]:
    """(the constructor's signature, the class's docstring) of ``class_name`` in ``path``; the constructor is the
    class's own ``__init__`` or the first base's in the same module that has one."""
    tree = ast.parse(path.read_text())
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    node = classes[class_name]
    doc = ast.get_docstring(node) or ""
    for candidate in (node, *(classes.get(getattr(b, "id", "")) for b in node.bases)):
        init = next((n for n in getattr(candidate, "body", ()) if getattr(n, "name", None) == "__init__"), None)
        if init is not None:
            arguments = ast.unparse(init.args).removeprefix("self, ").removeprefix("self")
            return f"({arguments})", doc
    return "()", doc


def _markdown(doc: str) -> str:
    """A docstring as Markdown: reST's double backticks become code spans, and an indented block after a line
    ending in ``::`` a Python code block."""
    out, lines, index = [], doc.splitlines(), 0
    while index < len(lines):
        line = lines[index]
        if line.rstrip().endswith("::"):
            out.append(line.rstrip()[:-1].rstrip().replace("``", "`") + ":" if line.strip() != "::" else "")
            index += 1
            block = []
            while index < len(lines) and (not lines[index].strip() or lines[index].startswith(" ")):
                block.append(lines[index])
                index += 1
            out += ["", "```python", textwrap.dedent("\n".join(block)).strip("\n"), "```", ""]
            continue
        out.append(line.replace("``", "`"))
        index += 1
    return "\n".join(out).strip()


if __name__ == "__main__":
    print(render_markdown(), end="")
