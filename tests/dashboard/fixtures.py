"""Fixtures of the dashboard tests (tests/conftest.py makes them visible to every test): trace directories in the real format, a server on a free localhost port,
and headless Chromium (the tests skip, saying why, only when Chromium or its driver is not installed)."""

from __future__ import annotations

import json
import logging
import shutil
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line per request would bury a failure's output


@pytest.fixture(scope="session")
def synthetic_run(tmp_path_factory) -> tuple[Path, dict]:
    """16 ranks x 60 steps from the synthetic generator, with its planted problems (compute straggler,
    data straggler, throttled GPU, memory leak)."""
    from diag.testing.synthetic import generate

    out = tmp_path_factory.mktemp("synthetic16")
    generate(out, ranks=16, steps=60, collectives_per_step=4)
    return out, json.loads((out / "planted.json").read_text())


@pytest.fixture(scope="session")
def browser():
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip(
            "headless browser tests need chromium and chromedriver (Debian: apt install chromium chromium-driver)"
        )
    pytest.importorskip("selenium", reason="browser tests need selenium (pip install -e .[test])")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1100"):
        options.add_argument(arg)
    options.binary_location = CHROMIUM
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


@pytest.fixture
def serve():
    """serve(app) -> base URL of the app on a free localhost port; stopped at the end of the test."""
    from werkzeug.serving import make_server

    servers = []

    def start(app) -> str:
        server = make_server("127.0.0.1", 0, app.server, threaded=True)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append((server, app))
        return f"http://127.0.0.1:{server.server_port}"

    yield start
    for server, app in servers:
        server.shutdown()
        app.live.stop()
