"""The ComfyUI nodes driven through a ComfyUI-shaped stand-in (tests/comfy_stub; no ComfyUI installed)."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from comfy_stub.patcher import OUTER_SAMPLE, ModelPatcher
from comfy_stub.sampling import calc_cond_batch, load_checkpoint, sample
from comfy_stub.torch_compile import torch_compile_model

import tome_core
from tome_comfy import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS
from tome_comfy.inputs import advanced_widgets, comfy_families, config_from_inputs, preset_text
from tome_comfy.nodes import TOME_ADVANCED_NODE, TOME_NODE, v3_nodes
from tome_comfy.sampling import WRAPPER_KEY, comfy_blocks
from tome_core.words import FAMILY_LABELS, change_words, speed_words

ROOT = Path(__file__).resolve().parents[1]
#: How each line a sampling logs starts: with the version a bug report quoting it needs.
HEAD = f"ToMe {tome_core.__version__}"


def tome(model: ModelPatcher, preset: str = "Balanced") -> ModelPatcher:
    node = NODE_CLASS_MAPPINGS[TOME_NODE]()
    return node.patch(model, preset)[0]


def defaults() -> dict[str, Any]:
    return {w.name: w.default for w in advanced_widgets()}


def tome_advanced(model: ModelPatcher, **changes: Any) -> ModelPatcher:
    node = NODE_CLASS_MAPPINGS[TOME_ADVANCED_NODE]()
    return node.patch(model, **{**defaults(), **changes})[0]


def unet_of(model: ModelPatcher) -> torch.nn.Module:
    return model.model.diffusion_model


def hook_count(module: torch.nn.Module) -> int:
    return sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in module.modules())


@pytest.fixture
def sd() -> ModelPatcher:
    return load_checkpoint("sd")


# ---------------------------------------------------------------------------------------------- clone rules


def test_node_returns_a_clone_and_leaves_the_input_model_unchanged(sd: ModelPatcher) -> None:
    options = json.dumps(sd.model_options, default=str)
    out = tome(sd, "Fast")
    assert out is not sd and out.model is sd.model
    assert sd.wrappers == {} and json.dumps(sd.model_options, default=str) == options
    assert out.get_wrappers(OUTER_SAMPLE, WRAPPER_KEY)
    assert hook_count(unet_of(sd)) == 0 and not tome_core.is_patched(unet_of(sd))


def test_without_the_node_sampling_is_bitwise_unchanged_before_and_after_tome_sampled(sd: ModelPatcher) -> None:
    reference = sample(sd)
    merged = sample(tome(sd, "Fastest"))
    assert not torch.equal(merged, reference)
    assert torch.equal(sample(sd), reference)
    assert hook_count(unet_of(sd)) == 0


def test_preset_a_custom_b_and_none_each_run_their_own_settings_in_any_order(sd: ModelPatcher) -> None:
    a, b = tome(sd, "Fastest"), tome_advanced(sd, ratio=0.3, max_downsample="2")
    first = {"none": sample(sd), "a": sample(a), "b": sample(b)}
    assert not torch.equal(first["a"], first["b"])
    assert not torch.equal(first["a"], first["none"]) and not torch.equal(first["b"], first["none"])
    for name, model in (("b", b), ("none", sd), ("a", a), ("b", b), ("a", a), ("none", sd)):
        assert torch.equal(sample(model), first[name]), name


def test_a_later_tome_node_replaces_the_earlier_settings_on_its_clone(sd: ModelPatcher) -> None:
    chained = tome(tome(sd, "Fastest"), "Quality")
    assert len(chained.get_wrappers(OUTER_SAMPLE, WRAPPER_KEY)) == 1
    assert torch.equal(sample(chained), sample(tome(sd, "Quality")))


def test_the_patch_is_removed_after_an_exception_during_sampling(sd: ModelPatcher) -> None:
    reference = sample(sd)

    def interrupt(step: int, *args: Any) -> None:
        if step == 1:
            raise KeyboardInterrupt("interrupted")  # ComfyUI's interrupt also raises out of the step callback

    with pytest.raises(KeyboardInterrupt):
        sample(tome(sd, "Fast"), callback=interrupt)
    assert not tome_core.is_patched(unet_of(sd)) and hook_count(unet_of(sd)) == 0
    assert torch.equal(sample(sd), reference)


def test_hooks_exist_only_while_the_clone_samples(sd: ModelPatcher) -> None:
    seen: list[int] = []
    sample(tome(sd, "Balanced"), callback=lambda step, *a: seen.append(hook_count(unet_of(sd))))
    assert seen and all(count > 0 for count in seen)
    assert hook_count(unet_of(sd)) == 0


def test_random_partitions_leave_the_global_rng_alone(sd: ModelPatcher) -> None:
    model = tome_advanced(sd, use_rand=True, tome_seed=7)
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    sample(model)
    assert torch.equal(torch.rand(3), expected)


# ---------------------------------------------------------------------------------------------- presets, families


@pytest.mark.parametrize(("family", "expected"), [("sd", "sd"), ("sdxl", "sdxl"), ("ssd1b", "sdxl")])
def test_preset_resolves_for_the_family_of_comfyuis_model_config(family: str, expected: str, caplog: Any) -> None:
    model = load_checkpoint(family)
    caplog.set_level(logging.INFO, logger="tome")
    sample(tome(model, "Fast"))
    assert f"Fast for {expected}" in caplog.text
    preset = tome_core.get_preset("fast").config(expected)
    tome_core.apply_patch(unet_of(model), preset)  # the same settings applied by hand give the same image
    try:
        by_hand = sample(model)
    finally:
        tome_core.remove_patch(unet_of(model))
    assert torch.equal(sample(tome(model, "Fast")), by_hand)


def test_step_window_follows_the_samplers_step_callback(sd: ModelPatcher) -> None:
    unet = unet_of(sd)
    steps: list[Any] = []
    sample(
        tome_advanced(sd, step_start=0.5),
        steps=4,
        callback=lambda step, *a: steps.append(
            tome_core.get_config(unet) and unet.__dict__[tome_core.patch.STATE_ATTR].step
        ),
    )
    assert steps == [(1, 4), (2, 4), (3, 4), (4, 4)]  # set after each step for the next one: host values
    half, full = sample(tome_advanced(sd, step_start=0.5)), sample(tome_advanced(sd))
    assert not torch.equal(half, full) and not torch.equal(half, sample(sd))


# ---------------------------------------------------------------------------------------------- never silent


def tome_lines(caplog: Any) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "tome"]


def test_full_merge_is_logged_once_per_sampling(sd: ModelPatcher, caplog: Any) -> None:
    """Default settings (ratio 0.5, max downsample auto: the three level-1 blocks), not a preset being re-tuned."""
    caplog.set_level(logging.INFO, logger="tome")
    sample(tome_advanced(sd))
    assert tome_lines(caplog) == [
        f"{HEAD} (custom settings): ran in 3 of 3 selected blocks (7 transformer blocks): self-attention merged in 3;"
        " at 128\u00d7128"
    ]


#: Transformer blocks per downsampling level of the stand-in SDXL UNet (tests/comfy_stub/unet.py: depths (0, 1, 3),
#: 3 in the middle): one input and two output stacks of one block at level 2, 3 + 3 + 2 * 3 blocks at level 4.
STUB_SDXL_BLOCKS = {2: 3, 4: 12}


def kinds_expected(config: tome_core.TomeConfig) -> str:
    """The kinds the log must name for `config` on the stand-in SDXL: what its layout's block table plans (the log
    counts what the hooks saw run)."""
    table = tome_core.layout_table(STUB_SDXL_BLOCKS, config)
    words = {
        "kv": "keys/values pooled for self-attention",
        "attn1": "self-attention merged",
        "attn2": "cross-attention merged",
        "ff": "feed-forward (MLP) merged",
    }
    parts = [f"{words[name]} in {count}" for name, count in table.modules()]
    blocks = len(table.acting)
    return f"ran in {blocks} of {blocks} selected blocks (15 transformer blocks): {', '.join(parts)}"


@pytest.mark.parametrize("preset", [p.label for p in tome_core.presets()])
def test_sdxl_log_line_names_each_kind_that_ran_with_its_counts(preset: str, caplog: Any) -> None:
    """Issue 25: every SDXL preset logged only "pooled keys/values in 15 of 15" though cross-attention and the
    feed-forward merged too."""
    caplog.set_level(logging.INFO, logger="tome")
    sample(tome(load_checkpoint("sdxl"), preset))
    chosen = next(p for p in tome_core.presets() if p.label == preset)
    speed = speed_words(chosen, "sdxl", (128, 128)) or "at 128\u00d7128"
    assert tome_lines(caplog) == [f"{HEAD} ({preset} for sdxl): {kinds_expected(chosen.config('sdxl'))}; {speed}"]


def test_sdxl_balanced_names_kv_pooling_and_the_blocks_merged_whole(caplog: Any) -> None:
    # The level-2 blocks pool keys/values; the level-4 blocks merge whole: attention, cross-attention and MLP.
    caplog.set_level(logging.INFO, logger="tome")
    sample(tome(load_checkpoint("sdxl"), "Balanced"))
    (line,) = tome_lines(caplog)
    assert line.endswith(
        "keys/values pooled for self-attention in 3, self-attention merged in 12, cross-attention merged in 12,"
        f" feed-forward (MLP) merged in 12; {speed_words('balanced', 'sdxl', (128, 128)) or 'at 128×128'}"
    )


def test_an_interrupted_sampling_logs_what_ran_until_then(sd: ModelPatcher, caplog: Any) -> None:
    from comfy_stub.model_management import InterruptProcessingException

    def interrupt(step: int, *args: Any) -> None:
        if step == 1:
            raise InterruptProcessingException()

    caplog.set_level(logging.INFO, logger="tome")
    with pytest.raises(InterruptProcessingException):
        sample(tome_advanced(sd), callback=interrupt)
    assert tome_lines(caplog) == [
        f"{HEAD} (custom settings): sampling interrupted after 2 UNet calls; ran in 3 of 3 selected blocks"
        " (7 transformer blocks): self-attention merged in 3; at 128\u00d7128"
    ]


def test_an_interrupt_before_the_first_unet_call_says_nothing_ran(sd: ModelPatcher, caplog: Any) -> None:
    from comfy_stub.model_management import InterruptProcessingException

    def stop_before(executor: Any, *args: Any, **kwargs: Any) -> Any:
        raise InterruptProcessingException()

    model = tome(sd, "Fast")
    model.add_wrapper_with_key(OUTER_SAMPLE, "zz_interrupt", stop_before)  # added after ours: runs inside it
    caplog.set_level(logging.INFO, logger="tome")
    with pytest.raises(InterruptProcessingException):
        sample(model)
    assert tome_lines(caplog) == [
        f"{HEAD} (Fast for sd): sampling interrupted before the first UNet call: nothing merged"
    ]


def test_a_failed_sampling_logs_a_warning_with_the_error_type(sd: ModelPatcher, caplog: Any) -> None:
    def fail(step: int, *args: Any) -> None:
        raise RuntimeError("out of memory")

    caplog.set_level(logging.INFO, logger="tome")
    with pytest.raises(RuntimeError):
        sample(tome_advanced(sd), callback=fail)
    records = [r for r in caplog.records if r.name == "tome"]
    assert [(r.levelname, r.getMessage()) for r in records] == [
        (
            "WARNING",
            f"{HEAD} (custom settings): sampling failed (RuntimeError) after 1 UNet call; ran in 3 of 3 selected"
            " blocks (7 transformer blocks): self-attention merged in 3; at 128\u00d7128",
        )
    ]


def test_attention_replaced_in_every_call_is_counted_and_named(sd: ModelPatcher, caplog: Any) -> None:
    replaced = sd.clone()
    replaced.set_model_attn1_replace(lambda q, k, v, extra: v, "input", 1)  # a level-1 block ToMe selects
    caplog.set_level(logging.INFO, logger="tome")
    sample(tome_advanced(replaced))
    text = caplog.text
    assert "ran in 2 of 3 selected blocks" in text
    assert "attention replaced by another node in every call" in text
    assert "input.1.0 (4 of 4 UNet calls)" in text


def test_a_block_merged_whole_keeps_every_token_for_a_replaced_attention(sd: ModelPatcher, caplog: Any) -> None:
    # Attention, cross-attention and feed-forward merging at one ratio merge the block whole; a replacement (attention
    # couple, regional prompts) may map its tokens back to image positions: that block runs unmerged in that call.
    seen: list[int] = []

    def replacement(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, extra: Any) -> torch.Tensor:
        seen.append(q.shape[1])
        return v

    replaced = sd.clone()
    replaced.set_model_attn1_replace(replacement, "input", 1)  # a level-1 block ToMe selects
    caplog.set_level(logging.INFO, logger="tome")
    plain = sample(replaced.clone())
    full = set(seen)
    seen.clear()
    sample(tome_advanced(replaced, merge_crossattn=True, merge_mlp=True))
    assert seen and set(seen) == full  # every token, as without ToMe
    assert "ran in 2 of 3 selected blocks" in caplog.text
    assert "attention replaced by another node in every call" in caplog.text
    assert plain is not None


def pag_like(model: ModelPatcher) -> ModelPatcher:
    """`model`'s clone with a PAG-like post-CFG function: an extra call with attn1 replaced in the middle block."""

    def post_cfg(args: dict[str, Any]) -> torch.Tensor:
        from comfy_stub.patcher import set_model_options_patch_replace

        options = set_model_options_patch_replace(
            args["model_options"], lambda q, k, v, e: v, "attn1", "middle", 0, None
        )
        (pag,) = calc_cond_batch(args["model"], [args["cond"]], args["input"], args["sigma"], options)
        return args["denoised"] + (args["cond_denoised"] - pag) * 0.5

    pag = model.clone()
    pag.set_model_sampler_post_cfg_function(post_cfg)
    return pag


