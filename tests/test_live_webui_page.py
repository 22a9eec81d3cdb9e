"""The real WebUI page in headless Chromium, with the extension installed: what a user sees and what the page sends.

Not run by `make test` (marker `webui`); skipped unless `TOME_WEBUI_URL` is set (the server of tests/test_live_webui.py)
and Debian's chromium and chromedriver are on PATH (`bash .ci/install-browser.sh`). `TOME_WEBUI_EVIDENCE`: a folder
that receives a screenshot of the accordion set to Custom.

Checks: the accordion is in txt2img's and img2img's settings; opening it enables ToMe and choosing Custom shows the
detailed settings and a token hint for the page's size; every call our events make sends exactly the values its
endpoint declares (read from the server's `/config` and `/info`); no console message comes from our events. On
gradio 4.x the page's client logs `Too many arguments provided for the endpoint.` for every event that sends a value,
whatever its endpoint declares (it looks a numeric `fn_index` up among unnamed endpoints, of which 4.x has none:
gradio-app/gradio#9895): so our calls must send none, and each such warning must match one of the host's calls.

Run: `TOME_WEBUI_URL=http://127.0.0.1:7861 python -m pytest -m webui tests/test_live_webui_page.py -v`.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

pytestmark = [
    pytest.mark.webui,
    pytest.mark.skipif(not os.environ.get("TOME_WEBUI_URL"), reason="TOME_WEBUI_URL is not set"),
]

URL = os.environ.get("TOME_WEBUI_URL", "").rstrip("/")
ARCH = os.environ.get("TOME_WEBUI_ARCH", "sd15")  # as test_live_webui reads it
GRADIO_4_WARNING = "Too many arguments provided for the endpoint."
OUR_SCRIPT = "/tome.js"
WAIT_S = 120.0


def ours(elem_id: Any) -> bool:
    return isinstance(elem_id, str) and elem_id.startswith(("script_txt2img_tome_", "script_img2img_tome_"))


@dataclass
class Endpoints:
    """The page's events (`/config` dependencies) and what each endpoint declares (`/info`, every endpoint)."""

    version: str
    dependencies: dict[int, dict[str, Any]]
    elem_ids: dict[int, Any]
    declared: dict[str, int] = field(default_factory=dict)

    @classmethod
    def read(cls) -> Endpoints:
        with urllib.request.urlopen(f"{URL}/config", timeout=60) as response:
            config = json.loads(response.read())
        elem_ids = {c["id"]: c.get("props", {}).get("elem_id") for c in config["components"]}
        # gradio 3.x numbers its events by position (its calls send that fn_index); 4.x gives each an id
        dependencies = {d.get("id", i): d for i, d in enumerate(config["dependencies"])}
        endpoints = cls(config.get("version", ""), dependencies, elem_ids)
        if not endpoints.version.startswith("3."):
            with urllib.request.urlopen(f"{URL}/info?all_endpoints=True", timeout=60) as response:
                info = json.loads(response.read())
            endpoints.declared = {name: len(e["parameters"]) for name, e in info["named_endpoints"].items()}
        return endpoints

    def is_ours(self, fn_index: int) -> bool:
        dep = self.dependencies[fn_index]
        targets = [t[0] if isinstance(t, (list, tuple)) else t for t in dep["targets"]]  # 3.x: bare ids
        ids = targets + list(dep["inputs"]) + list(dep["outputs"])
        return any(ours(self.elem_ids.get(i)) for i in ids)

    def declares(self, fn_index: int) -> int | None:
        name = self.dependencies[fn_index].get("api_name")
        return self.declared.get(f"/{name}") if name else None


@dataclass(frozen=True)
class Call:
    fn_index: int
    sent: int


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    try:
        from selenium import webdriver
    except ImportError as exc:
        pytest.skip(f"selenium is not installed ({exc})")
    chromium, chromedriver = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not chromedriver:
        pytest.skip("no chromium/chromedriver on PATH (bash .ci/install-browser.sh)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,2400"):
        options.add_argument(flag)
    options.add_argument("--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1")  # offline: the CDN fails at once
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    browser = webdriver.Chrome(service=webdriver.ChromeService(chromedriver), options=options)
    try:
        yield browser
    finally:
        browser.quit()


