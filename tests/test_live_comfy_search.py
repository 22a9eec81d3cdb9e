"""Live: ComfyUI's node search in its real front-end, in headless Chromium, as a user searches for our nodes.

Not run by `make test` (marker `comfy`); skipped unless `TOME_COMFY_URL` is set (see tests/test_live_comfy.py for
the server). What it does, per query ("tome", "ToMe", "token merging"): a fresh page, the graph cleared, a double
click on the canvas opens the node search, the query is typed, the results are read in the order shown (and
screenshotted into `TOME_COMFY_SHOTS`, if set), then Enter adds the first one, and the node the graph gained is read
back from the page's `app.graph`. Our node must be the first result and the one added, ahead of ComfyUI's built-in
`TomePatchModel`; the node ids saved workflows use stay `tome_ToMe` / `tome_ToMeAdvanced`.

Needs chromium and chromedriver on PATH (`bash .ci/install-browser.sh`) and selenium (requirements-dev.txt).
Marks the server user's tutorial as done (`POST /settings/Comfy.TutorialCompleted`), so no template browser covers
the canvas on a fresh server.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = [
    pytest.mark.comfy,
    pytest.mark.skipif(not os.environ.get("TOME_COMFY_URL"), reason="TOME_COMFY_URL is not set"),
]

try:
    from selenium import webdriver
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
except ImportError:  # a machine without the dev requirements: the fixture skips
    webdriver = None

URL = os.environ.get("TOME_COMFY_URL", "").rstrip("/")
SHOTS = os.environ.get("TOME_COMFY_SHOTS")
#: query -> the node the search must put first (and Enter must add).
EXPECTED = {"tome": "tome_ToMe", "ToMe": "tome_ToMe", "token merging": "tome_ToMeAdvanced"}
SEARCH_INPUT = ".comfy-vue-node-search-container input"


def wait_for(what: str, get: Callable[[], Any], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = get()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    if webdriver is None:
        pytest.skip("selenium is not installed")
    chromium = shutil.which(os.environ.get("TOME_CHROMIUM") or "chromium") or shutil.which("chromium-browser")
    chromedriver = shutil.which(os.environ.get("TOME_CHROMEDRIVER") or "chromedriver")
    if not (chromium and chromedriver):
        pytest.skip("no chromium/chromedriver on PATH (bash .ci/install-browser.sh)")
    request = urllib.request.Request(
        f"{URL}/settings/Comfy.TutorialCompleted", data=b"true", headers={"Content-Type": "application/json"}
    )
    urllib.request.urlopen(request, timeout=30).close()
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1400,1000",
        f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}",
    ):
        options.add_argument(flag)
    browser = webdriver.Chrome(service=webdriver.ChromeService(executable_path=chromedriver), options=options)
    try:
        yield browser
    finally:
        browser.quit()


def open_search(driver: Any) -> Any:
    """A fresh page with an empty graph, and the node search opened by a double click on the canvas."""
    driver.get(URL + "/")
    wait_for("the app", lambda: driver.execute_script("return !!(window.app && window.app.graph && window.app.canvas)"))
    driver.execute_script("window.app.graph.clear(); window.app.canvas.setDirty(true, true);")
    canvas = wait_for("the canvas", lambda: driver.find_elements(By.CSS_SELECTOR, "#graph-canvas"))[0]
    ActionChains(driver).move_to_element_with_offset(canvas, 0, 0).double_click().perform()
    return wait_for("the node search box", lambda: driver.find_elements(By.CSS_SELECTOR, SEARCH_INPUT))[0]


def node_types(driver: Any) -> list[str]:
    return driver.execute_script("return window.app.graph._nodes.map((n) => n.type)")


def results(driver: Any) -> list[str]:
    """The results as shown, top first: each one's display name and, after a tab, its source chip."""
    script = """
        return [...document.querySelectorAll('.option-container')].map((el) => {
            // the first line: the display name, a no-break space, then the id tag when the setting shows it
            const name = el.querySelector('.option-display-name > div').textContent.split('\\u00a0')[0].trim();
            const chip = el.querySelector('.option-badges .p-chip');
            return name + '\\t' + (chip ? chip.textContent.trim() : '');
        })
    """
    return driver.execute_script(script)


def settled_results(driver: Any, query: str) -> list[str]:
    """The result list once it stopped changing (the search runs as the user types)."""
    last: list[str] = []
    stable_since = time.monotonic()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        now = results(driver)
        if now != last:
            last, stable_since = now, time.monotonic()
        elif now and time.monotonic() - stable_since > 1.0:
            return now
        time.sleep(0.1)
    pytest.fail(f"no settled results for {query!r}; last: {last}")


@pytest.mark.parametrize("query", list(EXPECTED))
def test_our_node_is_the_first_result_and_enter_adds_it(driver: Any, query: str) -> None:
    with urllib.request.urlopen(f"{URL}/object_info/{EXPECTED[query]}", timeout=30) as response:
        info = json.load(response)
    display = info[EXPECTED[query]]["display_name"]
    box = open_search(driver)
    assert node_types(driver) == []
    box.send_keys(query)
    shown = settled_results(driver, query)
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(SHOTS) / f"comfy-search-{query.replace(' ', '_')}.png"))
        (Path(SHOTS) / f"comfy-search-{query.replace(' ', '_')}.txt").write_text("\n".join(shown) + "\n")
    names = [line.split("\t")[0] for line in shown]
    assert names[0] == display, shown
    builtin = [i for i, name in enumerate(names) if name == "TomePatchModel"]
    assert all(i > 0 for i in builtin), shown
    box.send_keys(Keys.ENTER)
    added = wait_for("the added node", lambda: node_types(driver))
    assert added == [EXPECTED[query]], (added, shown)
