"""Scale benchmark of ``diag dashboard``: the synthetic 1,024 ranks x 1,000 steps run.

Measures, once the server has loaded the traces (loading is reported but not part of the targets):
* every page's callbacks through Dash's own HTTP endpoint (Flask test client): time and response size, and
  the largest figure in each response (target: each callback <= 1 s, no figure > 2 MB);
* the selection callbacks after a click on the straggler heatmap (the pages redraw for the selected rank);
* first page ready: index, layout, dependencies, router and overview callbacks in sequence (target <= 3 s),
  and, when Chromium is installed, the same in a real headless browser until every figure is drawn.

    python benchmarks/bench_dashboard.py /tmp/synth1024            # generates the run there if absent
    python benchmarks/bench_dashboard.py /tmp/synth64 --ranks 64 --steps 200
    python benchmarks/bench_dashboard.py /tmp/synth4096 --ranks 4096 --format 2 --no-browser

Above 64 ranks the server never loads the collectives (reduced rank by rank, diag.analysis.partitioned, in
worker processes from 512 ranks as diag analyze does); the peak RSS of this process after the load is printed,
with the largest summed PSS of this process and its worker processes during the load (sampled every 0.2 s, as
measured.py does for diag analyze), and the rank-group pickers' callbacks are measured too. Above 64 ranks the
server reads the report diag analyze cached for these files (TRACE_DIR/.diag-cache) when there is one, and caches
the one it computes: ``--no-cache`` measures the cold load (nothing read or written).

``--json PATH`` also saves the table (record.Table): every callback, the first page's readiness, and notes with
the load, the triage verdict and the targets.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from record import Table, add_json_option  # noqa: E402

CALLBACK_LIMIT_S = 1.0
FIRST_PAGE_LIMIT_S = 3.0
FIGURE_LIMIT_BYTES = 2 * 2**20


class DashClient:
    """Calls a Dash app's callbacks the way the browser does, through ``/_dash-update-component``."""

    def __init__(self, app):
        self.client = app.server.test_client()
        self.deps = self.client.get("/_dash-dependencies").get_json()

    def find(self, output_part: str) -> dict:
        return next(d for d in self.deps if output_part in d["output"])

    def call(self, output_part: str, inputs: dict, state: dict | None = None, changed: str | None = None):
        """``inputs``/``state``: {"id.prop" or id-json: value}. Returns (seconds, bytes, response JSON)."""
        dep = self.find(output_part)
        body = {
            "output": dep["output"],
            "outputs": _outputs(dep["output"]),
            "inputs": [_arg(spec, inputs) for spec in dep["inputs"]],
            "state": [_arg(spec, state or {}) for spec in dep["state"]],
            "changedPropIds": [changed] if changed else [],
        }
        started = time.perf_counter()
        response = self.client.post("/_dash-update-component", json=body)
        elapsed = time.perf_counter() - started
        if response.status_code == 204:
            return elapsed, 0, None
        assert response.status_code == 200, response.data[:500]
        return elapsed, len(response.data), response.get_json()


def _key(spec) -> str:
    sid = spec["id"]
    return (sid if isinstance(sid, str) else json.dumps(sid, sort_keys=True)) + "." + spec["property"]


def _arg(spec: dict, values: dict):
    sid = spec["id"]
    if isinstance(sid, str) and sid.startswith("{"):
        sid = json.loads(sid)
    if isinstance(sid, dict) and '["ALL"]' in json.dumps(sid):
        return values.get(_key(spec), [])
    return {"id": sid, "property": spec["property"], "value": values.get(_key(spec))}


def _outputs(output: str):
    parts = output.strip(".").split("...") if output.startswith("..") else [output]
    specs = []
    for part in parts:
        sid, _, prop = part.rpartition(".")
        specs.append({"id": json.loads(sid) if sid.startswith("{") else sid, "property": prop})
    return specs if output.startswith("..") else specs[0]


def largest_figure_bytes(response: dict | None) -> int:
    if not response:
        return 0
    sizes = [
        len(json.dumps(v["figure"]))
        for v in response.get("response", {}).values()
        if isinstance(v, dict) and "figure" in v
    ]
    return max(sizes, default=0)


def page_callbacks(client: DashClient, pages, rank, label: str, results: list) -> None:
    for page in pages.values():
        t, size, resp = client.call(
            f"{page.shown_id}.data",
            {f"{page.opened_id}.data": 0, "tick.n_intervals": 1, "selected-rank.data": rank},
            {f"{page.shown_id}.data": None},
        )
        results.append((f"{label}{page.title}", t, size, largest_figure_bytes(resp)))


def first_page_http(app) -> float:
    client = app.server.test_client()
    started = time.perf_counter()
    for url in ("/", "/_dash-layout", "/_dash-dependencies"):
        assert client.get(url).status_code == 200
    dash_client = DashClient(app)
    dash_client.call("page.children", {"url.pathname": "/"}, changed="url.pathname")
    dash_client.call(
        "overview-shown.data",
        {"overview-opened.data": 0, "tick.n_intervals": None, "selected-rank.data": None},
        {"overview-shown.data": None},
    )
    return time.perf_counter() - started


