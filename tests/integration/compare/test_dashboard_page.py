"""The dashboard's Compare page: the followed run against the baseline given with --baseline or picked on the page
(a run beside it from the list, or a typed path, validated), drawn from the same comparison as diag compare;
without a baseline it says how to give one. In headless Chromium too."""

from __future__ import annotations

import pytest

from diag.dashboard import compare_page
from tests.analysis.helpers import make_trace, synthetic


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("dash-compare")
    make_trace(root / "base", 8, 40, plants=synthetic.Plants(), seed=0)
    make_trace(root / "straggler", 8, 40, plants=synthetic.Plants(compute_straggler=2), seed=1)
    (root / "notes").mkdir()  # beside the runs, not a trace: never listed, refused when typed
    (root / "notes" / "todo.txt").write_text("not a trace")
    (root / "empty-run" / "rank00000").mkdir(parents=True)  # a rank directory without a manifest
    return root


@pytest.fixture
def with_baseline(runs):
    from diag.commands.compare import load_summary

    compare_page.set_baseline(load_summary(runs / "base", "base", no_cache=True), runs / "base")
    yield
    compare_page.set_baseline(None)


def _live(path):
    from diag.dashboard.data import LiveTrace

    live = LiveTrace(path, poll_interval_s=0.3)
    live.refresh()
    return live


@pytest.mark.slow
def test_compare_page_in_the_browser(runs, with_baseline, browser, serve):  # noqa: F811
    from diag.dashboard.app import create_app
    from tests.dashboard import browser as b

    base = serve(create_app(runs / "straggler", live=_live(runs / "straggler"), refresh_ms=500))
    b.open_page(browser, base + "/compare", 2)
    text = b.text(browser, "page")
    assert "Compare" in text and "regression" in text and "Where the time went" in text
    assert "straggler loss" in text
    assert len(b.figure(browser, "compare-steps")["data"]) == 2


@pytest.fixture
def no_baseline():
    compare_page.set_baseline(None)
    yield
    compare_page.set_baseline(None)


@pytest.mark.slow
def test_picking_a_baseline_in_the_browser(runs, no_baseline, browser, serve):  # noqa: F811
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    from diag.dashboard.app import create_app
    from tests.dashboard import browser as b

    base = serve(create_app(runs / "straggler", live=_live(runs / "straggler"), refresh_ms=500))
    browser.get(base + "/compare")
    b.wait_for(browser, lambda d: "No baseline" in (b.text(d, "page") or ""), "the page without a baseline")
    assert b.text(browser, "page").count("No baseline") == 1  # said once, the figures blank
    path = browser.find_element(By.ID, compare_page.PATH_ID)
    for typed, says in (
        ("notes", "is not a diag trace directory"),
        ("no-such-run", "does not exist"),
        ("/no/such/run", "only directories under"),
    ):
        _type(path, typed)
        browser.find_element(By.ID, compare_page.USE_ID).click()
        b.wait_for(browser, lambda d, says=says: says in (b.text(d, compare_page.MESSAGE_ID) or ""), says)
        assert "No baseline" in b.text(browser, "page")
    # the list of runs beside this one: open it and pick "base"
    browser.find_element(By.CSS_SELECTOR, f"#{compare_page.PICK_ID}").click()
    option = b.wait_for(browser, lambda d: _option(d, "base"), "the run 'base' in the list")
    option.click()
    b.wait_for(browser, lambda d: "regression" in (b.text(d, "page") or ""), "the comparison with base")
    assert "straggler loss" in b.text(browser, "page")
    assert f"baseline: {runs / 'base'}" in b.text(browser, compare_page.MESSAGE_ID)
    assert len(b.figure(browser, "compare-steps")["data"]) == 2
    # a typed path with Enter works too, and a bad one afterwards keeps the comparison drawn
    _type(path, "notes", Keys.ENTER)
    b.wait_for(browser, lambda d: "not a diag trace" in (b.text(d, compare_page.MESSAGE_ID) or ""), "refusal")
    assert "regression" in b.text(browser, "page")


def _type(element, *keys) -> None:
    """Replace the input's text (WebElement.clear() does not reach React's state: the old text would stay)."""
    from selenium.webdriver.common.keys import Keys

    element.send_keys(Keys.CONTROL, "a")
    element.send_keys(Keys.DELETE, *keys)


def _option(driver, label: str):
    from selenium.webdriver.common.by import By

    for element in driver.find_elements(By.XPATH, f"//*[normalize-space(text())='{label}']"):
        if element.is_displayed() and element.get_attribute("id") != compare_page.PICK_ID:
            return element
    return None
