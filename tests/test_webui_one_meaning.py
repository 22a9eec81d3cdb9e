"""One parser, one meaning: an API request's ToMe args mean the same with and without the API check installed.

The API check (`tome_webui.api`, an ASGI middleware) is installed when the WebUI's app has started; a request sent
before that (after "Running on local URL", before the app-started callbacks ran) reaches the script directly. Here
each request goes both ways through the WebUI's own handling, as `Api.init_script_args` does it (the args the
request gives over the `elem.value` of each control of a freshly built `ui()`, `Api.init_default_script_args`):

* with the check: refused (HTTP 422 with the error), or passed on (a positional list without presets completed with
  "custom") and run by the script;
* without it: run by the script alone, which must refuse the same requests (ToMe off, the same error in the
  infotext's `ToMe error`, so in the API's `info`) and run the others with the same job.

The check also refuses request shapes the WebUI consumes before the script sees any args (an entry that is not an
object, args that are not a list, more values than the script has: the WebUI drops the extra ones); those cannot
reach the script and are not compared here.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import gradio as gr
import pytest
import webui_stub  # noqa: F401  (puts the stand-in WebUI's modules on sys.path)
from modules import processing
from webui_stub.harness import WebUI, tome_args

from tome_webui import api, infotext
from tome_webui.params import TITLE, TomeJob

pytestmark = pytest.mark.filterwarnings("ignore:(?s).*on_event is deprecated:DeprecationWarning")

#: Requests' ToMe args, valid and invalid, positional and dict, in both tabs.
REQUESTS: tuple[tuple[str, list[Any]], ...] = (
    ("txt2img", [True, 0.5]),  # written before presets existed: custom ratio 0.5
    ("txt2img", [True, 0.3, "auto", 2, 2]),
    ("img2img", [True, 0.3, "auto", 2, 2]),
    ("txt2img", [*tome_args(True)[:21], "fast"]),  # stops before hr_preset: the hires pass's own preset is custom
    ("txt2img", tome_args(True, preset="fast")),
    ("txt2img", tome_args(True, preset="balanced")),  # the UI default, said explicitly
    ("img2img", tome_args(True, img2img=True, preset="quality")),
    ("txt2img", [False, 5]),  # off, yet a bad value: refused
    ("txt2img", [False]),
    ("txt2img", [True, 5]),
    ("img2img", [True, 0.5, "auto", 2, 2, "x"]),
    ("txt2img", [*tome_args(True)[:21], "turbo"]),
    ("txt2img", [{"preset": "fast", "hires": {"preset": "fastest"}}]),
    ("txt2img", [{"ratio": 0.6, "hires": {"ratio": 0.3}}]),
    ("img2img", [{"preset": "quality", "ratio": 0.3}]),
    ("txt2img", [{"ratio": 5}]),
    ("txt2img", [{"colour": "red"}]),
    ("txt2img", [{"ratio": 0.5}, True]),  # a dict and more: refused
    ("txt2img", [{"enabled": False, "ratio": 5}]),
)


@pytest.fixture(scope="module")
def webui() -> Iterator[WebUI]:
    yield WebUI("1.10")


def ui_defaults(webui: WebUI, tab: str) -> list[Any]:
    """What `Api.init_default_script_args` fills missing args with: `elem.value` of a fresh `ui()`'s controls."""
    script = webui.script(tab)
    with gr.Blocks():
        return [component.value for component in script.ui(script.is_img2img)]


def webui_args(webui: WebUI, tab: str, args: list[Any]) -> list[Any]:
    """The script's args as `Api.init_script_args` builds them from a request's `args`."""
    filled = ui_defaults(webui, tab)
    for index in range(min(len(filled), len(args))):
        filled[index] = args[index]
    return filled


def script_outcome(webui: WebUI, tab: str, args: list[Any]) -> tuple[str, Any]:
    """What the script makes of its args: ("job", the TomeJob), ("off", None) or ("error", the message)."""
    cls = (
        processing.StableDiffusionProcessingImg2Img if tab == "img2img" else processing.StableDiffusionProcessingTxt2Img
    )
    p = cls(scripts=webui.runners[tab], script_args=(0, *args), sampler=None)
    webui.runners[tab].before_process(p)
    error = p.extra_generation_params.get(infotext.ERROR_KEY)
    run = getattr(p, "tome_run", None)
    job: TomeJob | None = None if run is None else run.job
    webui.runners[tab].postprocess(p, None)
    if error is not None:
        assert job is None, "ToMe must stay off when its args are refused"
        return ("error", error)
    return ("off", None) if job is None else ("job", job)


def with_the_check(webui: WebUI, tab: str, args: list[Any]) -> tuple[str, Any]:
    """The request through the API check, then (when passed on) through the WebUI to the script."""
    payload = {"prompt": "a cat", "alwayson_scripts": {TITLE.lower(): {"args": args}}}
    is_img2img = tab == "img2img"
    error = api.request_error(payload, is_img2img=is_img2img)
    if error is not None:
        prefix = f"{TITLE} (alwayson_scripts['tome']): "
        assert error.startswith(prefix)
        return ("error", error[len(prefix) :])
    passed = api.padded_request(payload, is_img2img=is_img2img) or payload
    sent = json.loads(json.dumps(passed))["alwayson_scripts"]["tome"]["args"]  # as the WebUI decodes the body
    return script_outcome(webui, tab, webui_args(webui, tab, sent))


@pytest.mark.parametrize(("tab", "args"), REQUESTS, ids=[f"{tab}-{json.dumps(a)[:60]}" for tab, a in REQUESTS])
def test_the_script_reads_a_request_as_the_api_check_does(webui: WebUI, tab: str, args: list[Any]) -> None:
    checked = with_the_check(webui, tab, args)
    alone = script_outcome(webui, tab, webui_args(webui, tab, json.loads(json.dumps(args))))
    assert alone == checked


def test_a_list_without_presets_runs_custom_without_the_check(webui: WebUI) -> None:
    """The README's rule for a list written before presets existed, on the script's path alone."""
    kind, job = script_outcome(webui, "txt2img", webui_args(webui, "txt2img", [True, 0.5]))
    assert kind == "job" and job.preset == "custom" and job.hires_preset == "custom"
    assert job.first.ratio == 0.5 and job.first.max_downsample == "auto"


def test_the_ui_default_preset_from_the_page_is_a_preset(webui: WebUI) -> None:
    """The page sends the selector's value as a plain string: the UI's Balanced runs Balanced."""
    kind, job = script_outcome(webui, "txt2img", tome_args(True))
    assert kind == "job" and job.preset == "balanced"
