"""The Triage page's pull from a running job's PyTorch debug server, in headless Chromium: a real 3-rank gloo
job (tests/triage/debug_server_job.py: rank 2 sleeps before an all_reduce ranks 0 and 1 wait in) and a dashboard
started with its frontend's address. A click gives the verdict of every rank's state now; another profiles a
rank through its worker server."""

from __future__ import annotations

import re
import time
import urllib.request
from pathlib import Path

import pytest

from diag.launch import free_port, start_ranks

pytest.importorskip("selenium", reason="browser tests need selenium (pip install -e .[test])")
from selenium.webdriver.common.by import By  # noqa: E402

from tests.dashboard import browser as b  # noqa: E402
from tests.dashboard.helpers import make_app  # noqa: E402
from tests.triage.jobs import DEBUG_SERVER_JOB, diag_triage_json, end_debug_server_job  # noqa: E402

pytestmark = pytest.mark.slow


def _sleeping_in_view(url: str, timeout_s: float, procs) -> bool:
    """The frontend answers, with rank 2 in wait_for_slow_input (it starts after the job's process group)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and all(p.poll() is None for p in procs):
        try:
            if b"wait_for_slow_input" in urllib.request.urlopen(url + "/stacks", timeout=30).read():
                return True
        except OSError:
            pass
        time.sleep(1)
    return False


def test_triage_page_pulls_every_rank_s_state_and_profiles_a_rank(browser, synthetic_run, serve, tmp_path):
    from diag.dashboard import live_pull

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    procs = start_ranks(
        [str(DEBUG_SERVER_JOB), str(tmp_path / "dumps"), str(port)], 3, {"TORCH_FR_BUFFER_SIZE": "2000"}
    )
    live_pull.set_debug_server(url, tmp_path / "pulled")
    try:
        assert _sleeping_in_view(url, 90, procs), "the debug server never showed rank 2 in wait_for_slow_input"
        base = serve(make_app(synthetic_run[0]))
        browser.get(base + "/triage")
        b.wait_for(browser, lambda d: d.find_elements(By.ID, live_pull.PULL_ID), "the pull button")
        browser.find_element(By.ID, live_pull.PULL_ID).click()
        b.wait_for(
            browser, lambda d: b.text(d, "live-verdict") or b.text(d, "live-pull-error"), "the pulled verdict", 120
        )
        assert b.text(browser, "live-verdict") == "Verdict: missing_ranks"
        assert b.text(browser, "live-culprits") == "Culprit ranks: 2"
        page_action = b.text(browser, "live-action")
        assert b.text(browser, "triage-verdict").startswith("Verdict: ")  # the trace's own verdict stays below
        browser.find_element(By.ID, live_pull.RANKS_ID).send_keys("2")
        browser.find_element(By.ID, live_pull.PROFILE_ID).click()
        b.wait_for(browser, lambda d: b.text(d, "live-profiles") or b.text(d, "live-profile-error"), "the profile", 120)
        listed = b.text(browser, "live-profiles")
    finally:
        live_pull.set_debug_server(None)
        end_debug_server_job(procs, tmp_path / "frontend.pid")
    saved = re.search(r"rank 2: (\S+\.json)", listed)
    assert saved and Path(saved.group(1)).is_file(), listed
    pulled = tmp_path / "pulled" / "pull-1"
    assert sorted(p.name for p in pulled.iterdir())[0] == "flight_recorder"
    # the page's verdict is diag triage's on what the page pulled, what to do next included
    verdict = diag_triage_json(pulled)
    assert (verdict["verdict"], verdict["culprit_ranks"]) == ("missing_ranks", [2]), verdict["evidence"]
    assert verdict["action"] == "fix_code"  # rank 2's own code kept it from the all_reduce
    assert page_action.startswith("Next: FIX THE CODE") and verdict["action_why"] in page_action, page_action


def test_without_a_debug_server_the_page_says_how_to_give_one(browser, synthetic_run, serve):
    base = serve(make_app(synthetic_run[0]))
    browser.get(base + "/triage")
    b.wait_for(browser, lambda d: b.text(d, "live-pull-off"), "the note on --debug-server")
    assert "--debug-server" in b.text(browser, "live-pull-off")
