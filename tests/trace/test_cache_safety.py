"""The trace cache never deletes or reads through links, never serves a planted or damaged entry, and a bad
cache is never a reason to fail (issue 12 items 1 and 9)."""

import json
import os
import shutil
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from diag.cli import main
from diag.trace import cache as trace_cache
from diag.trace.cache import TraceCache, cache_roots, load_cached, user_cache_dir

SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces" / "straggler"


@pytest.fixture
def run_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    trace_dir = tmp_path / "run"
    shutil.copytree(SAMPLE, trace_dir)
    return trace_dir


def _victim(tmp_path) -> Path:
    victim = tmp_path / "victim"
    (victim / "precious").mkdir(parents=True)
    (victim / "precious" / "thesis.tex").write_text("years of work")
    (victim / "file.txt").write_text("keep me")
    return victim


def test_fallback_is_per_user_not_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    roots = cache_roots(tmp_path)
    assert roots[1].parent == tmp_path / "xdg" / "diag"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    assert user_cache_dir() == Path(os.path.expanduser("~")) / ".cache" / "diag"


def test_symlinked_cache_root_is_neither_followed_nor_emptied(run_dir, tmp_path):
    victim = _victim(tmp_path)
    os.symlink(victim, run_dir / ".diag-cache")  # planted where the cache would go
    trace, how = load_cached(run_dir)
    assert how == "loaded+cached" and len(trace.steps) > 0
    assert (victim / "precious" / "thesis.tex").read_text() == "years of work"
    assert (victim / "file.txt").read_text() == "keep me"
    assert sorted(p.name for p in victim.iterdir()) == ["file.txt", "precious"]  # nothing written there either
    # the entry went to the per-user root instead, created private
    user_root = cache_roots(run_dir)[1]
    assert stat.S_IMODE(os.lstat(user_root).st_mode) == 0o700


def test_stale_entry_that_is_a_link_is_not_deleted_through(run_dir, tmp_path):
    victim = _victim(tmp_path)
    root = run_dir / ".diag-cache"
    root.mkdir()
    os.symlink(victim, root / "0stale")  # a stale "entry" that links to the victim
    os.symlink(victim / "precious", root / "old-entry")
    load_cached(run_dir)  # writes a new entry, then removes stale ones
    assert (victim / "precious" / "thesis.tex").exists() and (victim / "file.txt").exists()
    assert (root / "0stale").is_symlink()  # left alone, not followed


def test_entry_planted_as_link_is_a_miss_and_not_replaced_through(run_dir, tmp_path):
    victim = _victim(tmp_path)
    key = TraceCache(run_dir).key
    root = run_dir / ".diag-cache"
    root.mkdir()
    os.symlink(victim, root / key)
    trace, how = TraceCache(run_dir).load()
    assert how in ("loaded", "loaded+cached") and len(trace.steps) > 0
    assert sorted(p.name for p in victim.iterdir()) == ["file.txt", "precious"]


def _analyze_json(run_dir, *extra):
    result = CliRunner().invoke(main, ["analyze", str(run_dir), "--format", "json", *extra])
    assert result.exit_code == 0, (result.output, result.stderr, result.exception)
    return json.loads(result.stdout), result.stderr


def _report_files(run_dir) -> list[Path]:
    return sorted((run_dir / ".diag-cache").glob("*/report-*.json"))


def test_planted_bogus_report_is_not_served(run_dir):
    honest, _ = _analyze_json(run_dir)
    (path,) = _report_files(run_dir)
    bogus = json.loads(path.read_text())
    bogus["run"]["world_size"] = 12345
    bogus["report_version"] = 999  # from another (future) version, or planted
    path.write_text(json.dumps(bogus))
    again, err = _analyze_json(run_dir)
    assert again["run"]["world_size"] == honest["run"]["world_size"] != 12345
    assert "report read from the cache" not in err


def test_report_through_a_link_is_not_served(run_dir, tmp_path):
    _analyze_json(run_dir)
    (path,) = _report_files(run_dir)
    planted = tmp_path / "planted.json"
    state = json.loads(path.read_text())
    state["run"]["world_size"] = 777
    planted.write_text(json.dumps(state))
    path.unlink()
    os.symlink(planted, path)
    again, err = _analyze_json(run_dir)
    assert again["run"]["world_size"] != 777 and "report read from the cache" not in err


@pytest.mark.parametrize("content", ["{}", "[]", "null", "not json", '{"run": 5}', '{"run": {"world_size": "x"}}'])
def test_damaged_report_entry_is_recomputed(run_dir, content):
    honest, _ = _analyze_json(run_dir)
    (path,) = _report_files(run_dir)
    path.write_text(content)
    again, err = _analyze_json(run_dir)
    assert again["run"] == honest["run"] and "report read from the cache" not in err


@pytest.mark.parametrize("content", ["{}", "[]", '{"manifests": 3}', "\x00\x01garbage"])
def test_damaged_meta_is_a_miss(run_dir, content):
    _, how = load_cached(run_dir)
    assert how == "loaded+cached"
    (meta,) = (run_dir / ".diag-cache").glob("*/meta.json")
    meta.write_text(content)
    trace, how = load_cached(run_dir)
    assert how != "cache" and len(trace.steps) > 0
    honest, _ = _analyze_json(run_dir, "--no-cache")
    again, _ = _analyze_json(run_dir)
    assert again["run"] == honest["run"]


def test_damaged_arrow_table_is_a_miss(run_dir):
    load_cached(run_dir)
    (table,) = (run_dir / ".diag-cache").glob("*/steps.arrow")
    table.write_bytes(b"\x00" * 64)
    trace, how = load_cached(run_dir)
    assert how != "cache" and len(trace.steps) > 0


def test_remove_stale_only_touches_own_real_dirs(tmp_path):
    root = tmp_path / "root"
    (root / "old").mkdir(parents=True)
    (root / "keep").mkdir()
    victim = _victim(tmp_path)
    os.symlink(victim, root / "link")
    trace_cache._remove_stale(root, keep="keep")
    assert not (root / "old").exists() and (root / "keep").is_dir() and (root / "link").is_symlink()
    assert (victim / "precious" / "thesis.tex").exists()
    # a root that is itself a link is not walked at all
    os.symlink(victim, tmp_path / "root-link")
    trace_cache._remove_stale(tmp_path / "root-link", keep="none")
    assert (victim / "precious").is_dir()