def test_pag_like_extra_call_with_replaced_attention_is_reported(sd: ModelPatcher, caplog: Any) -> None:
    pag = pag_like(sd)
    caplog.set_level(logging.INFO, logger="tome")
    sample(tome_advanced(pag, max_downsample="8"), steps=3)
    assert "self-attention replaced by another node" in caplog.text
    assert "middle.0.0 (3 of 6 UNet calls)" in caplog.text


def test_comfyuis_builtin_tomesd_is_skipped_and_ours_runs_alone(sd: ModelPatcher, caplog: Any) -> None:
    calls: list[str] = []

    def builtin_m(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, extra: Any) -> Any:
        calls.append("m")
        return q[:, ::2], k, v

    def builtin_u(n: torch.Tensor, extra: Any) -> torch.Tensor:
        return n.repeat_interleave(2, 1)

    for fn in (builtin_m, builtin_u):
        # ComfyUI's load_custom_node names a comfy_extras file's module by its path without extension.
        fn.__module__ = "/opt/ComfyUI/comfy_extras/nodes_tomesd"
    with_builtin = sd.clone()
    with_builtin.set_model_attn1_patch(builtin_m)
    with_builtin.set_model_attn1_output_patch(builtin_u)
    caplog.set_level(logging.INFO, logger="tome")
    ours_only = sample(tome(sd, "Balanced"))
    both = sample(tome(with_builtin, "Balanced"))
    assert calls == [] and torch.equal(both, ours_only)
    assert f"{HEAD}: ComfyUI's TomePatchModel is on this model too; ToMe (Balanced for sd) runs" in caplog.text
    sample(with_builtin)  # without our node the built-in still runs as before
    assert calls


