"""javascript/tome.js in headless Chromium, on a gradio 3.41 page that mounts the real accordion (tests/browser/page.py).

Checks: every control has a hover hint (the field ones are the tome_core FieldSpec help texts); the Hires fix pass
group shows only while the WebUI's Hires fix is on; the speed selectors show the detailed settings only for Custom;
for a preset, the note says in one line, in the user's words, what it gains and changes, as `preset_hint`
(tome_core/words.py) makes it from the speed table, for the size set and, while the Hires fix runs the same preset,
its target size (too small to merge somewhere: said), and own hires settings at the same preset add no line; the tokens per level (made in Python from the values tome.js
sends) match `tome_core.describe()` on the real SD1.5 and SDXL UNet architectures as each control changes (width,
height, Hires fix and its size, every ToMe setting and preset), for the first pass and the hires pass: under the
note for Custom settings, in the note's tooltip for presets (per model family); settings the core refuses (a ratio
the strides cannot reach) show its message in the note;
tome.js starts no timer, and no interval runs on the page once it has loaded; after every kind of click (presets,
Custom's controls, Hires fix, the size sliders) the page settles: the change's own round trips, then no call at all
while the user does nothing (counted on the server, with each call held as a busy WebUI holds it, so gradio's
pending and progress elements come and go inside the note's wrapper as in the real page).

Run:  .venv/bin/python -m pytest -m browser tests/test_browser_ui.py
Needs Debian's chromium and chromium-driver (`bash .ci/install-browser.sh`) and selenium (requirements-dev.txt).
Without them the tests skip, unless TOME_REQUIRE_BROWSER=1 (CI), which makes that a failure. Other variables:
TOME_CHROMIUM / TOME_CHROMEDRIVER (paths), TOME_UI_SCREENSHOT=/tmp/tome_ui.png (a PNG of the page with the
accordion open and Hires fix on).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tome_bench import archs
from tome_core import DEFAULT_PRESET, TomeConfig, describe, get_preset
from tome_core.words import preset_hint
from tome_webui.params import field_of, spec
from tome_webui.ui import ELEM_ITEMS, HIRES_PRESET_HELP, PRESET_HELP, preset_tooltip

SELENIUM_ERROR = ""
try:
    from selenium import webdriver
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
except ImportError as exc:  # skipped (or failed, on CI) in the fixture, not at collection
    webdriver = None
    SELENIUM_ERROR = str(exc)

#: One gradio server and one Chromium for them all: under pytest-xdist (--dist loadgroup) one worker runs them;
#: `make test` runs them in a pytest process of their own (tests/run_suite.py).
pytestmark = [pytest.mark.browser, pytest.mark.xdist_group("browser")]

REPO_DIR = Path(__file__).resolve().parents[1]
PAGE = REPO_DIR / "tests" / "browser" / "page.py"
REQUIRE = os.environ.get("TOME_REQUIRE_BROWSER", "") not in ("", "0")
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",  # CI runs as root
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,1700",
    # Offline and quick: every host but the page's fails at once (gradio's page asks a CDN for iframe-resizer).
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
)
#: Elements that hold controls but are none themselves, and the hidden textbox tome.js writes the page values into.
CONTAINERS = frozenset({"cap_note", "custom", "advanced", "hires", "hr_settings", "hr_custom", "page_values"})
#: Controls that are not TomeConfig fields, and their hint texts (None: tome.js's own, at least 60 characters).
OWN_HINTS: dict[str, str | None] = {
    "enable": None,
    "hr_mode": None,
    "preset": PRESET_HELP,
    "hr_preset": HIRES_PRESET_HELP,
}
WAIT_S = 15.0
#: How long the test page holds each event call: a WebUI busy on 2 cores answers in a few tenths of a second, long
#: enough for gradio to show its pending state and progress text inside the note's wrapper while the call is out.
CALL_DELAY_S = 0.25
#: A change's own calls are over once none came for this long (the delay, plus the page's and server's work).
SETTLED_S = 0.8
#: Then no call may come in this window while nobody touches the page.
QUIET_S = 1.5


def need(ok: Any, reason: str) -> None:
    if not ok:
        if REQUIRE:
            pytest.fail(f"{reason} (TOME_REQUIRE_BROWSER is set)")
        pytest.skip(reason)


def wait_for(what: str, get: Callable[[], Any], ok: Callable[[Any], bool], timeout: float = WAIT_S) -> Any:
    """Poll `get()` until `ok(value)`; fail with the last value seen."""
    deadline = time.monotonic() + timeout
    while True:
        value = get()
        if ok(value):
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}; last value: {value!r}")
        time.sleep(0.05)


# ---------------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def browser_paths() -> tuple[str, str]:
    """(chromium, chromedriver); checked before anything starts, so a skip costs nothing."""
    need(webdriver is not None, f"selenium is not installed ({SELENIUM_ERROR})")
    chromium = shutil.which(os.environ.get("TOME_CHROMIUM") or "chromium") or shutil.which("chromium-browser")
    chromedriver = shutil.which(os.environ.get("TOME_CHROMEDRIVER") or "chromedriver")
    need(chromium, "no chromium on PATH (bash .ci/install-browser.sh, or set TOME_CHROMIUM)")
    need(chromedriver, "no chromedriver on PATH (bash .ci/install-browser.sh, or set TOME_CHROMEDRIVER)")
    return chromium, chromedriver


@pytest.fixture(scope="module")
def page_url(browser_paths: tuple[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Serve tests/browser/page.py on 127.0.0.1 (a free port) in a subprocess: its gradio patches stay there."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log_path = tmp_path_factory.mktemp("page") / "page.log"
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "PYTHONUNBUFFERED": "1"}
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, str(PAGE), "--port", str(port), "--delay", str(CALL_DELAY_S)],
            cwd=REPO_DIR,
            env=env,
            stdout=log,
            stderr=log,
        )
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 180  # importing torch and gradio takes a while on 2 busy cores
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the test page exited with {proc.returncode}:\n{log_path.read_text()[-4000:]}")
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"the test page did not come up:\n{log_path.read_text()[-4000:]}")
            time.sleep(0.25)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def driver(browser_paths: tuple[str, str], page_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    chromium, chromedriver = browser_paths
    options = webdriver.ChromeOptions()
    options.binary_location = chromium  # with the driver's path below, selenium never downloads a browser
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    try:
        browser = webdriver.Chrome(service=webdriver.ChromeService(executable_path=chromedriver), options=options)
    except WebDriverException as exc:
        pytest.fail(f"chromium did not start: {exc.msg}")
    try:
        yield browser
    finally:
        browser.quit()


@pytest.fixture
def page(driver: Any, page_url: str) -> Any:
    """A freshly loaded page, once tome.js has run (the token hints exist in both tabs)."""
    driver.get(page_url)
    wait_for(
        "tome.js to set up both tabs",
        lambda: driver.execute_script(
            "return !!document.getElementById('script_txt2img_tome_token_hint')"
            " && !!document.getElementById('script_img2img_tome_token_hint')"
        ),
        bool,
        timeout=30,
    )
    yield driver
    errors = [
        entry["message"]
        for entry in driver.get_log("browser")
        if entry["level"] == "SEVERE" and entry.get("source") != "network"  # the CDN script the page cannot load
    ]
    assert not errors, f"errors in the browser console: {errors}"


# ---------------------------------------------------------------------------------------------- helpers


def ours(tab: str, item: str) -> str:
    return f"script_{tab}_tome_{item}"


def element(driver: Any, css: str) -> Any:
    return driver.find_element(By.CSS_SELECTOR, css)


def title_of(driver: Any, css: str) -> str:
    return driver.execute_script("var e = document.querySelector(arguments[0]); return e ? e.title : null;", css)


def note_lines(driver: Any, tab: str = "txt2img") -> list[str]:
    """The note's lines above the token hint (read as the text between its line breaks)."""
    return driver.execute_script(
        "var note = document.querySelector(arguments[0]);"
        " return note ? note.innerHTML.split('<br>').map(function(part) {"
        "   var div = document.createElement('div'); div.innerHTML = part; return div.textContent; }) : [];",
        f"#{ours(tab, 'cap_note')} .tome-cap-note",
    )


