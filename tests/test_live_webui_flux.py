"""Against a running Forge Neo with a Flux checkpoint (issue 43): the accordion's presets reduce the transformer, the
infotext holds what ran and pastes back through the page, ToMe off is bitwise the image without it.

Not run by `make test` (marker `webui`); skipped unless `TOME_WEBUI_URL` is set and `TOME_WEBUI_ARCH=flux`. The
checkpoint: `tests/webui_stub/make_random_flux.py` (a random-weight Flux.1-dev of reduced width and depth, which Neo
loads as Flux), named by `TOME_WEBUI_CHECKPOINT`. Start Neo with `--use-pytorch-cross-attention`: ToMe subsamples
keys/values where PyTorch's scaled_dot_product_attention runs, and a CPU's default is Neo's basic attention (then every
generation says so in `ToMe note`, checked by `test_flux_other_attention_is_noted` when `TOME_WEBUI_FLUX_BASIC=1`).
`TOME_WEBUI_EVIDENCE`: each response's `info` as JSON, and a screenshot of the pasted accordion.

Run: `TOME_WEBUI_URL=http://127.0.0.1:7861 TOME_WEBUI_HOST=neo TOME_WEBUI_ARCH=flux
TOME_WEBUI_CHECKPOINT=random-flux.safetensors python -m pytest -m webui tests/test_live_webui_flux.py -v`.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from test_live_webui import URL, extra_params, overrides, pixels, post, tome

import tome_core

pytestmark = [
    pytest.mark.webui,
    pytest.mark.skipif(
        not URL or os.environ.get("TOME_WEBUI_ARCH") != "flux", reason="TOME_WEBUI_URL unset or TOME_WEBUI_ARCH!=flux"
    ),
]

BASIC = os.environ.get("TOME_WEBUI_FLUX_BASIC") == "1"  # Neo started without --use-pytorch-cross-attention
NOTE = "ToMe note"


def flux_request(**extra: Any) -> dict[str, Any]:
    """A small Flux.1-dev generation: guidance distilled (CFG 1), Neo's Euler and Simple schedule."""
    body: dict[str, Any] = {
        "prompt": "a red apple on a table",
        "steps": 3,
        "width": 256,
        "height": 256,
        "sampler_name": "Euler",
        "scheduler": "Simple",
        "cfg_scale": 1.0,
        "distilled_cfg_scale": 3.5,
        "seed": 1234,
        "override_settings": overrides(),
    }
    body.update(extra)
    return body


def generate(name: str, **extra: Any) -> dict[str, Any]:
    status, payload = post("/sdapi/v1/txt2img", flux_request(**extra), name=name)
    assert status == 200, payload
    return payload


def ours(extra: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in extra.items() if key.startswith("ToMe") and key != "ToMe version"}


@pytest.mark.skipif(BASIC, reason="Neo runs its basic attention: see test_flux_other_attention_is_noted")
@pytest.mark.parametrize("preset", [p.name for p in tome_core.presets()])
def test_flux_presets_reduce_the_transformer(preset: str) -> None:
    """Each preset resolves for Flux.1 and reduces every block it selects: no note, the values that ran in the
    transformer's fields (no ratio), an image that differs from the one without ToMe."""
    off = generate(f"flux-off-{preset}", alwayson_scripts=tome(False))
    on = generate(f"flux-{preset}", alwayson_scripts=tome({"preset": preset}))
    extra = extra_params(on)
    config = tome_core.get_preset(preset).config("flux")
    assert NOTE not in extra and "ToMe error" not in extra, extra
    assert extra["ToMe preset"] == preset and extra["ToMe mode"] == config.mode
    assert ("ToMe ratio" in extra) == (config.mode == "merge")  # merged blocks; keys/values subsampling has none
    assert extra["ToMe stride x"] == str(config.sx) and extra["ToMe start at block"] == repr(config.block_start)
    assert pixels(on["images"][0]) != pixels(off["images"][0])


@pytest.mark.skipif(BASIC, reason="Neo runs its basic attention")
def test_flux_hires_same_and_own() -> None:
    hires = {
        "enable_hr": True,
        "hr_scale": 1.5,
        "hr_upscaler": "Latent",
        "denoising_strength": 0.5,
        "hr_second_pass_steps": 2,
        "hr_additional_modules": ["Use same choices"],
        "hr_cfg": 1.0,
    }
    same = extra_params(generate("flux-hires-same", alwayson_scripts=tome({"preset": "fast"}), **hires))
    assert NOTE not in same and same["ToMe hires"] == "same", same
    own = extra_params(
        generate("flux-hires-own", alwayson_scripts=tome({"preset": "quality", "hires": {"preset": "fast"}}), **hires)
    )
    assert NOTE not in own and own["ToMe hires"] == "own" and own["ToMe hires preset"] == "fast", own