def test_model_without_a_unet_runs_unchanged_and_says_so(caplog: Any) -> None:
    """A model that is neither a UNet nor a diffusion transformer ToMe reduces (tests/test_comfy_dit.py has the
    DiTs)."""
    model = load_checkpoint("dit")
    caplog.set_level(logging.INFO, logger="tome")
    assert torch.equal(sample(tome(model, "Fast")), sample(model))
    assert f"{HEAD}: ComfyUI model Flux (diffusion model DiT) is neither a UNet" in caplog.text
    assert "ToMe does nothing, the model runs unchanged" in caplog.text


def test_the_log_line_gives_the_speed_at_each_samplings_size(sd: ModelPatcher, caplog: Any) -> None:
    """Issue 44: the first pass and a hires second sampler each log the preset's speed-up at their own size."""
    caplog.set_level(logging.INFO, logger="tome")
    model = tome(sd, "Fast")
    sample(model, size=16)
    sample(model, size=24, denoise=0.5)
    first, second = tome_lines(caplog)
    assert first.endswith(f"; {speed_words('fast', 'sd', (128, 128)) or 'at 128×128'}")
    assert second.endswith(f"; {speed_words('fast', 'sd', (192, 192)) or 'at 192×192'}")
    assert "192\u00d7192" in second