def note_title(driver: Any, tab: str = "txt2img") -> str:
    return title_of(driver, f"#{ours(tab, 'cap_note')} .tome-cap-note") or ""


def note_refuses(driver: Any, tab: str = "txt2img") -> str:
    """The note's refusal (the core's message) while it shows one, marked `tome-invalid`; else ""."""
    return driver.execute_script(
        "var note = document.querySelector(arguments[0]);"
        " return note && note.classList.contains('tome-invalid') ? note.textContent : '';",
        f"#{ours(tab, 'cap_note')} .tome-cap-note",
    )


def hint_lines(driver: Any, tab: str = "txt2img") -> list[str]:
    """The token hint's lines (a div each; read as textContent, which a tab not shown has too)."""
    return driver.execute_script(
        "var hint = document.getElementById(arguments[0]);"
        " return hint ? Array.from(hint.children).map(function(line) { return line.textContent; }) : [];",
        ours(tab, "token_hint"),
    )


def type_number(driver: Any, elem_id: str, value: float) -> None:
    """Type into a slider's number box as a user would (select all, type, leave the box)."""
    box = element(driver, f"#{elem_id} input[type=number]")
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys(str(value), Keys.TAB)
    wait_for(f"{elem_id} to hold {value}", lambda: float(box.get_property("value") or "nan"), lambda v: v == value)


def click_radio(driver: Any, elem_id: str, value: str) -> None:
    element(driver, f"#{elem_id} input[value='{value}']").click()


