"""pyproject.toml's data-files install every sample run and every page of the docs (data-files take files, not
trees: a rank directory or a page added without its line would be missing from a plain install, as hang,
pipeline and the H100/H200 runs were). Fast: reads pyproject.toml; the install itself is test_plain_install."""

import pytest

from tests.conftest import REPO

tomllib = pytest.importorskip("tomllib")  # Python 3.11+


def _data_files() -> dict[str, list[str]]:
    with open(REPO / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["setuptools"]["data-files"]


def test_every_sample_rank_directory_is_installed():
    files = _data_files()
    for rank_dir in sorted((REPO / "sample_traces").glob("*/rank*")):
        rel = rank_dir.relative_to(REPO).as_posix()
        assert files.get(f"share/diag/{rel}") == [f"{rel}/*"], f"{rel} is not in pyproject.toml's data-files"
        assert all(p.is_file() for p in rank_dir.iterdir()), f"{rel} holds a folder: data-files would skip it"


def test_every_page_of_the_docs_is_installed():
    assert "docs/*.md" in _data_files()["share/doc/diag"]
