"""`diag analyze --format json` on the bundled sample runs (and the real H100 torch.profiler trace) equals the
report recorded in tests/golden/: the JSON contract (docs/analyze.md) holds through refactors.

A golden file changes only when a report is meant to change; then regenerate it with
``python3 tests/analysis/golden.py`` and say in the commit what changed and why.
"""

from __future__ import annotations

from tests.analysis.golden import (
    differences,
)


def test_differences_names_what_changed():
    assert differences({"a": [1, 2.0], "b": "x"}, {"a": [1, 2.0 + 1e-12], "b": "x"}) == []
    assert differences({"a": [1, 2]}, {"a": [1, 3]}) == ["$.a[1]: 2 != 3"]
    assert differences({"a": 1}, {"b": 1}) == ["$.a: missing", "$.b: unexpected"]
    assert differences({"v": True}, {"v": 1}) == ["$.v: True != 1"]