BROWSER_RUNS = 3
# every overview figure drawn (the count is the Overview page's graphs: {graphs}) and the summary cards shown
DRAWN_JS = (
    "const g=document.querySelectorAll('#page .js-plotly-plot');return g.length=={graphs}&&[...g].every(e=>e.querySelector('.main-svg')"
    "&&((e.data&&e.data.length)||(e.layout&&e.layout.annotations&&e.layout.annotations.length)))"
    "&&document.querySelector('#overview-summary .cards')!==null"
)


def first_page_browser(app) -> tuple[list[float], list[float]] | None:
    """Seconds from opening the URL in headless Chromium until every figure of the overview is drawn, in
    ``BROWSER_RUNS`` fresh browsers: with an empty cache (Dash's and plotly's ~6 MB of JavaScript fetched and
    parsed), then a reload with the scripts cached. Returns (empty-cache times, reload times)."""
    if not shutil.which("chromium") or not shutil.which("chromedriver"):
        return None
    from werkzeug.serving import make_server

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = make_server("127.0.0.1", port, app.server, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    cold, warm = [], []
    try:
        for _ in range(BROWSER_RUNS):
            first, again = _two_loads(f"http://127.0.0.1:{port}")
            cold.append(first)
            warm.append(again)
    finally:
        server.shutdown()
    return cold, warm


def _two_loads(base: str) -> tuple[float, float]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(arg)
    from diag.dashboard.pages import PAGES

    drawn_js = DRAWN_JS.replace("{graphs}", str(len(PAGES["/"].graphs)))
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    try:
        driver.get(f"{base}/_dash-layout")  # start the browser process itself, not the app
        times = []
        for _ in range(2):
            started = time.perf_counter()
            driver.get(f"{base}/")
            WebDriverWait(driver, 60, poll_frequency=0.05).until(lambda d: d.execute_script(drawn_js))
            times.append(time.perf_counter() - started)
        return times[0], times[1]
    finally:
        driver.quit()


def _children_cpu_s() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # worker processes, once they are waited for
    return usage.ru_utime + usage.ru_stime


class TreeSampler(threading.Thread):
    """The largest summed PSS of this process and its descendants (the analysis's worker processes), sampled
    every 0.2 s: what measured.py gives diag analyze's process tree."""

    def __init__(self, descendants, pss_bytes):
        super().__init__(daemon=True)
        self.descendants, self.pss_bytes = descendants, pss_bytes
        self.peak, self.stop = 0, threading.Event()

    def run(self):
        while not self.stop.wait(0.2):
            self.peak = max(self.peak, sum(self.pss_bytes(p) for p in self.descendants(os.getpid())))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace_dir", type=Path)
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--format", type=int, default=1, choices=(1, 2), help="trace schema version generated")
    parser.add_argument("--no-browser", action="store_true", help="skip the headless Chromium measurement")
    parser.add_argument("--no-triage", action="store_true", help="skip the triage verdict (minutes at 16,384 ranks)")
    parser.add_argument("--no-cache", action="store_true", help="neither read nor write the report cache")
    add_json_option(parser)
    args = parser.parse_args()
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request would drown the results

    from diag.dashboard.app import create_app
    from diag.dashboard.data import LiveTrace
    from diag.dashboard.pages import PAGES

    if not (args.trace_dir / "planted.json").exists():
        from diag.testing.synthetic import generate

        started = time.perf_counter()
        generate(args.trace_dir, args.ranks, args.steps, trace_format=args.format)
        print(f"generated {args.ranks} ranks x {args.steps} steps in {time.perf_counter() - started:.0f} s")
    planted = json.loads((args.trace_dir / "planted.json").read_text())

    import resource

    from measured import _descendants, _pss_bytes

    from diag.dashboard.pages import prepare

    sampler = TreeSampler(_descendants, _pss_bytes)
    sampler.start()
    started, cpu_started = time.perf_counter(), time.process_time()
    children_started = _children_cpu_s()
    live = LiveTrace(args.trace_dir, poll_interval_s=3600, triage=not args.no_triage, cache=not args.no_cache)
    published = []  # (wall s, CPU s, with its report) of each snapshot the load publishes

    def timed_prepare(snap):
        prepare(snap)
        published.append((time.perf_counter() - started, time.process_time() - cpu_started, snap))

    live.prepare = timed_prepare
    live.refresh()
    load_wall_s, load_cpu_s = time.perf_counter() - started, time.process_time() - cpu_started
    workers_cpu_s = _children_cpu_s() - children_started
    sampler.stop.set()
    sampler.join()
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    load_notes = []
    for wall_s, cpu_s, snap in published[:-1]:
        if snap.report is None:
            what = "before the report (rank states, groups, pickers, step times)"
        elif snap.report_source == "preliminary":
            what = "with the preliminary report from the steps (Overview, Stragglers, pickers; the rest computing)"
        else:
            what = "with the report (every page but Memory and GPU telemetry, whose views are read next)"
        load_notes.append(f"snapshot published {what}: {wall_s:.1f} s wall, {cpu_s:.1f} s CPU here")
    load_notes.append(
        f"server load (read + analyse + aggregate): {load_wall_s:.1f} s wall, {load_cpu_s:.1f} s CPU "
        f"(this process, all threads) + {workers_cpu_s:.1f} s CPU in worker processes, peak RSS {peak_gb:.2f} GB, "
        f"peak PSS of this process and its workers {sampler.peak / 1e9:.2f} GB, "
        f"collectives {'reduced rank by rank' if live.partitioned else 'loaded whole'}, "
        f"report {live.snapshot.report_source or 'computed'}"
    )
    for line in load_notes:
        print(line, flush=True)
    started = time.perf_counter()
    live.wait_for_triage(600)
    load_notes.append(
        f"triage verdict (own thread, not a target): {time.perf_counter() - started:.1f} s more, "
        f"verdict {(live.snapshot.triage or {}).get('verdict')}"
    )
    print(load_notes[-1], flush=True)
    snap = live.snapshot
    ranks, steps = len(snap.trace.ranks_found), snap.trace.steps["step"].nunique()
    app = create_app(args.trace_dir, live=live)

    first_http = first_page_http(app)
    client = DashClient(app)
    results = []
    page_callbacks(client, PAGES, None, "", results)
    heatmap = {"points": [{"customdata": planted["compute_straggler"]}]}
    graph_inputs = [{"id": {"kind": "graph", "name": "stragglers-compute"}, "property": "clickData", "value": heatmap}]
    dep = client.find("selected-rank.data")
    all_key = _key(dep["inputs"][0])
    t, size, resp = client.call(
        "selected-rank.data", {all_key: graph_inputs}, changed='{"kind":"graph","name":"stragglers-compute"}.clickData'
    )
    selected = resp["response"]["selected-rank"]["data"]
    results.append(("select rank by click", t, size, 0))
    page_callbacks(client, PAGES, selected, f"rank {selected} selected: ", results)
    t, size, resp = client.call("status.children", {"tick.n_intervals": 2, "selected-rank.data": selected})
    results.append(("status line", t, size, 0))
    t, size, resp = client.call("group-select.options", {"tick.n_intervals": 3}, {"groups-version.data": None})
    groups = resp["response"]["group-select"]["options"]
    results.append((f"rank groups picker ({len(groups)} groups)", t, size, 0))
    slow_group = max(g["value"] for g in groups if g["value"] <= planted["compute_straggler"])
    t, size, resp = client.call("group-rank-select.options", {"group-select.value": slow_group})
    listed = resp["response"]["group-rank-select"]["options"]
    results.append((f"ranks of the straggler's group ({len(listed)})", t, size, 0))
    assert listed[0]["value"] == planted["compute_straggler"], listed[:3]  # slowest first
    first_browser = None if args.no_browser else first_page_browser(app)

    table = Table("dashboard", ["step", "time", "response", "largest figure"])
    for name, t, size, fig in results:
        table.add(name, f"{t:.3f} s", f"{size / 1024:,.0f} KiB", f"{fig / 1024:,.0f} KiB" if fig else "-")
    table.add(
        "first page ready over HTTP (index, layout, dependencies, router, overview)", f"{first_http:.3f} s", "", ""
    )
    if first_browser is not None:
        cold, warm = first_browser
        for what, times in (("empty browser cache", cold), ("reload, scripts cached", warm)):
            table.add(
                f"first page ready in headless Chromium, {what}: median of {BROWSER_RUNS} fresh browsers",
                f"{statistics.median(times):.2f} s ({min(times):.2f}-{max(times):.2f})",
                "",
                "",
            )
    table.note(
        f"{ranks:,} ranks x {steps:,} steps; planted compute straggler: rank {planted['compute_straggler']}, "
        f"selected by the click: rank {selected}"
    )
    worst_t = max(r[1] for r in results)
    worst_fig = max(r[3] for r in results)
    table.note(
        f"slowest callback: {worst_t:.3f} s (target <= {CALLBACK_LIMIT_S} s: "
        f"{'met' if worst_t <= CALLBACK_LIMIT_S else 'OVER'}); largest figure: {worst_fig / 2**20:.2f} MiB "
        f"(target <= 2 MiB: {'met' if worst_fig <= FIGURE_LIMIT_BYTES else 'OVER'}); first page over HTTP: target "
        f"<= {FIRST_PAGE_LIMIT_S} s"
    )
    if first_browser is None:
        why = "--no-browser" if args.no_browser else "chromium/chromedriver not installed"
        table.note(f"first page ready in a browser: not measured ({why})")
    for line in load_notes:
        table.note(line)
    table.save(args.json)
    live.stop()


if __name__ == "__main__":
    main()
