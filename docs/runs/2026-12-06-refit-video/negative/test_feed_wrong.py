"""The feed and size tests on wrong conventions must fail: HunyuanVideo fed the sigma as its timestep (Flux.1's
convention), LTX-Video's and LTX-2's velocity negated (Z-Image's and Lumina 2's pipelines' convention), LTX-Video's
step saving at an image size."""

import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "tests"))

import test_bench_dit as tb

from tome_bench import dit_fidelity, dit_standin


def test_hunyuanvideo_timestep_wrong(monkeypatch) -> None:
    family = dit_standin.FAMILIES["hunyuanvideo"]
    wrong = replace(family, feed=lambda m, f, x, s, t: dit_standin._hunyuanvideo(m, f, x, s / 1000, t))
    monkeypatch.setitem(dit_standin.FAMILIES, "hunyuanvideo", wrong)
    tb.test_a_video_stand_in_is_fed_as_its_diffusers_pipeline_feeds_it("hunyuanvideo")


def test_ltx_sign_wrong(monkeypatch) -> None:
    family = dit_standin.FAMILIES["ltx"]
    monkeypatch.setitem(dit_standin.FAMILIES, "ltx", replace(family, feed=lambda *a: -dit_standin._ltx(*a)))
    tb.test_a_video_stand_in_is_fed_as_its_diffusers_pipeline_feeds_it("ltx")


def test_ltx2_sign_wrong(monkeypatch) -> None:
    family = dit_standin.FAMILIES["ltx2"]
    monkeypatch.setitem(dit_standin.FAMILIES, "ltx2", replace(family, feed=lambda *a: -dit_standin._ltx2(*a)))
    tb.test_a_video_stand_in_is_fed_as_its_diffusers_pipeline_feeds_it("ltx2")


def test_ltx_size_wrong(monkeypatch) -> None:
    monkeypatch.setitem(dit_fidelity.SIZES, "ltx", (1024, 1024, 1))
    tb.test_every_family_has_a_step_saving_reference_per_preset_at_the_size_users_run("ltx")
