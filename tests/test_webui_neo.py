"""The extension in a Forge Neo-shaped host: Forge 2's order and model objects (`webui_stub.forge`), with Neo's
own `apply_token_merging` (plus epsilon scaling) and its models without a UNet (`webui_stub.neo`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
import webui_stub  # noqa: F401  (puts the stand-in WebUI's modules on sys.path)
from modules import errors, shared
from webui_stub import forge, neo
from webui_stub.harness import custom_args, tome_args

import tome_core
from tome_core import TomeConfig
from tome_webui import hosts

FIRST = TomeConfig(ratio=0.5)
NOTE = "ToMe note"


@pytest.fixture(autouse=True)
def _neo_builtin(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(forge, "apply_token_merging", neo.apply_token_merging)
    yield
    shared.opts.data.clear()


@pytest.fixture
def engine() -> neo.Engine:
    return neo.Engine(forge.build_unet(forge.SD1_DEPTHS, seed=0))


class Seen:
    """Records, right before each sampling, whether the built-in and the epsilon scaling are on the patcher."""

    def __init__(self) -> None:
        self.samplings: list[tuple[bool, float | None]] = []

    def __call__(self, patcher: forge.UnetPatcher) -> forge.UnetPatcher:
        holder = type("E", (), {"forge_objects": forge.ForgeObjects(patcher)})()
        self.samplings.append((forge.builtin_patched(holder), patcher.model_options.get(neo.EPS_KEY)))
        return patcher


def test_neo_engine_is_handled_by_the_forge_adapter(engine: neo.Engine) -> None:
    assert hosts.host_of(engine).name == "forge"
    assert hosts.unet_of(engine) is engine.forge_objects.unet.model.diffusion_model


@pytest.mark.parametrize(
    ("hires", "expected"),
    [({}, FIRST), ({"hr_mode": "off"}, None)],
)
def test_hires_pass_after_the_discarded_hook_call(
    engine: neo.Engine, hires: dict[str, Any], expected: TomeConfig | None
) -> None:
    webui = forge.ForgeWebUI(engine, lazy=True)
    p, processed = webui.run(tome=custom_args(**hires), enable_hr=True, n_iter=2, steps=2)
    seen = {(r.iteration, r.pass_name): r.config for r in p.sampler.records}
    assert seen == {(0, "first"): FIRST, (0, "hires"): expected, (1, "first"): FIRST, (1, "hires"): expected}
    assert NOTE not in processed.extra_generation_params
    assert not tome_core.is_patched(engine.forge_objects.unet.model.diffusion_model) and errors.reported == []


def test_builtin_off_keeps_the_epsilon_scaling_patch(engine: neo.Engine) -> None:
    webui = forge.ForgeWebUI(engine, lazy=False)
    shared.opts.data.update({"token_merging_ratio": 0.3, "scaling_factor": 1.2})
    seen = Seen()
    p, processed = webui.run(
        tome=custom_args(), enable_hr=True, steps=2, sampler=forge.ForgeSampler(other_extension=seen)
    )
    assert seen.samplings == [(False, 1.2), (False, 1.2)]  # first pass, hires pass
    assert processed.extra_generation_params["ToMe builtin"] == "disabled"
    assert all(r.config == FIRST for r in p.sampler.records)
    assert shared.opts.data["token_merging_ratio"] == 0.3


def test_builtin_applied_anyway_is_taken_off_without_the_epsilon_scaling(
    engine: neo.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(forge, "apply_token_merging", lambda e, ratio: neo.apply_token_merging(e, 0.4))
    webui = forge.ForgeWebUI(engine, lazy=False)
    shared.opts.data["scaling_factor"] = 1.5
    seen = Seen()
    _, processed = webui.run(tome=custom_args(), sampler=forge.ForgeSampler(other_extension=seen))
    assert seen.samplings == [(False, 1.5)]
    assert processed.extra_generation_params["ToMe builtin"] == "disabled"


@pytest.mark.parametrize("model", [neo.Flux, neo.QwenImage])
def test_model_without_a_unet_gets_a_note_and_the_host_image(model: type[neo.Flux]) -> None:
    engine = model()
    p0, _ = forge.ForgeWebUI(engine, extension=False, lazy=False).run()
    webui = forge.ForgeWebUI(engine, lazy=True)
    p, processed = webui.run(tome=custom_args())
    assert processed.extra_generation_params[NOTE] == f"not applied: {model.__name__} has no UNet to patch"
    assert all(torch.equal(a, b) for a, b in zip(p0.sampler.outputs(), p.sampler.outputs(), strict=True))
    assert errors.reported == []


def test_off_is_bitwise_the_host_without_the_extension(engine: neo.Engine) -> None:
    p0, _ = forge.ForgeWebUI(engine, extension=False, lazy=False).run(enable_hr=True, steps=2)
    webui = forge.ForgeWebUI(engine, lazy=False)
    webui.run(tome=custom_args(), enable_hr=True, steps=2)
    off, processed = webui.run(tome=tome_args(False), enable_hr=True, steps=2)
    assert all(torch.equal(a, b) for a, b in zip(p0.sampler.outputs(), off.sampler.outputs(), strict=True))
    assert not any(key.startswith("ToMe") for key in processed.extra_generation_params)