def test_no_block_at_the_selected_levels_is_reported(caplog: Any) -> None:
    sdxl = load_checkpoint("sdxl")
    caplog.set_level(logging.INFO, logger="tome")
    sample(tome_advanced(sdxl, max_downsample="1"))
    assert "ran in 0 of 0 blocks" in caplog.text and "has them at 2, 4" in caplog.text


def test_comfy_block_keys_follow_comfyuis_numbering_and_levels(sd: ModelPatcher) -> None:
    keys = {label: level for label, _, level in comfy_blocks(unet_of(sd))}
    assert keys == {
        "input.1.0": 1,
        "input.3.0": 2,
        "middle.0.0": 4,
        "output.2.0": 2,
        "output.3.0": 2,
        "output.4.0": 1,
        "output.5.0": 1,
    }


# ---------------------------------------------------------------------------------------------- torch.compile


class GraphCounter:
    """A torch.compile backend that counts the graphs dynamo hands it and runs each as captured."""

    __name__ = "graph_counter"

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        self.graphs.append(gm)
        return gm.forward


def assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5 * float(expected.abs().max()))


COMPILE_ORDERS = ("ToMe, then TorchCompileModel", "TorchCompileModel, then ToMe")


@pytest.mark.usefixtures("fresh_dynamo")
@pytest.mark.parametrize("family", ["sd", "sdxl"])
@pytest.mark.parametrize("order", COMPILE_ORDERS)
def test_with_torch_compile_model_in_either_order_the_sampling_merges_in_one_graph(
    family: str, order: str, caplog: Any
) -> None:
    """Issue 24: ComfyUI's TorchCompileModel before or after our node. The sampling merges inside the compiled
    graph (equal to eager ToMe), one more graph than compile alone for the whole sampling and none for the next
    prompt (new node outputs, new wrappers), and a sampler on the same model without our node keeps its graph and
    its image; the log line says the UNet ran under torch.compile."""
    model = load_checkpoint(family)
    eager_plain, eager_merged = sample(model), sample(tome(model))
    assert not torch.equal(eager_plain, eager_merged)
    counter = GraphCounter()

    def prompt() -> tuple[ModelPatcher, ModelPatcher]:
        """The nodes of one prompt: a sampler with our node and TorchCompileModel, one with TorchCompileModel alone."""
        compiled = torch_compile_model(model, counter)
        if order == COMPILE_ORDERS[0]:
            return torch_compile_model(tome(model), counter), compiled
        return tome(compiled), compiled

    merged, compiled = prompt()
    plain = sample(compiled)
    assert_close(plain, eager_plain)
    assert len(counter.graphs) == 1
    caplog.set_level(logging.INFO, logger="tome")
    first = sample(merged)
    assert_close(first, eager_merged)
    assert len(counter.graphs) == 2
    (line,) = tome_lines(caplog)
    assert line.startswith(f"{HEAD} (Balanced for {family}): ran in ")
    assert "transformer blocks) under torch.compile (backend graph_counter): " in line
    assert torch.equal(sample(compiled), plain) and torch.equal(sample(model), eager_plain)

    merged, compiled = prompt()
    assert torch.equal(sample(merged), first) and torch.equal(sample(compiled), plain)
    assert len(counter.graphs) == 2
    assert hook_count(unet_of(model)) == 0 and not tome_core.is_patched(unet_of(model))