def toggle_accordion(driver: Any, accordion_id: str, on: bool) -> None:
    """Click the InputAccordion's visible checkbox, as a user turns it on or off."""
    box = element(driver, f"#{accordion_id}-visible-checkbox")
    if box.is_selected() != on:
        box.click()
    hidden = f"#{accordion_id}-checkbox input"
    wait_for(
        f"{accordion_id} to be {on}",
        lambda: driver.execute_script(f"return document.querySelector('{hidden}').checked"),
        lambda v: v == on,
    )


def displayed(driver: Any, elem_id: str) -> bool:
    return element(driver, f"#{elem_id}").is_displayed()


def server_calls(page_url: str) -> list[dict[str, Any]]:
    """Every event call the page has made so far, as the server logged it: `{"t", "path", "fn_index"}`."""
    with urllib.request.urlopen(f"{page_url}tome-test/calls", timeout=5) as response:
        return json.load(response)["calls"]


def event_names(driver: Any) -> dict[str, str]:
    """What each event is, by its fn_index (as a string): the elem_ids of its triggers and of its outputs."""
    return driver.execute_script(
        "var config = window.gradio_config, ids = {};"
        " config.components.forEach(function(c) { ids[c.id] = (c.props && c.props.elem_id) || c.type + ' ' + c.id; });"
        " var names = {};"
        " config.dependencies.forEach(function(d, i) {"
        "   names[i] = d.targets.map(function(t) { return ids[Array.isArray(t) ? t[0] : t]; }).join(',') + '.'"
        "     + d.trigger + ' -> ' + d.outputs.map(function(o) { return ids[o]; }).join(','); });"
        " return names;"
    )


def settles(driver: Any, page_url: str, what: str, action: Callable[[], Any], most: int) -> None:
    """Do `action` (a user's click or edit): it may make at most `most` calls (one round trip per event the change
    fires), which must be over within WAIT_S, and then no call may come for QUIET_S while nobody touches the page."""
    start = len(server_calls(page_url))
    began = time.time()
    action()
    deadline = began + WAIT_S
    while True:  # the change's own calls are over once none came for SETTLED_S
        calls = server_calls(page_url)[start:]
        last = calls[-1]["t"] if calls else began
        if time.time() - last > SETTLED_S or time.time() > deadline:
            break
        time.sleep(0.05)
    time.sleep(QUIET_S)
    later = server_calls(page_url)[start + len(calls) :]
    names = event_names(driver)
    made = [names.get(str(call["fn_index"]), call["fn_index"]) for call in calls]
    assert not later, (
        f"{what}: {len(later)} calls in the {QUIET_S:g} s after it settled, while nobody touched the page"
        f" ({len(calls)} before that, {len(calls) / (time.time() - began - QUIET_S):.1f}/s); first calls: {made[:6]}"
    )
    assert len(calls) <= most, f"{what}: {len(calls)} calls, at most {most} expected: {made}"


def hint_answers_last_send(driver: Any, tab: str) -> bool:
    """Whether the token hint answers the page values tome.js sent last (nothing lost, nothing pending)."""
    return driver.execute_script(
        "var box = document.querySelector(arguments[0]), hint = document.getElementById(arguments[1]);"
        " return !!(box && hint && box.value && JSON.parse(box.value).send == hint.getAttribute('data-tome-send'));",
        f"#{ours(tab, 'page_values')} textarea",
        ours(tab, "token_hint"),
    )


@functools.cache
def real_unet(arch: str) -> Any:
    """The real SD1.5 or SDXL UNet architecture, on the meta device: no weights, built in a fraction of a second."""
    import torch
    from diffusers import UNet2DConditionModel

    with torch.device("meta"):
        return UNet2DConditionModel(**archs.get_arch(arch).config)


def merged(arch: str, width: int, height: int, config: TomeConfig, with_unit: bool) -> str:
    """tome_core.describe()'s merging levels as tome.js lists them."""
    # The WebUI's latent is pixels // 8; describe() rounds up, so give it whole latent pixels.
    height, width = height // 8 * 8, width // 8 * 8
    unit = " keys/values" if config.mode == "kv" else " tokens"
    infos = [info for info in describe(real_unet(arch), height, width, config) if info.merging]
    return ", ".join(
        f"{i.tokens} \u2192 {i.tokens_after}{unit if with_unit and n == 0 else ''} at 1/{i.level}"
        for n, i in enumerate(infos)
    )


def expected_line(width: int, height: int, **values: Any) -> str:
    """The token hint tome.js must show: tome_core.describe() on SD1.5, and for max_downsample 'auto' on SDXL too."""
    config = TomeConfig(**values)
    text = merged("sd15", width, height, config, True)
    if config.max_downsample == "auto":
        text += f" (SDXL: {merged('sdxl', width, height, config, False)})"
    return text