class Page:
    """The loaded page: its console messages and the event calls it posted, read after each step."""

    def __init__(self, driver: Any) -> None:
        self.driver = driver
        self.console: list[dict[str, Any]] = []
        self.calls: list[Call] = []

    def drain(self) -> tuple[list[dict[str, Any]], list[Call]]:
        console = self.driver.get_log("browser")
        calls = []
        for entry in self.driver.get_log("performance"):
            message = json.loads(entry["message"])["message"]
            if message["method"] != "Network.requestWillBeSent":
                continue
            request = message["params"]["request"]
            if request["method"] == "POST" and ("/queue/join" in request["url"] or "/run/predict" in request["url"]):
                body = json.loads(request.get("postData") or "{}")
                if "fn_index" in body:
                    calls.append(Call(body["fn_index"], len(body.get("data") or [])))
        self.console += console
        self.calls += calls
        return console, calls

    def element(self, elem_id: str) -> Any:
        from selenium.webdriver.common.by import By

        found = self.driver.find_elements(By.ID, elem_id)
        return found[0] if found else None


def settle(page: Page, quiet_s: float = 3.0) -> None:
    """Wait until the page has posted no call for `quiet_s` (a CPU WebUI answers in tenths of a second)."""
    deadline, last = time.monotonic() + WAIT_S, time.monotonic()
    while time.monotonic() - last < quiet_s and time.monotonic() < deadline:
        time.sleep(0.5)
        console, calls = page.drain()
        if calls or console:
            last = time.monotonic()


@pytest.fixture(scope="module")
def page(driver: Any) -> Page:
    driver.get(URL)
    page = Page(driver)
    deadline = time.monotonic() + WAIT_S
    while page.element("script_txt2img_tome_enable") is None:
        assert time.monotonic() < deadline, "the page has no ToMe accordion"
        time.sleep(0.5)
    settle(page)
    return page


@pytest.fixture(scope="module")
def custom(page: Page) -> Page:
    """The txt2img accordion opened and set to Custom."""
    from selenium.webdriver.common.by import By

    accordion = page.element("script_txt2img_tome_enable")
    page.driver.execute_script("arguments[0].scrollIntoView({block: 'start'})", accordion)
    accordion.find_element(By.CSS_SELECTOR, ".label-wrap").click()
    settle(page)
    radio = page.element("script_txt2img_tome_preset")
    [label] = [x for x in radio.find_elements(By.TAG_NAME, "label") if x.text.strip().lower() == "custom"]
    label.click()
    settle(page)
    evidence = os.environ.get("TOME_WEBUI_EVIDENCE")
    if evidence:
        Path(evidence).mkdir(parents=True, exist_ok=True)
        page.driver.execute_script("arguments[0].scrollIntoView({block: 'start'})", accordion)
        page.driver.save_screenshot(str(Path(evidence, "page-custom.png")))
    return page


def test_accordion_in_both_tabs(page: Page) -> None:
    from selenium.webdriver.common.by import By

    for tab in ("txt2img", "img2img"):
        accordion = page.element(f"script_{tab}_tome_enable")
        assert accordion is not None
        assert page.driver.execute_script(f"return !!arguments[0].closest('#{tab}_settings')", accordion)
        assert "Token Merging (ToMe)" in accordion.find_element(By.CSS_SELECTOR, ".label-wrap").get_attribute(
            "textContent"
        )