@pytest.mark.usefixtures("fresh_dynamo")
def test_under_torch_compile_model_a_step_window_and_a_new_size_cost_one_graph_each(sd: ModelPatcher) -> None:
    counter = GraphCounter()
    window = torch_compile_model(tome_advanced(sd, step_start=0.25, step_end=0.75), counter)
    assert_close(sample(window, steps=8), sample(tome_advanced(sd, step_start=0.25, step_end=0.75), steps=8))
    assert len(counter.graphs) == 2  # inside the window and outside it, not one per step
    whole = torch_compile_model(tome(sd, "Fast"), counter)
    assert_close(sample(whole, size=16), sample(tome(sd, "Fast"), size=16))
    assert_close(sample(whole, size=24), sample(tome(sd, "Fast"), size=24))  # a hires pass: another size
    assert_close(sample(whole, size=16), sample(tome(sd, "Fast"), size=16))
    assert len(counter.graphs) == 4


@pytest.mark.usefixtures("fresh_dynamo")
def test_under_torch_compile_model_replaced_attention_is_still_counted(sd: ModelPatcher, caplog: Any) -> None:
    """The log line stays true under compile: a PAG-like extra call with attn1 replaced in the middle block."""

    pag = pag_like(sd)
    caplog.set_level(logging.INFO, logger="tome")
    merged = tome_advanced(pag, max_downsample="8")
    eager = sample(merged, steps=3)
    caplog.clear()
    assert_close(sample(torch_compile_model(merged, GraphCounter()), steps=3), eager)
    (line,) = tome_lines(caplog)
    assert "self-attention replaced by another node" in line and "middle.0.0 (3 of 6 UNet calls)" in line
    assert line.endswith("(under torch.compile (backend graph_counter))")


# ---------------------------------------------------------------------------------------------- inputs


def test_advanced_inputs_come_from_the_field_table() -> None:
    inputs = NODE_CLASS_MAPPINGS[TOME_ADVANCED_NODE].INPUT_TYPES()["required"]
    for spec in tome_core.field_specs():
        name = "tome_seed" if spec.name == "seed" else spec.name
        kind, extra = inputs[name]
        if spec.choices is not None:
            assert kind == [str(c) for c in spec.choices] and extra["default"] == str(spec.default)
        elif spec.kind is bool:
            assert kind == "BOOLEAN" and extra["default"] is spec.default
        else:
            assert extra["max"] == spec.maximum and extra["step"] == spec.step
            assert extra["min"] == (spec.minimum - 1 if spec.optional else spec.minimum)
    assert next(iter(inputs)) == "model" and len(inputs) == len(tome_core.field_specs()) + 1


def test_preset_input_lists_the_core_presets_by_label() -> None:
    kind, extra = NODE_CLASS_MAPPINGS[TOME_NODE].INPUT_TYPES()["required"]["preset"]
    assert kind == [p.label for p in tome_core.presets()]
    assert extra["default"] == tome_core.get_preset(tome_core.DEFAULT_PRESET).label


