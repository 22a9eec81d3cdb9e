"""Each of our UI events sends exactly what its endpoint declares, so no gradio client warns about it.

gradio 4.40's client (Forge 2, Forge Neo) logs "Too many arguments provided for the endpoint." when a call sends
more values than the parameters its endpoint declares. The page calls an event by its fn_index, and the client
looks that up in the API info's `unnamed_endpoints`, which gradio 4.40's server never fills (every endpoint is
named there): for such a call the declared parameters are none, so any call that sends a value warns, whatever its
inputs (checked by hand with gradio 4.40.0 and headless Chromium: a change event with one Textbox input warns, one
with no inputs does not). gradio 3.41 (A1111 1.6-1.10, Forge Classic; SD.Next's 3.43) declares each input that is
no `State` in `unnamed_endpoints`. So an event of ours either runs in the browser alone (no call: a `_js` function,
no `fn`), or calls the server sending no value at all, which both declare: what it needs comes as the event's data
(`gr.EventData`, the value of the control that fired it), not as inputs. And the function takes exactly that.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Iterator
from typing import Any

import gradio as gr
import pytest
import webui_stub  # noqa: F401  (puts the stand-in WebUI's modules on sys.path)
from gradio.blocks import get_api_info
from modules import scripts
from webui_stub.harness import load_extension, reset

pytestmark = pytest.mark.filterwarnings("ignore:(?s).*on_event is deprecated:DeprecationWarning")


@pytest.fixture
def script_classes() -> Iterator[list[type]]:
    reset()
    load_extension()
    yield [data.script_class for data in scripts.scripts_data]
    reset()


def events(script_class: type, is_img2img: bool) -> tuple[gr.Blocks, list[tuple[int, dict[str, Any], Any]]]:
    """Our accordion in a Blocks of its own, and every event it registers: (fn_index, dependency, BlockFunction)."""
    script = script_class()
    script.is_img2img = is_img2img
    script.is_txt2img = not is_img2img
    with gr.Blocks() as demo:
        script.ui(is_img2img)
    return demo, [(index, dep, fn) for index, (dep, fn) in enumerate(zip(demo.dependencies, demo.fns, strict=True))]


def sent(dependency: dict[str, Any]) -> int:
    """How many values the page sends when it calls the event: one per input (gradio 3.41 and 4.40 alike)."""
    return len(dependency["inputs"])


def taken(fn: Any) -> int:
    """How many input values the function takes: its parameters but those gradio fills itself (EventData,
    Request, Progress)."""
    hints = typing.get_type_hints(fn)
    special = (gr.EventData, gr.Request)
    params = [
        p
        for p in inspect.signature(fn).parameters.values()
        if not (inspect.isclass(hints.get(p.name)) and issubclass(hints[p.name], special))
        and not isinstance(p.default, gr.Progress)
    ]
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return -1  # takes any number: it cannot tell what it was sent
    return len(params)


@pytest.mark.parametrize("is_img2img", [False, True])
def test_each_event_sends_what_its_endpoint_declares(script_classes: list[type], is_img2img: bool) -> None:
    (script_class,) = script_classes
    demo, registered = events(script_class, is_img2img)
    info = get_api_info(demo.get_config_file(), serialize=False)
    assert registered, "the accordion registers events"
    wrong = []
    for index, dependency, fn in registered:
        targets = [demo.blocks[t[0] if isinstance(t, (list, tuple)) else t].elem_id for t in dependency["targets"]]
        where = f"{'/'.join(map(str, targets))}.{dependency['trigger']}"
        if not dependency["backend_fn"]:
            continue  # runs in the browser alone: nothing is sent to an endpoint
        declared_341 = len(info["unnamed_endpoints"][str(index)]["parameters"])
        declared_440 = 0  # a call by fn_index finds no endpoint info in gradio 4.40's client (module docstring)
        if not sent(dependency) == declared_341 == declared_440 == taken(fn.fn):
            wrong.append(
                f"{where}: sends {sent(dependency)}, declares {declared_341} (gradio 3.41) /"
                f" {declared_440} (gradio 4.40), its function takes {taken(fn.fn)}"
            )
    assert not wrong, "events that make gradio's client warn:\n" + "\n".join(wrong)