def test_custom_shows_the_settings_and_a_hint_for_the_page_size(custom: Page) -> None:
    from selenium.webdriver.common.by import By

    checkbox = custom.driver.find_element(By.CSS_SELECTOR, "#script_txt2img_tome_enable input[type=checkbox]")
    assert checkbox.is_selected()  # opening the accordion turned ToMe on
    assert custom.element("script_txt2img_tome_custom").is_displayed()
    assert custom.element("script_txt2img_tome_ratio").is_displayed()
    width, height = (
        int(custom.driver.find_element(By.CSS_SELECTOR, f"#txt2img_{side} input[type=number]").get_attribute("value"))
        for side in ("width", "height")
    )
    hint = custom.element("script_txt2img_tome_cap_note").text
    # The first level with transformer blocks: SDXL has none at 1/1.
    first = 2 if ARCH == "sdxl" else 1
    tokens = (width // 8 // first) * (height // 8 // first)
    assert f"{tokens} → {tokens - int(tokens * 0.5)} tokens at 1/{first}" in hint, hint


def test_our_events_send_what_their_endpoints_declare(custom: Page) -> None:
    endpoints = Endpoints.read()
    our_calls = [call for call in custom.calls if endpoints.is_ours(call.fn_index)]
    assert our_calls, "none of our events reached the server"
    if endpoints.version.startswith("3."):
        return  # gradio 3.x has no API info per event; its client warns about nothing of this kind
    mismatched = {
        endpoints.dependencies[c.fn_index]["api_name"]: (c.sent, endpoints.declares(c.fn_index))
        for c in our_calls
        if c.sent != endpoints.declares(c.fn_index)
    }
    assert mismatched == {}, "sent vs declared"


def test_console_has_nothing_from_us(custom: Page) -> None:
    """No message from tome.js, and none of gradio 4.x's warnings comes from our events (gradio#9895: one per call
    that sends values, whatever the endpoint declares, so our calls must send none)."""
    from_us = [m for m in custom.console if OUR_SCRIPT in m["message"]]
    assert from_us == []
    endpoints = Endpoints.read()
    warnings = [m for m in custom.console if GRADIO_4_WARNING in m["message"]]
    if endpoints.version.startswith("3."):
        assert warnings == []
        return
    ours_with_values = [c for c in custom.calls if c.sent > 0 and endpoints.is_ours(c.fn_index)]
    hosts_with_values = [c for c in custom.calls if c.sent > 0 and not endpoints.is_ours(c.fn_index)]
    assert ours_with_values == []
    assert len(warnings) == len(hosts_with_values)  # every warning is the host's own


# ---------------------------------------------------------------------------------------------- the hint at the size


def note_text(page: Page) -> list[str]:
    """The note's lines as the page shows them (its tooltip aside)."""
    return page.driver.execute_script(
        "var note = document.querySelector('#script_txt2img_tome_cap_note .tome-cap-note');"
        " return note ? note.innerHTML.split('<br>').map(function(part) {"
        "   var div = document.createElement('div'); div.innerHTML = part; return div.textContent; }) : [];"
    )


def set_number(page: Page, elem_id: str, value: int) -> None:
    """Type into a slider's number box as a user would (select all, type, leave the box)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    box = page.driver.find_element(By.CSS_SELECTOR, f"#{elem_id} input[type=number]")
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys(str(value), Keys.TAB)
    settle(page)


def set_hires(page: Page, on: bool) -> None:
    """The WebUI's Hires fix accordion: its visible checkbox, as a user ticks it."""
    from selenium.webdriver.common.by import By

    box = page.driver.find_element(By.CSS_SELECTOR, "#txt2img_hr-visible-checkbox")
    if box.is_selected() != on:
        box.click()
    settle(page)


def test_the_preset_hint_gives_the_figures_at_the_page_size(page: Page) -> None:
    """Issue 44 as a user tries it: the default preset's line under Speed for the loaded model at 512 and 1024 px,
    then with Hires fix on (the WebUI's "Upscale by" 2): the figures the speed table has at that size, the hires
    pass's at its target in the same line, exactly `preset_hint`'s words for the loaded family on the server's
    device (`TOME_WEBUI_DEVICE`, "cpu" by default). Screenshots of each (`TOME_WEBUI_EVIDENCE`: hint-512.png,
    hint-512-hires.png, hint-1024.png, hint-1024-hires.png)."""
    from selenium.webdriver.common.by import By

    from tome_core import DEFAULT_PRESET
    from tome_core.words import preset_hint

    family = "sdxl" if ARCH == "sdxl" else "sd"
    device = os.environ.get("TOME_WEBUI_DEVICE", "cpu")
    accordion = page.element("script_txt2img_tome_enable")
    checkbox = page.driver.find_element(By.CSS_SELECTOR, "#script_txt2img_tome_enable input[type=checkbox]")
    if not checkbox.is_selected():
        page.driver.execute_script("arguments[0].scrollIntoView({block: 'start'})", accordion)
        accordion.find_element(By.CSS_SELECTOR, ".label-wrap").click()
        settle(page)
    radio = page.element("script_txt2img_tome_preset")
    [label] = [
        x
        for x in radio.find_elements(By.TAG_NAME, "label")
        if x.find_element(By.TAG_NAME, "input").get_attribute("value") == DEFAULT_PRESET
    ]
    label.click()
    settle(page)
    evidence = os.environ.get("TOME_WEBUI_EVIDENCE")
    seen = {}
    for side in (512, 1024):
        for hires in (False, True):
            set_hires(page, hires)
            set_number(page, "txt2img_width", side)
            set_number(page, "txt2img_height", side)
            target = (2 * side, 2 * side) if hires else None
            expected = preset_hint(DEFAULT_PRESET, family, (side, side), device, hires=target)
            deadline = time.monotonic() + WAIT_S
            while note_text(page) != [expected] and time.monotonic() < deadline:
                time.sleep(0.5)
            seen[(side, hires)] = note_text(page)
            assert seen[(side, hires)] == [expected], (side, hires)
            if evidence:
                Path(evidence).mkdir(parents=True, exist_ok=True)
                note = page.element("script_txt2img_tome_cap_note")
                page.driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", note)
                name = f"hint-{side}{'-hires' if hires else ''}.png"
                page.driver.save_screenshot(str(Path(evidence, name)))
    set_hires(page, False)
    assert not any("stand-in" in line or "\u00d7 less" in line for lines in seen.values() for line in lines)