def expected_families(width: int, height: int, configs: dict[str, TomeConfig]) -> str:
    """The token hint for a preset: each model family with its own config, on its real architecture."""
    return (
        f"SD1/SD2: {merged('sd15', width, height, configs['sd'], True)};"
        f" SDXL: {merged('sdxl', width, height, configs['sdxl'], True)}"
    )


def preset_configs(name: str) -> dict[str, TomeConfig]:
    """A preset per model family (the Hires fix pass runs the same values)."""
    return {family: get_preset(name).config(family) for family in ("sd", "sdxl")}


# ---------------------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("tab", ["txt2img", "img2img"])
def test_every_control_has_a_hover_hint(page: Any, tab: str) -> None:
    items = [item for item in ELEM_ITEMS if item not in CONTAINERS]
    if tab == "img2img":
        items = [item for item in items if not item.startswith("hr_")]
    missing, wrong = [], []
    for item in items:
        # The InputAccordion's checkbox is hidden; its hint sits on the label row with the visible checkbox.
        css = f"#{ours(tab, item)} > .label-wrap" if item == "enable" else f"#{ours(tab, item)}"
        title = title_of(page, css)
        if title is None:
            missing.append(css)
        elif item in OWN_HINTS:  # not TomeConfig fields
            if (OWN_HINTS[item] is None and len(title) < 60) or OWN_HINTS[item] not in (None, title):
                wrong.append((item, title))
        elif title != spec(field_of(item)).help:  # single source: the FieldSpec help, through tooltip=
            wrong.append((item, title))
    assert not missing, f"controls not on the page: {missing}"
    assert not wrong, f"controls without their hover hint: {wrong}"
    assert "SDXL" in title_of(page, f"#{ours(tab, 'token_hint')}")


def test_hires_group_follows_hires_fix(page: Any) -> None:
    toggle_accordion(page, ours("txt2img", "enable"), True)
    click_radio(page, ours("txt2img", "preset"), "custom")  # the token hint shows Custom's tokens per level
    wait_for("the custom settings to show", lambda: displayed(page, ours("txt2img", "custom")), bool)
    group = ours("txt2img", "hires")
    assert not displayed(page, group), "Hires fix is off: the ToMe hires group must be hidden"
    assert all("Hires pass" not in line for line in hint_lines(page))

    toggle_accordion(page, "txt2img_hr", True)
    wait_for("the hires group to show", lambda: displayed(page, group), bool)
    wait_for("a hires line in the hint", lambda: hint_lines(page), lambda lines: len(lines) == 2)

    toggle_accordion(page, "txt2img_hr", False)
    wait_for("the hires group to hide", lambda: displayed(page, group), lambda shown: not shown)
    wait_for("the hires line to go", lambda: hint_lines(page), lambda lines: len(lines) == 1)

    # Infotext pasted from Python turns Hires fix on through inputAccordionChecked (inputAccordion.js).
    page.execute_script("inputAccordionChecked('txt2img_hr', true)")
    wait_for("the hires group to show after a paste", lambda: displayed(page, group), bool)
    assert page.find_elements(By.ID, ours("img2img", "hires")) == [], "img2img has no Hires fix pass group"


