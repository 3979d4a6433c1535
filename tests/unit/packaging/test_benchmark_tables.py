"""docs/benchmarks.md's generated tables are what ``benchmarks/suite.py tables`` writes from the results recorded
in benchmarks/results/ (so the docs cannot drift from the results, nor the results from the registered
commands), and ``record.Table`` saves what it printed. Fast: reads files, runs no benchmark."""

import sys

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))

import record  # noqa: E402
import suite  # noqa: E402


def _blocks() -> list:
    return list(suite.BLOCK.finditer(suite.DOCS.read_text()))


def test_the_docs_generated_tables_are_what_the_results_give():
    assert _blocks(), "docs/benchmarks.md has no generated table"
    _, differing = suite.generated_docs(suite.DOCS.read_text())
    assert differing == [], f"run python3 benchmarks/suite.py tables: {differing} differ from their results"


@pytest.mark.parametrize("block", _blocks(), ids=lambda m: f"{m['name']}-{m['machine']}")
def test_each_generated_table_comes_from_its_registered_command(block):
    assert block["name"] in suite.BENCHMARKS, f"{block['name']} is not registered in suite.BENCHMARKS"
    result = record.load(suite.results_path(block["name"], block["machine"]))
    assert result["name"] == block["name"]
    assert result["command"] == f"python3 benchmarks/{suite.BENCHMARKS[block['name']]}"


def test_every_registered_benchmark_has_a_table_in_the_docs():
    assert set(suite.BENCHMARKS) <= {block["name"] for block in _blocks()}


def test_a_saved_table_loads_with_the_same_rows(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["benchmarks/bench_x.py", "--repeats", "3", "--json", "out.json"])
    monkeypatch.setattr(record, "git_revision", lambda: "abc1234")  # no git process in a unit test
    table = record.Table("x", ["what", "median (us)"])
    table.add("one row", 1.25)
    table.add("another | escaped", "2.50")
    table.note("per step: 3.75 us")
    table.save(tmp_path / "x.json")

    loaded = record.load(tmp_path / "x.json")
    assert (loaded["name"], loaded["columns"]) == ("x", ["what", "median (us)"])
    assert loaded["rows"] == [["one row", "1.25"], ["another | escaped", "2.50"]]
    assert loaded["notes"] == ["per step: 3.75 us"]
    assert loaded["command"] == "python3 benchmarks/bench_x.py --repeats 3"
    assert loaded["git_revision"] == "abc1234"
    assert "| one row | 1.25 |" in capsys.readouterr().out
    rendered = record.render(loaded)
    assert rendered.startswith("| what | median (us) |\n|---|---|\n| one row | 1.25 |\n")
    assert "| another \\| escaped | 2.50 |" in rendered