def test_flux_off_is_bitwise_the_image_without_tome() -> None:
    """After a ToMe generation nothing is left: ToMe off, and a request without our args, give the same pixels (and
    the extension-less server's, `TOME_WEBUI_BASELINE`)."""
    generate("flux-before-off", alwayson_scripts=tome({"preset": "fastest"}))
    off = generate("flux-off", alwayson_scripts=tome(False))
    none = generate("flux-none")
    assert pixels(off["images"][0]) == pixels(none["images"][0])
    assert not any(key.startswith("ToMe") for key in extra_params(off))
    baseline = os.environ.get("TOME_WEBUI_BASELINE")
    if baseline:
        import base64

        assert pixels(off["images"][0]) == pixels(base64.b64encode(Path(baseline).read_bytes()).decode())


def test_flux_custom_merge_settings_are_refused_by_name() -> None:
    """The custom controls' defaults (ToMe's merge at ratio 0.5): the core refuses them for a diffusion transformer,
    whose merged blocks merge whole cells; the note names the field and the class, the image is the one without
    ToMe."""
    off = generate("flux-custom-off", alwayson_scripts=tome(False))
    refused = generate("flux-custom-merge", alwayson_scripts=tome(True, 0.5))
    note = extra_params(refused)[NOTE]
    assert note.startswith("not applied: TomeConfig.ratio=0.5") and "IntegratedFluxTransformer2DModel" in note, note
    assert pixels(refused["images"][0]) == pixels(off["images"][0])


@pytest.mark.skipif(not BASIC, reason="Neo runs PyTorch's attention (--use-pytorch-cross-attention)")
def test_flux_other_attention_is_noted() -> None:
    """Neo's basic attention (a CPU's default): no block is reached, the note says why, the image is Neo's own."""
    off = generate("flux-basic-off", alwayson_scripts=tome(False))
    on = generate("flux-basic", alwayson_scripts=tome({"preset": "balanced"}))
    note = extra_params(on)[NOTE]
    assert note.startswith("subsampled keys/values in 0 of") and "--use-pytorch-cross-attention" in note, note
    assert pixels(on["images"][0]) == pixels(off["images"][0])


def test_flux_infotext_pastes_back_through_the_page() -> None:
    """The infotext of a Flux generation, pasted into the page's prompt and read back with the paste button (Neo's
    API `infotext` field fails for any infotext: docs/hosts.md), sets the accordion: ToMe on, the preset selected."""
    import shutil

    try:
        from selenium import webdriver
        from selenium.webdriver.common.by import By
    except ImportError as exc:
        pytest.skip(f"selenium is not installed ({exc})")
    chromium, chromedriver = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not chromedriver:
        pytest.skip("no chromium/chromedriver on PATH (bash .ci/install-browser.sh)")
    source = generate("flux-paste-source", alwayson_scripts=tome({"preset": "fast"}))
    infotext = json.loads(source["info"])["infotexts"][0]
    assert "ToMe preset: fast" in infotext
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,2400"):
        options.add_argument(flag)
    options.add_argument("--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1")
    driver = webdriver.Chrome(service=webdriver.ChromeService(chromedriver), options=options)
    try:
        driver.get(URL)
        deadline = time.monotonic() + 180
        while not driver.find_elements(By.ID, "script_txt2img_tome_enable"):
            assert time.monotonic() < deadline, "the page has no ToMe accordion"
            time.sleep(0.5)
        time.sleep(3)
        prompt = driver.find_element(By.CSS_SELECTOR, "#txt2img_prompt textarea")
        driver.execute_script("arguments[0].value = arguments[1]; updateInput(arguments[0]);", prompt, infotext)
        driver.find_element(By.ID, "paste").click()

        def state() -> tuple[bool, str]:
            checked = driver.execute_script(
                "return document.querySelector('#script_txt2img_tome_enable-checkbox input').checked"
            )
            radio = driver.execute_script(
                "var c = document.querySelector('#script_txt2img_tome_preset input:checked'); return c ? c.value : '';"
            )
            return bool(checked), radio

        deadline = time.monotonic() + 60
        while state() != (True, "fast") and time.monotonic() < deadline:
            time.sleep(0.5)
        evidence = os.environ.get("TOME_WEBUI_EVIDENCE")
        if evidence:
            accordion = driver.find_element(By.ID, "script_txt2img_tome_enable")
            driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", accordion)
            driver.save_screenshot(str(Path(evidence, "neo-flux-pasted.png")))
        assert state() == (True, "fast")
    finally:
        driver.quit()
