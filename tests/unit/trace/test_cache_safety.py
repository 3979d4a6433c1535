"""The analysis cache trusts nothing another user could have put in its way (issue 12, items 1 and 9).

The attack that was found: with the trace directory not writable, the cache went to a predictable path in the
shared temp directory, followed a symlink planted there and ``rmtree``'d "stale" entries, deleting another
directory of the analysing user; a planted report was served as real. These tests plant the links and files
an attacker would, at both places a cache can live, and check that nothing is followed, deleted or served.
Another user's ownership is made with ``os.chown`` (these tests run as root on CI and skip the one that needs
it otherwise): that proves the ownership check directly, without creating a system account.
"""

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from diag.cli import main
from diag.trace import cache as trace_cache
from tests.analysis.helpers import make_trace, steps_row

OTHER_UID = 54321  # not this test's user


@pytest.fixture
def run_dir(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    run = tmp_path / "run"
    make_trace(run, ranks=2, steps=10)
    return run


@pytest.fixture
def victim(tmp_path) -> Path:
    """A directory of the analysing user that an attacker wants deleted."""
    victim = tmp_path / "home-of-victim"
    (victim / "thesis").mkdir(parents=True)
    (victim / "thesis" / "chapter1.tex").write_text("years of work")
    (victim / "0123456789abcdef0123456789abcdef").mkdir()  # named like a cache entry, to tempt the cleaner
    return victim


def _intact(victim: Path) -> bool:
    return (victim / "thesis" / "chapter1.tex").read_text() == "years of work" and (
        victim / "0123456789abcdef0123456789abcdef"
    ).is_dir()


def _block_trace_dir_cache(run: Path) -> None:
    """The trace directory's own cache cannot be used (as when it is read-only: root ignores modes, so a file
    in the way stands in for that here)."""
    (run / trace_cache.CACHE_DIR).write_text("not a directory")


def _analyze_json(run: Path) -> dict:
    result = CliRunner().invoke(main, ["analyze", str(run), "--format", "json", "--fail-on", "never"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output[result.output.index("{") :])


def test_the_fallback_cache_is_the_users_own_and_private(run_dir):
    _block_trace_dir_cache(run_dir)
    _, how = trace_cache.load_cached(run_dir)
    assert how == "loaded+cached"
    (root,) = [r for r in trace_cache.cache_roots(run_dir) if r.is_dir()]
    assert root.is_relative_to(Path(os.environ["XDG_CACHE_HOME"]) / "diag")
    assert os.stat(root).st_mode & 0o077 == 0 and os.stat(root).st_uid == os.geteuid()
    assert trace_cache.load_cached(run_dir)[1] == "cache"


def test_a_link_planted_at_the_fallback_cache_is_not_followed_nor_deleted_through(run_dir, victim):
    _block_trace_dir_cache(run_dir)
    fallback = trace_cache.cache_roots(run_dir)[1]
    fallback.parent.mkdir(parents=True)
    fallback.symlink_to(victim)  # the attacker's link, where the fallback cache would go
    for _ in range(2):  # a second run would remove "stale" entries of the first
        report = _analyze_json(run_dir)
        assert report["run"]["ranks_found"] == [0, 1]
    assert _intact(victim) and sorted(p.name for p in victim.iterdir()) == [
        "0123456789abcdef0123456789abcdef",
        "thesis",
    ]
    assert fallback.is_symlink()  # left alone: not followed, not replaced


def test_a_link_planted_as_the_trace_directorys_cache_is_not_followed(run_dir, victim):
    (run_dir / trace_cache.CACHE_DIR).symlink_to(victim)  # a shared trace directory: anyone may plant this
    for _ in range(2):
        _analyze_json(run_dir)
    assert _intact(victim) and sorted(p.name for p in victim.iterdir()) == [
        "0123456789abcdef0123456789abcdef",
        "thesis",
    ]


def test_stale_entry_removal_never_deletes_through_a_link_or_touches_other_files(run_dir, victim):
    root = run_dir / trace_cache.CACHE_DIR
    trace_cache.load_cached(run_dir)
    (root / "fedcba9876543210fedcba9876543210").symlink_to(victim)  # a "stale entry" that is a link
    (root / "notes.txt").write_text("not an entry")
    (run_dir / "rank00001" / "steps.csv").open("a").write(
        steps_row(10, 1795000000000000, 1000, 10, 1, 1, 1, 1, "", 8, 16384)
    )
    _, how = trace_cache.load_cached(run_dir)  # new signature: the old entry is removed
    assert how == "loaded+cached"
    assert _intact(victim)
    assert (root / "notes.txt").read_text() == "not an entry"
    entries = [p for p in root.iterdir() if p.is_dir() and not p.is_symlink()]
    assert len(entries) == 1  # the real stale entry did go


@pytest.mark.skipif(os.geteuid() != 0, reason="making a directory another user's needs root (CI runs as root)")
def test_a_cache_entry_of_another_user_is_neither_read_nor_deleted(run_dir):
    first = _analyze_json(run_dir)
    root = run_dir / trace_cache.CACHE_DIR
    (entry,) = [p for p in root.iterdir() if p.is_dir()]
    (report_file,) = entry.glob("report-*.json")
    planted = json.loads(report_file.read_text())
    planted["findings"] = [
        {"kind": "straggler", "severity": "high", "title": "PLANTED: rank 0 is broken", "ranks": [0]}
        | {"time_lost_s": 1.0, "time_lost_per_step_s": 0.1, "evidence": [], "advice": ""}
    ]
    report_file.write_text(json.dumps(planted))
    for path in (root, entry, report_file):
        os.chown(path, OTHER_UID, OTHER_UID)
    second = _analyze_json(run_dir)
    assert not any("PLANTED" in f["title"] for f in second["findings"])
    assert second["findings"] == first["findings"]
    assert "PLANTED" in report_file.read_text()  # not deleted nor rewritten either: it is not ours


@pytest.mark.parametrize(
    "damage",
    ["{}", "[]", "null", '{"report_version": 99}', "\x00\x01 not json", '{"run": 5}', '{"run": {"world_size": "x"}}'],
)
def test_a_damaged_report_in_the_cache_is_recomputed(run_dir, damage):
    first = _analyze_json(run_dir)
    (report_file,) = (run_dir / trace_cache.CACHE_DIR).glob("*/report-*.json")
    report_file.write_text(damage)
    assert _analyze_json(run_dir)["findings"] == first["findings"]


@pytest.mark.parametrize("damage", ["{}", "[]", '{"manifests": 5}', "not json"])
def test_a_damaged_cached_trace_is_loaded_again(run_dir, damage):
    first, _ = trace_cache.load_cached(run_dir)
    (meta,) = (run_dir / trace_cache.CACHE_DIR).glob("*/meta.json")
    meta.write_text(damage)
    again, how = trace_cache.load_cached(run_dir)
    assert how == "loaded+cached" and len(again.steps) == len(first.steps)
    assert _analyze_json(run_dir)["run"]["ranks_found"] == [0, 1]


def test_a_fifo_in_the_cache_does_not_block(run_dir):
    trace_cache.load_cached(run_dir)
    (meta,) = (run_dir / trace_cache.CACHE_DIR).glob("*/meta.json")
    meta.unlink()
    os.mkfifo(meta)
    _, how = trace_cache.load_cached(run_dir)  # would block forever on open() for reading
    assert how == "loaded+cached"