def test_preset_tooltip_gives_each_presets_speed_up_and_image_change() -> None:
    """Issues 25 and 44: the preset tooltip speaks the core's words (`tome_core.words`, as the WebUI's hint): for
    each family ComfyUI runs (the UNets and the diffusion transformers the core reduces there) how much faster a step
    gets at that family's usual size, saying on which GPU and whether estimated or measured, and how much the image
    changes beside the preset's reference; the families without figures are named as such."""
    _, extra = NODE_CLASS_MAPPINGS[TOME_NODE].INPUT_TYPES()["required"]["preset"]
    lines = extra["tooltip"].splitlines()
    families = comfy_families()
    assert families[:2] == ("sd", "sdxl") and {"flux", "wan"} <= set(families)
    for preset in tome_core.presets():
        (line,) = [line for line in lines if line.startswith(f"{preset.label}: ")]
        assert line == f"{preset.label}: {preset_text(preset)}"
        for family in families:
            speed = speed_words(preset, family)
            held = preset.fidelity.get(family)
            label = FAMILY_LABELS[family]
            if speed or held is not None:
                assert f"{label}: {speed}" in line
                assert held is None or f"changes the image {change_words(held)}" in line
            else:
                assert re.search(rf"[ ,]{re.escape(label)}[ ,:].*not measured yet\.$", line)
        if speed_words(preset, "sd"):
            assert "(NVIDIA H200, estimated)" in line or "measured)" in line


def test_preset_node_description_gives_each_presets_words_as_its_tooltip_does() -> None:
    """Issue 25 section 2: what ComfyUI shows as the preset node's description has each preset's speed-up and image
    change, the tooltip's very lines; the class attribute is a string when ComfyUI reads it. Issue 44: words a user
    can read, no lab terms."""
    from tome_comfy.nodes import DESCRIPTIONS

    text = NODE_CLASS_MAPPINGS[TOME_NODE].DESCRIPTION
    assert isinstance(text, str) and text.startswith(DESCRIPTIONS[TOME_NODE])
    _, extra = NODE_CLASS_MAPPINGS[TOME_NODE].INPUT_TYPES()["required"]["preset"]
    for preset in tome_core.presets():
        (line,) = [line for line in extra["tooltip"].splitlines() if line.startswith(f"{preset.label}: ")]
        assert line in text.splitlines()
    assert NODE_CLASS_MAPPINGS[TOME_ADVANCED_NODE].DESCRIPTION.startswith(DESCRIPTIONS[TOME_ADVANCED_NODE])
    for node in NODE_CLASS_MAPPINGS.values():
        words = node.DESCRIPTION + json.dumps(node.INPUT_TYPES(), ensure_ascii=False)
        for lab_term in ("stand-in", "\u00d7 less", "less GPU time"):
            assert lab_term not in words


def test_each_node_description_ends_with_the_version() -> None:
    """Where a ComfyUI user reports a problem from: the node's description (its tooltip in the graph) and the log."""
    for node_id in (TOME_NODE, TOME_ADVANCED_NODE):
        text = NODE_CLASS_MAPPINGS[node_id].DESCRIPTION
        assert text.splitlines()[-1] == f"ToMe version {tome_core.__version__}"


def test_optional_fields_take_minus_one_as_none() -> None:
    config = config_from_inputs(defaults())
    assert config == tome_core.TomeConfig()
    assert config_from_inputs({**defaults(), "tome_seed": 5, "mlp_ratio": 0.25}).seed == 5


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"ratio": 0.9, "sx": 1, "sy": 2}, r"ratio=0\.9 is more than strides sx=1, sy=2 can merge"),
        ({"merge_mlp": True, "mlp_ratio": 0.8, "sx": 2, "sy": 1}, r"mlp_ratio=0\.8 is more than strides sx=2, sy=1"),
        ({"step_start": 0.6, "step_end": 0.4}, "step_start"),
        ({"mlp_ratio": -0.5}, "mlp_ratio"),
        ({"tome_seed": -3}, "tome_seed"),
        ({"mode": "fast"}, "'mode'"),
        ({"max_downsample": "3"}, "'max_downsample'"),
    ],
)
def test_values_that_cannot_run_raise_naming_the_input(sd: ModelPatcher, changes: dict[str, Any], named: str) -> None:
    with pytest.raises((ValueError, TypeError), match=named):
        tome_advanced(sd, **changes)
    assert sd.wrappers == {}


def test_unknown_preset_raises_naming_the_input(sd: ModelPatcher) -> None:
    with pytest.raises(ValueError, match="input 'preset' must be one of Quality, Balanced, Fast, Fastest"):
        tome(sd, "Turbo")


