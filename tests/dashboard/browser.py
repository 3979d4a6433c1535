"""Helpers to read what a Dash page drew in the browser: figures' traces and layout, text, waiting."""

from __future__ import annotations

import json

from selenium.webdriver.support.ui import WebDriverWait

WAIT_S = 40


def graph_dom_id(name: str) -> str:
    return json.dumps({"kind": "graph", "name": name}, separators=(",", ":"), sort_keys=True)


def wait_for(driver, condition, what: str, timeout_s: float = WAIT_S):
    return WebDriverWait(driver, timeout_s, poll_frequency=0.1).until(
        lambda d: condition(d), message=f"timed out waiting for {what}"
    )


def open_page(driver, url: str, graphs: int) -> None:
    """Open ``url`` and wait until the page shows ``graphs`` drawn figures."""
    driver.get(url)
    wait_for(
        driver, lambda d: drawn_graphs(d) >= graphs and graphs_with_data(d) >= graphs, f"{graphs} figures at {url}"
    )


def drawn_graphs(driver) -> int:
    return driver.execute_script(
        "return [...document.querySelectorAll('#page .js-plotly-plot')].filter(e => e.querySelector('.main-svg')).length"
    )


def graphs_with_data(driver) -> int:
    """Figures that received their content (traces, or a message annotation) from the server."""
    return driver.execute_script(
        "return [...document.querySelectorAll('#page .js-plotly-plot')]"
        ".filter(e => (e.data && e.data.length) || (e.layout && e.layout.annotations && e.layout.annotations.length)).length"
    )


def figure(driver, name: str) -> dict | None:
    """The figure as plotly.js drew it (``_fullData``: arrays sent as base64 are decoded there): traces and
    annotation texts. None while the page has no such figure (yet: a client-side navigation swaps the page after
    the click)."""
    script = """
    const holder = document.getElementById(arguments[0]);
    const gd = holder && holder.querySelector('.js-plotly-plot');
    if (!gd || !gd._fullData) return null;
    const plain = v => (ArrayBuffer.isView(v) ? Array.from(v) : Array.isArray(v) ? v.map(plain) : v);
    return {
      data: gd._fullData.map(t => ({name: t.name, type: t.type, x: plain(t.x), y: plain(t.y), z: plain(t.z), customdata: plain(t.customdata)})),
      annotations: (gd.layout.annotations || []).map(a => a.text),
      title: gd.layout.title && gd.layout.title.text,
    };
    """
    return driver.execute_script(script, graph_dom_id(name))


def text(driver, element_id: str) -> str:
    return driver.execute_script(
        "const e = document.getElementById(arguments[0]); return e ? e.innerText : null", element_id
    )


def status(driver) -> str:
    return text(driver, "status") or ""


def click_point(driver, name: str, x, y) -> None:
    """A real mouse click at data coordinates (x, y) of a figure's first subplot."""
    from selenium.webdriver import ActionChains

    script = """
    const gd = document.getElementById(arguments[0]).querySelector('.js-plotly-plot');
    gd.scrollIntoView({block: 'center', behavior: 'instant'});  // fully in view: offsets are from its centre
    const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis, box = gd.getBoundingClientRect();
    return [xa._offset + xa.l2p(arguments[1]) - box.width / 2, ya._offset + ya.l2p(arguments[2]) - box.height / 2];
    """
    dx, dy = driver.execute_script(script, graph_dom_id(name), x, y)
    target = driver.find_element(
        "css selector", f'[id="{graph_dom_id(name).replace(chr(34), chr(92) + chr(34))}"] .js-plotly-plot'
    )
    ActionChains(driver).move_to_element_with_offset(target, int(dx), int(dy)).pause(0.3).click().perform()
