"""Screenshots of every dashboard page for docs/dashboard.md, taken in headless Chromium.

    python docs/screenshots/make_screenshots.py                         # the bundled sample run
    python docs/screenshots/make_screenshots.py /tmp/synth64 --prefix synthetic64- --rank 24 --pages stragglers telemetry

A rank is selected first (typed into the header's rank box), then pages are opened through the navigation
links, as a user would, so the linked views show it.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace_dir", nargs="?", default=str(REPO / "sample_traces" / "straggler"))
    parser.add_argument("--prefix", default="")
    parser.add_argument("--rank", type=int, default=1, help="rank to select before the screenshots")
    parser.add_argument(
        "--pages",
        nargs="*",
        default=["overview", "stragglers", "communication", "memory", "telemetry", "pipeline", "triage"],
    )
    args = parser.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)

    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from werkzeug.serving import make_server

    from diag.dashboard.app import create_app
    from diag.dashboard.data import LiveTrace
    from tests.dashboard import browser as b

    live = LiveTrace(args.trace_dir, poll_interval_s=3600)
    live.refresh()
    live.wait_for_triage()
    app = create_app(args.trace_dir, live=live)
    server = make_server("127.0.0.1", 0, app.server, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    options = webdriver.ChromeOptions()
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--window-size=1280,900",
        "--hide-scrollbars",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    try:
        driver.get(f"http://127.0.0.1:{server.server_port}/")
        b.wait_for(driver, lambda d: b.drawn_graphs(d) >= 4, "the overview")
        box = driver.find_element("id", "rank-input")
        box.send_keys(str(args.rank) + "\n")
        b.wait_for(driver, lambda d: f"selected rank: {args.rank}" in b.status(d), "the selected rank")
        for key in args.pages:
            driver.find_element("id", f"nav-{key}").click()
            b.wait_for(driver, lambda d, key=key: d.find_elements("id", f"page-{key}"), f"page {key}")
            time.sleep(2.5)  # figures drawn and the selection applied
            height = driver.execute_script("return document.documentElement.scrollHeight")
            driver.set_window_size(1280, max(900, height + 150))  # the window's frame takes some of it
            time.sleep(1.0)
            path = HERE / f"{args.prefix}{key}.png"
            driver.save_screenshot(str(path))
            driver.set_window_size(1280, 900)
            print(path)
    finally:
        driver.quit()
        server.shutdown()
        live.stop()


if __name__ == "__main__":
    main()