def test_v3_nodes_declare_the_same_inputs() -> None:
    class Recorder:
        def __init__(self, kind: str) -> None:
            self.kind = kind

        def Input(self, name: str, **kw: Any) -> tuple[str, str, dict[str, Any]]:
            return (self.kind, name, kw)

        def Output(self) -> str:
            return self.kind

    class FakeIO:
        Model, Float, Int, Boolean, Combo = (Recorder(k) for k in ("MODEL", "FLOAT", "INT", "BOOLEAN", "COMBO"))

        class ComfyNode:
            pass

        @staticmethod
        def Schema(**kw: Any) -> dict[str, Any]:
            return kw

        @staticmethod
        def NodeOutput(*values: Any) -> tuple[Any, ...]:
            return values

    nodes = v3_nodes(FakeIO)
    schema = nodes[TOME_ADVANCED_NODE].define_schema()
    names = [name for _, name, _ in schema["inputs"]]
    classic = list(NODE_CLASS_MAPPINGS[TOME_ADVANCED_NODE].INPUT_TYPES()["required"])
    assert names == classic and schema["node_id"] == TOME_ADVANCED_NODE
    for node_id in (TOME_NODE, TOME_ADVANCED_NODE):
        assert nodes[node_id].define_schema()["description"] == NODE_CLASS_MAPPINGS[node_id].DESCRIPTION
    ratio = next(kw for kind, name, kw in schema["inputs"] if name == "ratio")
    spec = tome_core.field_spec("ratio")
    assert (ratio["min"], ratio["max"], ratio["default"]) == (spec.minimum, spec.maximum, spec.default)
    model = load_checkpoint("sd")
    (out,) = nodes[TOME_NODE].execute(model, "Fast")
    assert out.get_wrappers(OUTER_SAMPLE, WRAPPER_KEY) and NODE_DISPLAY_NAME_MAPPINGS[TOME_NODE]


# ---------------------------------------------------------------------------------------------- node search


def test_node_ids_stay_and_the_names_put_ours_first_in_comfyuis_node_search() -> None:
    """The front-end ranks a node whose id or display name equals the query above one that only starts with it
    (TomePatchModel, used more often, wins that tie): so the preset node's display name is exactly "ToMe", and the
    advanced node's holds "token merging" (a query the built-in does not match). Saved workflows keep the ids."""
    assert list(NODE_CLASS_MAPPINGS) == ["tome_ToMe", "tome_ToMeAdvanced"]
    assert NODE_DISPLAY_NAME_MAPPINGS[TOME_NODE] == "ToMe"
    assert "token merging" in NODE_DISPLAY_NAME_MAPPINGS[TOME_ADVANCED_NODE].lower()
    assert not NODE_DISPLAY_NAME_MAPPINGS[TOME_ADVANCED_NODE].lower().startswith("tomepatch")
    for cls in NODE_CLASS_MAPPINGS.values():
        assert {"ToMe", "token merging"} <= set(cls.SEARCH_ALIASES)


@pytest.mark.parametrize("supported", [True, False])
def test_v3_schema_gets_search_aliases_only_where_comfyui_takes_them(supported: bool) -> None:
    seen: dict[str, Any] = {}

    class IO:
        class ComfyNode:
            pass

        class Model:
            @staticmethod
            def Input(name: str, **kw: Any) -> str:
                return name

            @staticmethod
            def Output() -> str:
                return "MODEL"

        Combo = Model

        if supported:

            @staticmethod
            def Schema(node_id: str, search_aliases: list[str] | None = None, **kw: Any) -> None:
                seen.update(kw, node_id=node_id, search_aliases=search_aliases)
        else:

            @staticmethod
            def Schema(  # the fields of ComfyUI 0.3.64's io.Schema that the nodes use
                node_id: str,
                display_name: str,
                category: str,
                description: str,
                inputs: list[Any],
                outputs: list[Any],
            ) -> None:
                seen.update(node_id=node_id, display_name=display_name)

    v3_nodes(IO)[TOME_NODE].define_schema()
    assert seen["node_id"] == TOME_NODE
    assert ("token merging" in seen["search_aliases"]) if supported else ("search_aliases" not in seen)


# ---------------------------------------------------------------------------------------------- the root entry point


def test_root_init_is_cheap_and_exports_the_mappings() -> None:
    """As ComfyUI loads a custom node folder: the root __init__.py under a path-derived name, in a fresh process."""
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('custom_nodes_x_tome', {str(ROOT / '__init__.py')!r})\n"
        "module = importlib.util.module_from_spec(spec); sys.modules[spec.name] = module\n"
        "spec.loader.exec_module(module)\n"
        "heavy = [m for m in ('torch', 'tome_webui', 'gradio', 'tome_core', 'modules') if m in sys.modules]\n"
        "print(sorted(module.NODE_CLASS_MAPPINGS), sorted(module.NODE_DISPLAY_NAME_MAPPINGS), heavy)\n"
        # What ComfyUI reads when it lists the nodes, after the import: then the core loads.
        "print('Balanced: ' in module.NODE_CLASS_MAPPINGS['tome_ToMe'].DESCRIPTION)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd="/")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"{sorted([TOME_NODE, TOME_ADVANCED_NODE])} {sorted([TOME_NODE, TOME_ADVANCED_NODE])} []",
        "True",
    ]