def test_token_hint_follows_size_and_settings(page: Any) -> None:
    toggle_accordion(page, ours("txt2img", "enable"), True)
    click_radio(page, ours("txt2img", "preset"), "custom")
    wait_for("the custom settings to show", lambda: displayed(page, ours("txt2img", "custom")), bool)

    def first_line_is(text: str) -> None:
        wait_for(f"the hint {text!r}", lambda: hint_lines(page)[:1], lambda lines: lines == [text])

    assert expected_line(512, 512).startswith("4096 \u2192 2048 tokens at 1/1")  # the oracle agrees with the spec
    first_line_is(expected_line(512, 512))
    type_number(page, "txt2img_width", 768)
    first_line_is(expected_line(768, 512))
    # Above what 2x2 cells allow (1 - 1/(sx*sy) = 0.75): refused as everywhere, and the note says so at once.
    type_number(page, ours("txt2img", "ratio"), 0.9)
    refusal = wait_for("the refusal in the note", lambda: note_refuses(page), lambda text: "= 0.75" in text)
    assert "ratio=0.9" in refusal and "sx=2, sy=2" in refusal
    wait_for("no token hint for refused settings", lambda: hint_lines(page), lambda lines: lines == [])
    type_number(page, ours("txt2img", "sx"), 4)  # 4x2 cells: at most 0.875, still refused
    wait_for("the refusal with 4x2 cells", lambda: note_refuses(page), lambda text: "= 0.875" in text)
    type_number(page, ours("txt2img", "sy"), 4)  # 4x4 cells: at most 0.9375
    first_line_is(expected_line(768, 512, ratio=0.9, sx=4, sy=4))
    assert note_refuses(page) == ""
    type_number(page, "txt2img_height", 640)
    first_line_is(expected_line(768, 640, ratio=0.9, sx=4, sy=4))
    click_radio(page, ours("txt2img", "max_downsample"), "2")
    first_line_is(expected_line(768, 640, ratio=0.9, sx=4, sy=4, max_downsample=2))
    click_radio(page, ours("txt2img", "mode"), "kv")
    first_line_is(expected_line(768, 640, ratio=0.9, sx=4, sy=4, max_downsample=2, mode="kv"))
    click_radio(page, ours("txt2img", "mode"), "merge")
    first = {"ratio": 0.9, "sx": 4, "sy": 4, "max_downsample": 2}

    def hires_line_is(text: str) -> None:
        wait_for(f"the hires hint {text!r}", lambda: hint_lines(page)[1:], lambda lines: lines == [text])

    toggle_accordion(page, "txt2img_hr", True)
    hires_line_is(f"Hires pass (1536\u00d71280): {expected_line(1536, 1280, **first)}")  # "Upscale by" 2
    click_radio(page, ours("txt2img", "hr_mode"), "own")
    wait_for("the own hires settings to show", lambda: displayed(page, ours("txt2img", "hr_settings")), bool)
    click_radio(page, ours("txt2img", "hr_preset"), "custom")
    wait_for("the own custom hires settings to show", lambda: displayed(page, ours("txt2img", "hr_custom")), bool)
    type_number(page, ours("txt2img", "hr_ratio"), 0.3)
    hires_line_is(f"Hires pass (1536\u00d71280): {expected_line(1536, 1280, ratio=0.3)}")
    type_number(page, "txt2img_hr_resize_x", 1024)  # height follows the aspect ratio: 1024 * 640 // 768
    hires_line_is(f"Hires pass (1024\u00d7853): {expected_line(1024, 853, ratio=0.3)}")
    first_line_is(expected_line(768, 640, **first))  # the first pass is unchanged

    if os.environ.get("TOME_UI_SCREENSHOT"):
        page.execute_script(f"document.getElementById('{ours('txt2img', 'enable')}').scrollIntoView()")
        page.save_screenshot(os.environ["TOME_UI_SCREENSHOT"])

    click_radio(page, ours("txt2img", "hr_mode"), "off")
    hires_line_is("Hires pass (1024\u00d7853): no merging")

    # img2img has its own size and settings.
    page.find_element(By.XPATH, "//*[@id='tabs']//button[normalize-space()='img2img']").click()
    toggle_accordion(page, ours("img2img", "enable"), True)
    click_radio(page, ours("img2img", "preset"), "custom")
    type_number(page, "img2img_height", 1024)
    wait_for("the img2img hint", lambda: hint_lines(page, "img2img"), lambda lines: lines == [expected_line(512, 1024)])

    # A value another script sets (the WebUI's width/height swap, a resolution picker) comes with updateInput().
    page.execute_script(
        "var box = document.querySelector('#img2img_width input[type=number]'); box.value = 1024; updateInput(box);"
    )
    wait_for(
        "the img2img hint", lambda: hint_lines(page, "img2img"), lambda lines: lines == [expected_line(1024, 1024)]
    )
    assert hint_lines(page)[0] == expected_line(768, 640, **first)  # txt2img keeps its own