#: Top-level names our checkout holds besides our own packages, which another custom node may import as its own.
FOREIGN_NAMES = ("scripts", "install", "tests", "examples", "javascript", "docs")


def test_root_init_shadows_no_module_and_leaves_sys_path_alone() -> None:
    """ComfyUI loads many custom nodes into one process: after ours is imported (and has run a node, so its lazy
    imports of tome_core have happened) `sys.path` must be as it was, and `import scripts` / `install` / `tests`
    / `examples` must not find our folders. A stranger's `scripts` package placed on sys.path after the import
    is the one `import scripts` gets."""
    code = (
        "import importlib.util, json, os, sys, tempfile\n"
        "before = list(sys.path)\n"
        f"root = {str(ROOT)!r}\n"
        "spec = importlib.util.spec_from_file_location('custom_nodes_x_tome', os.path.join(root, '__init__.py'))\n"
        "module = importlib.util.module_from_spec(spec); sys.modules[spec.name] = module\n"
        "spec.loader.exec_module(module)\n"
        f"module.NODE_CLASS_MAPPINGS[{TOME_ADVANCED_NODE!r}].INPUT_TYPES()  # imports tome_core lazily\n"
        "after = list(sys.path)\n"
        "other = tempfile.mkdtemp()\n"
        "os.makedirs(os.path.join(other, 'scripts'))\n"
        "open(os.path.join(other, 'scripts', '__init__.py'), 'w').close()\n"
        "sys.path.append(other)\n"
        "import scripts\n"
        "found = {}\n"
        f"for name in {FOREIGN_NAMES!r}:\n"
        "    spec = importlib.util.find_spec(name) if name != 'scripts' else scripts.__spec__\n"
        "    found[name] = spec.origin or str(list(spec.submodule_search_locations or ())) if spec else None\n"
        "ours = {n: os.path.dirname(os.path.abspath(sys.modules[n].__file__)) for n in ('tome_core', 'tome_comfy')}\n"
        "print(json.dumps({'before': before, 'after': after, 'found': found, 'ours': ours, 'other': other}))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd="/")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["after"] == out["before"], "importing the node changed sys.path"
    shadowed = {name: where for name, where in out["found"].items() if where and str(ROOT) in where}
    assert not shadowed, f"modules resolved to our checkout: {shadowed}"
    assert out["found"]["scripts"].startswith(out["other"])
    assert out["ours"] == {"tome_core": str(ROOT / "tome_core"), "tome_comfy": str(ROOT / "tome_comfy")}


def test_a_second_copy_of_our_packages_is_refused_by_name(tmp_path: Path) -> None:
    """Two checkouts in custom_nodes: the second must fail to load, saying why, not run the first one's core."""
    (tmp_path / "tome_core").mkdir()
    (tmp_path / "tome_core" / "__init__.py").write_text("")
    code = (
        "import importlib.util, sys\n"
        f"sys.path.insert(0, {str(tmp_path)!r}); import tome_core; sys.path.pop(0)\n"
        f"spec = importlib.util.spec_from_file_location('custom_nodes_x_tome', {str(ROOT / '__init__.py')!r})\n"
        "module = importlib.util.module_from_spec(spec); sys.modules[spec.name] = module\n"
        "spec.loader.exec_module(module)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd="/")
    assert result.returncode != 0
    assert f"another copy of tome_core is already loaded from {tmp_path / 'tome_core'}" in result.stderr


def test_install_py_installs_nothing_when_comfyui_manager_runs_it() -> None:
    """ComfyUI-Manager runs `python install.py` in the node folder, with no WebUI `launch` module."""
    result = subprocess.run([sys.executable, "install.py"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "nothing to install" in result.stdout
    assert not (ROOT / "requirements.txt").exists()  # Manager would pip-install it


def test_a_family_with_a_speed_up_but_no_change_figure_says_so() -> None:
    """As the WebUI's hint does: a speed-up alone would read as a promise about the image."""
    from tome_comfy.inputs import family_text

    preset = tome_core.get_preset("balanced")
    fields = preset.families["qwen"]  # a family nothing trained here measured (Flux.1 and Wan have figures)
    per = "over a generation" if fields.get("step_start", 0.0) > 0 or fields.get("step_end", 1.0) < 1 else "per step"
    text = family_text(preset, "qwen")
    assert f"faster {per}" in text and text.endswith("its change not measured yet")
    assert "not measured" not in family_text(tome_core.get_preset("balanced"), "sd")