def test_token_hint_follows_every_control(page: Any) -> None:
    """Each control the hint depends on, changed alone, with custom settings in both passes."""
    toggle_accordion(page, ours("txt2img", "enable"), True)
    click_radio(page, ours("txt2img", "preset"), "custom")
    wait_for("the custom settings to show", lambda: displayed(page, ours("txt2img", "custom")), bool)
    first: dict[str, Any] = {}
    size = [512, 512]

    def first_line_is_expected() -> None:
        text = expected_line(*size, **first)
        wait_for(f"the hint {text!r}", lambda: hint_lines(page)[:1], lambda lines: lines == [text])

    for item, value, field in (("sy", 4, "sy"), ("sx", 1, "sx"), ("ratio", 0.6, "ratio")):
        type_number(page, ours("txt2img", item), value)
        first[field] = value
        first_line_is_expected()
    for item, value in (("max_downsample", "4"), ("mode", "kv"), ("max_downsample", "auto"), ("mode", "merge")):
        click_radio(page, ours("txt2img", item), value)
        first[item] = value if value in ("auto", "kv", "merge") else int(value)
        first_line_is_expected()
    page.find_element(By.CSS_SELECTOR, f"#{ours('txt2img', 'advanced')} .label-wrap").click()  # open "Advanced"
    element(page, f"#{ours('txt2img', 'merge_attn')} input").click()  # nothing left to merge
    wait_for("no merging", lambda: hint_lines(page)[:1], lambda lines: lines == ["no merging"])
    element(page, f"#{ours('txt2img', 'merge_attn')} input").click()
    first_line_is_expected()

    # Width and height by their range inputs too, as a drag ends: one change event.
    page.execute_script(
        "var range = document.querySelector('#txt2img_height input[type=range]'); range.value = 640;"
        " range.dispatchEvent(new Event('input', {bubbles: true}));"
        " range.dispatchEvent(new Event('change', {bubbles: true}));"
    )
    size[1] = 640
    first_line_is_expected()

    def hires_line_is(width: int, height: int, **values: Any) -> None:
        text = f"Hires pass ({width}\u00d7{height}): {expected_line(width, height, **values)}"
        wait_for(f"the hires hint {text!r}", lambda: hint_lines(page)[1:], lambda lines: lines == [text])

    toggle_accordion(page, "txt2img_hr", True)
    hires_line_is(1024, 1280, **first)  # "same": the first pass's settings at "Upscale by" 2
    type_number(page, "txt2img_hr_scale", 1.5)
    hires_line_is(768, 960, **first)
    type_number(page, "txt2img_hr_resize_y", 1024)  # width follows the aspect ratio: 1024 * 512 // 640
    hires_line_is(819, 1024, **first)
    type_number(page, "txt2img_hr_resize_x", 1000)  # both set: exactly that size
    hires_line_is(1000, 1024, **first)
    click_radio(page, ours("txt2img", "hr_mode"), "own")
    wait_for("the own hires settings to show", lambda: displayed(page, ours("txt2img", "hr_settings")), bool)
    click_radio(page, ours("txt2img", "hr_preset"), "custom")
    wait_for("the own custom hires settings to show", lambda: displayed(page, ours("txt2img", "hr_custom")), bool)
    own = {**first, "ratio": 0.5, "sx": 2, "sy": 2, "max_downsample": "auto"}  # the hires controls' defaults
    hires_line_is(1000, 1024, **own)
    for item, value in (("hr_sx", 4), ("hr_sy", 1), ("hr_ratio", 0.7)):
        type_number(page, ours("txt2img", item), value)
        own[item[3:]] = value
        hires_line_is(1000, 1024, **own)
    click_radio(page, ours("txt2img", "hr_max_downsample"), "2")
    own["max_downsample"] = 2
    hires_line_is(1000, 1024, **own)
    click_radio(page, ours("txt2img", "hr_mode"), "same")
    hires_line_is(1000, 1024, **first)
    first_line_is_expected()


def sent_values(driver: Any, tab: str) -> dict[str, Any]:
    """The page values tome.js sent last (the hidden textbox's JSON), {} before any."""
    text = element(driver, f"#{ours(tab, 'page_values')} textarea").get_property("value")
    return json.loads(text) if text else {}


@pytest.mark.parametrize("tab", ["txt2img", "img2img"])
def test_the_batch_size_is_sent(page: Any, tab: str) -> None:
    """Forge Neo makes one Wan video of the batch size's frames (tome_webui/ui.py, `loaded_frames`): tome.js sends
    the batch size with the page values, and again when it changes, for the note's figure at that many frames."""
    wait_for("the first send", lambda: sent_values(page, tab).get("batch_size"), lambda value: value == 1)
    if tab == "img2img":
        page.find_element(By.XPATH, "//*[@id='tabs']//button[normalize-space()='img2img']").click()
    type_number(page, f"{tab}_batch_size", 81)
    wait_for("the batch size sent", lambda: sent_values(page, tab).get("batch_size"), lambda value: value == 81)
    wait_for("its answer", lambda: hint_answers_last_send(page, tab), bool)


def test_an_edit_made_while_the_last_send_is_pending_still_counts(page: Any) -> None:
    """gradio drops an event while its last call is pending: tome.js sends again once that call is answered."""
    for width in (576, 640, 704, 768, 832):  # each its own task, sent at once: most while the one before is pending
        page.execute_script(
            "var box = document.querySelector('#txt2img_width input[type=number]');"
            " box.value = arguments[0]; updateInput(box);",
            width,
        )
    text = expected_families(832, 512, preset_configs(DEFAULT_PRESET))  # a preset's tokens: in the note's tooltip
    wait_for(f"the tooltip to hold {text!r}", lambda: note_title(page), lambda title: text in title)


def test_no_timer_after_load(page: Any) -> None:
    """tome.js reacts to events only: it starts no timer, and no interval runs once the page is idle."""

    def timers() -> dict[str, Any]:
        return page.execute_script(
            "return {fromTome: standinTimers.fromTome, intervals: Object.values(standinTimers.intervals)}"
        )

    assert timers() == {"fromTome": [], "intervals": []}
    # Every kind of edit: a WebUI slider, Hires fix, a speed selector, a ToMe slider, a radio.
    toggle_accordion(page, ours("txt2img", "enable"), True)
    type_number(page, "txt2img_width", 640)
    toggle_accordion(page, "txt2img_hr", True)
    click_radio(page, ours("txt2img", "preset"), "custom")
    wait_for("the custom settings to show", lambda: displayed(page, ours("txt2img", "custom")), bool)
    type_number(page, ours("txt2img", "ratio"), 0.4)
    click_radio(page, ours("txt2img", "max_downsample"), "2")
    click_radio(page, ours("txt2img", "hr_mode"), "own")
    wait_for(
        "the hint and the note to catch up",  # own hires settings at a preset: a line in the note, tokens on hover
        lambda: (hint_lines(page), note_lines(page)),
        lambda got: (
            got[0] == [expected_line(640, 512, ratio=0.4, max_downsample=2)]
            and any(line.startswith("Hires pass, ") for line in got[1])
        ),
    )
    assert timers()["fromTome"] == []
    # gradio's own timers come and go with its requests; once they are done, no interval is left.
    wait_for("no interval to run", lambda: timers()["intervals"], lambda intervals: intervals == [])


def test_presets_show_their_figures_per_model_family(page: Any) -> None:
    toggle_accordion(page, ours("txt2img", "enable"), True)
    custom = ours("txt2img", "custom")

    def hint_is(lines: list[str]) -> None:
        wait_for(f"the hint {lines!r}", lambda: hint_lines(page), lambda got: got == lines)

    def note_is(*lines: str) -> None:
        wait_for(f"the note {lines!r}", lambda: note_lines(page), lambda got: got == list(lines))

    def tooltip_has(*texts: str) -> None:
        wait_for(f"the tooltip to hold {texts!r}", lambda: note_title(page), lambda got: all(t in got for t in texts))

    # The default preset: the detailed settings are hidden; the note says in one line, in the user's words, what the
    # preset gains and changes (no model is loaded on this page: every family); what it runs and its tokens per
    # level, per family, are in the note's tooltip, and nothing is shown under the note.
    assert not displayed(page, custom), "a preset is selected: the custom settings must be hidden"
    note_is(preset_hint(DEFAULT_PRESET, None, (512, 512)))
    # what it runs and the speed-up at each size with where it comes from, per family
    tooltip_has(expected_families(512, 512, preset_configs(DEFAULT_PRESET)), *preset_tooltip(DEFAULT_PRESET, None))
    assert hint_lines(page) == []
    click_radio(page, ours("txt2img", "preset"), "fast")
    note_is(preset_hint("fast", None, (512, 512)))
    tooltip_has(expected_families(512, 512, preset_configs("fast")))
    type_number(page, "txt2img_width", 96)  # too small for Fast's 8x8 cells at level 4: the note says so
    note_is(preset_hint("fast", None, (96, 512)))
    assert "too small for Fast" in note_lines(page)[0]
    type_number(page, "txt2img_width", 768)
    note_is(preset_hint("fast", None, (768, 512)))
    tooltip_has(expected_families(768, 512, preset_configs("fast")))
    click_radio(page, ours("txt2img", "preset"), "quality")  # kv mode on SDXL: keys/values
    tooltip_has(expected_families(768, 512, preset_configs("quality")))
    assert hint_lines(page) == []

    click_radio(page, ours("txt2img", "preset"), "custom")  # Custom: its tokens per level under the note
    wait_for("the custom settings to show", lambda: displayed(page, custom), bool)
    hint_is([expected_line(768, 512)])
    click_radio(page, ours("txt2img", "preset"), "fastest")
    wait_for("the custom settings to hide", lambda: displayed(page, custom), lambda shown: not shown)
    hint_is([])
    fastest = preset_hint("fastest", None, (768, 512))
    note_is(fastest)

    # Hires fix: "same" runs the preset again at the hires size: its figure there joins the first pass's line (no
    # line of its own, its tokens on hover); "own" at the same preset is the same, another preset one line naming it,
    # with its figures at the hires size.
    toggle_accordion(page, "txt2img_hr", True)
    with_hires = preset_hint("fastest", None, (768, 512), hires=(1536, 1024))
    assert with_hires != fastest
    tooltip_has(f"Hires pass (1536\u00d71024): {expected_families(1536, 1024, preset_configs('fastest'))}")
    note_is(with_hires)
    click_radio(page, ours("txt2img", "hr_mode"), "own")
    wait_for("the own hires settings to show", lambda: displayed(page, ours("txt2img", "hr_settings")), bool)
    assert not displayed(page, ours("txt2img", "hr_custom"))
    label = get_preset(DEFAULT_PRESET).label
    note_is(fastest, f"Hires pass, {label}: {preset_hint(DEFAULT_PRESET, None, (1536, 1024))}")
    tooltip_has(f"Hires pass (1536\u00d71024): {expected_families(1536, 1024, preset_configs(DEFAULT_PRESET))}")
    click_radio(page, ours("txt2img", "hr_preset"), "fastest")
    note_is(with_hires)
    # Own custom values over Fastest: the hires controls' own ratio and strides replace the preset's (its 0.95 in
    # 8x8 cells on SD1/SD2), so their defaults (0.5 in 2x2 cells) run; a ratio above 0.75 in 2x2 cells is refused.
    click_radio(page, ours("txt2img", "hr_preset"), "custom")
    wait_for("the own custom hires settings to show", lambda: displayed(page, ours("txt2img", "hr_custom")), bool)
    type_number(page, ours("txt2img", "hr_ratio"), 0.9)
    refusal = wait_for("the refusal in the note", lambda: note_refuses(page), bool)
    assert "sx=2, sy=2" in refusal and "= 0.75" in refusal
    type_number(page, ours("txt2img", "hr_sx"), 4)
    type_number(page, ours("txt2img", "hr_sy"), 4)
    type_number(page, ours("txt2img", "hr_ratio"), 0.3)
    hires = {"ratio": 0.3, "max_downsample": "auto", "sx": 4, "sy": 4}  # the own custom controls
    over = {family: config.replace(**hires) for family, config in preset_configs("fastest").items()}
    hint_is([f"Hires pass (1536\u00d71024): {expected_families(1536, 1024, over)}"])  # Custom values: shown
    tooltip_has(expected_families(768, 512, preset_configs("fastest")))  # the first pass's preset: on hover
    assert note_refuses(page) == ""


@pytest.mark.parametrize("tab", ["txt2img", "img2img"])
def test_the_page_settles_after_every_kind_of_click(page: Any, page_url: str, tab: str) -> None:
    """No request storm: after each click or edit, the calls its events need (one round trip each), then none.

    gradio shows its pending state and progress text inside the note's wrapper while the note's call is out; those
    are changes in the page too, and must not count as the answer tome.js waits for.
    """
    if tab == "img2img":
        page.find_element(By.XPATH, "//*[@id='tabs']//button[normalize-space()='img2img']").click()
    note = ours(tab, "cap_note")

    def click(item: str, value: str) -> Callable[[], None]:
        return lambda: click_radio(page, ours(tab, item), value)

    settles(page, page_url, "turning ToMe on", lambda: toggle_accordion(page, ours(tab, "enable"), True), 1)
    # The premise: while the note's call is out, gradio marks the note's wrapper pending.
    page.execute_script(
        "var box = document.querySelector(arguments[0]); box.value = 640; updateInput(box);",
        f"#{tab}_width input[type=number]",
    )
    wait_for(
        "gradio's pending state inside the note's wrapper",
        lambda: page.execute_script(f"return !!document.querySelector('#{note} .pending')"),
        bool,
        timeout=5,
    )
    settles(page, page_url, "a width set by a script", lambda: None, 1)
    for preset in (
        "fast",
        "quality",
        "fastest",
        "balanced",
        "custom",
    ):  # each: the Custom column's visibility, the note
        settles(page, page_url, f"clicking the preset {preset!r}", click("preset", preset), 2)
    wait_for("the custom settings to show", lambda: displayed(page, ours(tab, "custom")), bool)
    settles(page, page_url, "typing a ratio", lambda: type_number(page, ours(tab, "ratio"), 0.6), 1)
    settles(page, page_url, "clicking a max downsample", click("max_downsample", "2"), 1)
    settles(page, page_url, "clicking a mode", click("mode", "kv"), 1)
    page.find_element(By.CSS_SELECTOR, f"#{ours(tab, 'advanced')} .label-wrap").click()  # open "Advanced"
    settles(page, page_url, "a checkbox", lambda: element(page, f"#{ours(tab, 'merge_crossattn')} input").click(), 1)
    settles(page, page_url, "typing a width", lambda: type_number(page, f"{tab}_width", 768), 1)
    drag = (
        "var range = document.querySelector(arguments[0]); range.value = 640;"
        " range.dispatchEvent(new Event('input', {bubbles: true}));"
        " range.dispatchEvent(new Event('change', {bubbles: true}));"
    )
    settles(
        page, page_url, "dragging the height", lambda: page.execute_script(drag, f"#{tab}_height input[type=range]"), 1
    )
    if tab == "txt2img":
        settles(page, page_url, "turning Hires fix on", lambda: toggle_accordion(page, "txt2img_hr", True), 1)
        settles(page, page_url, "typing an upscale", lambda: type_number(page, "txt2img_hr_scale", 1.5), 1)
        settles(page, page_url, "clicking own hires settings", click("hr_mode", "own"), 1)
        settles(page, page_url, "clicking a hires preset", click("hr_preset", "fastest"), 1)
        settles(page, page_url, "turning Hires fix off", lambda: toggle_accordion(page, "txt2img_hr", False), 1)

    def burst() -> None:  # clicks faster than the server answers
        for preset in ("fast", "custom", "fastest", "quality", "balanced"):
            click_radio(page, ours(tab, "preset"), preset)

    settles(page, page_url, "five presets clicked in a row", burst, 5)
    assert hint_answers_last_send(page, tab), "the hint must answer the last values sent"
    wait_for("the custom settings to hide", lambda: displayed(page, ours(tab, "custom")), lambda shown: not shown)
