"""The patch under torch.compile(fullgraph=True): one graph per sampling and per size, no recompile from step to
step or from one generation to the next, the compiled output equal to the eager one, a UNet compiled before the
patch merged too, and counts that say what the code that ran really did.

Graphs are counted with a backend that runs the captured FX graph as it is (what dynamo traces does not depend
on the backend); one test compiles with inductor, the default backend. Dynamo's caches are global and keyed by
code objects that every tiny UNet of a kind shares, so each test starts from `torch._dynamo.reset()`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from comfy_stub.unet import build_unet as build_comfy_unet
from torch import fx, nn
from torch._inductor.utils import run_and_get_code

import tome_core
from tome_core.merge import hashed_slots
from tome_core.patch import timestep_key

from tiny_models import WebUILike, build_unet, is_diffusers, make_inputs

pytestmark = pytest.mark.usefixtures("fresh_dynamo")
STEPS = (999.0, 750.0, 500.0, 250.0)  # one sampling; the timestep changes every step
#: Where the merge at level 1 is the point and not the layout: dynamo traces it faster than diffusers_sd1.
SMALL = "diffusers_sd1_small"


class GraphCounter:
    """A torch.compile backend that counts the graphs dynamo hands it and keeps them for inspection."""

    def __init__(self) -> None:
        self.graphs: list[fx.GraphModule] = []

    def __call__(self, gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        self.graphs.append(gm)
        return gm.forward


#: model name -> (builder, model family)
MODELS: dict[str, tuple[Callable[[], nn.Module], str]] = {
    "ldm_sd2": (lambda: build_unet("ldm_sd2_small"), "sd"),  # levels 1 and 2: what tomesd-style merges
    "diffusers_sd1": (lambda: build_unet("diffusers_sd1"), "sd"),
    "diffusers_sdxl": (lambda: build_unet("diffusers_sdxl"), "sdxl"),
    "comfy_sd": (lambda: build_comfy_unet("sd"), "sd"),
    "comfy_sdxl": (lambda: build_comfy_unet("sdxl"), "sdxl"),
}

#: Custom settings: both modes, random partitions on and off, both matchings, shared plans.
CUSTOM: dict[str, dict[str, Any]] = {
    "tomesd-style": {"ratio": 0.5, "use_rand": False, "matching": "global", "max_downsample": 2},
    "random partitions, local": {"ratio": 0.6, "merge_crossattn": True, "max_downsample": 4},
    "global, one plan per stack, MLP": {
        "ratio": 0.5,
        "matching": "global",
        "share_plan": True,
        "merge_mlp": True,
        "mlp_ratio": 0.3,
        "max_downsample": 4,
    },
    "kv, cross-attention and MLP merged": {
        "mode": "kv",
        "merge_crossattn": True,
        "merge_mlp": True,
        "share_plan": True,
        "use_rand": False,
    },
}

#: Every preset on each family and every custom setting, spread over the three UNet implementations (tracing a
#: UNet takes seconds on a CPU, so not every pair).
CASES = [
    pytest.param(model, {"preset": preset}, id=f"{model}-{preset}")
    for model, preset in (
        ("comfy_sd", "quality"),
        ("diffusers_sdxl", "quality"),
        ("diffusers_sd1", "balanced"),
        ("comfy_sdxl", "balanced"),
        ("comfy_sd", "fast"),
        ("diffusers_sdxl", "fast"),
        ("comfy_sd", "fastest"),
        ("comfy_sdxl", "fastest"),
    )
]
CASES += [
    pytest.param(model, CUSTOM[name], id=f"{model}-{name}")
    for model, name in (
        ("ldm_sd2", "tomesd-style"),
        ("diffusers_sd1", "random partitions, local"),
        ("comfy_sd", "global, one plan per stack, MLP"),
        ("diffusers_sdxl", "kv, cross-attention and MLP merged"),
    )
]


def call(unet: nn.Module, inputs: Any, timestep: float) -> torch.Tensor:
    """One UNet call of whichever kind (`unet` may be a torch.compile wrapper)."""
    t = torch.full((inputs.x.shape[0],), timestep)
    inner = getattr(unet, "_orig_mod", unet)
    with torch.no_grad():
        if is_diffusers(inner):
            added = None
            if getattr(inner.config, "addition_embed_type", None) == "text_time":
                added = {"text_embeds": inputs.text_embeds, "time_ids": inputs.time_ids}
            return unet(inputs.x, t, encoder_hidden_states=inputs.context, added_cond_kwargs=added, return_dict=False)[
                0
            ]
        if type(inner).__module__.startswith("comfy_stub"):
            return unet(inputs.x, t, context=inputs.context[..., :32], transformer_options={})
        return unet(inputs.x, t, context=inputs.context)


def assert_close(compiled: torch.Tensor, eager: torch.Tensor) -> None:
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5 * float(eager.abs().max()))


@pytest.mark.parametrize(("model", "fields"), CASES)
def test_patched_unet_compiles_to_one_graph_for_every_sampling(model: str, fields: dict[str, Any]) -> None:
    build, _family = MODELS[model]
    unet = build()
    inputs = make_inputs(2, 16, 16)
    plain = {t: call(unet, inputs, t) for t in STEPS}
    tome_core.apply_patch(unet, **fields)
    selected = tome_core.stats(unet).selected
    counter = GraphCounter()
    compiled = torch.compile(unet, backend=counter, fullgraph=True)
    changed = False
    for t in STEPS:
        eager = call(unet, inputs, t)
        assert_close(call(compiled, inputs, t), eager)
        changed |= not torch.equal(eager, plain[t])
    assert changed == (selected > 0)
    assert len(counter.graphs) == 1
    assert_ready_for_cuda_graphs(counter.graphs[0])
    # What eager calls merge at this size (a preset's cells may not fit the smallest grids: those blocks run whole).
    tome_core.reset_stats(unet)
    for t in STEPS:
        call(unet, inputs, t)
    eager_stats = tome_core.stats(unet)
    merged = (eager_stats.applied, eager_stats.reached, eager_stats.planned)
    assert eager_stats.applied > 0 or selected == 0

    # The next generation patches afresh with the same settings: the graph is reused, and only compiled calls run,
    # so the counts come from what the compiled graph did.
    tome_core.remove_patch(unet)
    tome_core.apply_patch(unet, **fields)
    for t in STEPS:
        call(compiled, inputs, t)
    stats = tome_core.stats(unet)
    assert len(counter.graphs) == 1
    assert (stats.unet_calls, stats.applied, stats.reached, stats.planned) == (len(STEPS), *merged)
    tome_core.remove_patch(unet)
    for t in STEPS[:2]:
        torch.testing.assert_close(call(unet, inputs, t), plain[t], rtol=0, atol=0)
    # Removed, the patched graph's guards fail: the compiled model would trace the plain forward afresh (as any
    # unpatched model's first call does) instead of running the patched graph. Asked to fail on a recompile, it
    # says so (fullgraph: the UNet's forward is its one frame). The other tests here run such plain graphs through.
    with torch.compiler.set_stance("fail_on_recompile"), pytest.raises(RuntimeError, match="Detected recompile"):
        call(compiled, inputs, STEPS[0])
    assert len(counter.graphs) == 1


def test_step_window_costs_at_most_one_more_graph() -> None:
    unet = build_unet(SMALL)
    inputs = make_inputs(1, 16, 16)
    tome_core.apply_patch(unet, preset="balanced", step_start=0.3, step_end=0.7)
    counter = GraphCounter()
    compiled = torch.compile(unet, backend=counter, fullgraph=True)
    total = 10
    for step in range(total):
        tome_core.set_step(unet, step, total)
        t = 999.0 - 99 * step
        assert_close(call(compiled, inputs, t), call(unet, inputs, t))
    stats = tome_core.stats(unet)
    assert len(counter.graphs) == 2  # inside the window and outside it
    assert stats.active_calls == 2 * 4 and stats.applied == stats.selected  # steps 3-6, eager and compiled


def test_step_window_of_a_bare_unet_reads_the_timestep_outside_the_graph() -> None:
    # ComfyUI's ldm-style UNet: `forward(x, timesteps, context)`, the timestep positional as in ldm (the ldm class
    # itself costs dynamo ~20 s a graph, unrolling each block's `self.parameters()`; tomesd-style runs on it above).
    unet = build_comfy_unet("sd")
    inputs = make_inputs(1, 16, 16)
    tome_core.apply_patch(unet, preset="quality", step_start=0.2, step_end=0.6)
    counter = GraphCounter()
    compiled = torch.compile(unet, backend=counter, fullgraph=True)
    for t in (999.0, 900.0, 700.0, 500.0, 300.0, 100.0):
        call(compiled, inputs, t)
    assert len(counter.graphs) == 2
    assert tome_core.stats(unet).active_calls == 2  # fractions 0.3 and 0.5


#: Placeholder names of graph inputs read from the patch's state (dynamo names them after their source).
STATE_INPUT = re.compile(r"self_state_|_config_|_grids_|_ratio|_tokens|_level")


@pytest.mark.parametrize("dynamic", [None, True])
def test_a_new_preset_or_size_keeps_the_patch_numbers_constant(dynamic: bool | None) -> None:
    # ComfyUI live (2026-11-26): TorchCompileModel, Balanced at 128 px, then Fastest at 256 px in the same server:
    # dynamo's automatic dynamic shapes made the strides and grid sizes it read from the patch symbolic on the
    # recompile (they had changed), and inductor failed on them (AssertionError: (VR[-int_oo, oo], ...)); with
    # dynamic=True they were symbolic from the start. A plan is made for one setting and one grid: each is a
    # constant of its graph.
    unet = build_unet(SMALL)
    counter = GraphCounter()
    compiled = torch.compile(unet, backend=counter, fullgraph=True, dynamic=dynamic)
    for preset, size in (("balanced", 16), ("fastest", 32), ("fast", 24), ("quality", 32)):
        tome_core.apply_patch(unet, preset=preset)
        inputs = make_inputs(2, size, size)
        assert_close(call(compiled, inputs, 500.0), call(unet, inputs, 500.0))
        tome_core.remove_patch(unet)
        inputs_from_state = {
            node.name: node.meta.get("example_value")
            for node in counter.graphs[-1].graph.nodes
            if node.op == "placeholder" and STATE_INPUT.search(node.name)
        }
        if dynamic:
            # dynamic=True: dynamo makes every float an input (the UNet's own too), never an integer we planned with
            inputs_from_state = {k: v for k, v in inputs_from_state.items() if not isinstance(v, torch.Tensor)}
        assert inputs_from_state == {}, (preset, size)


def test_a_new_size_compiles_once_more_a_static_graph() -> None:
    # dynamo's automatic dynamic shapes would trace the second size with symbolic sizes, and the merge's grid
    # arithmetic made that trace several times slower than the plain UNet's (minutes on SD1.5): ours keeps the
    # latent's height and width static, so each size is one graph of plain numbers, and a size seen before reuses it.
    unet = build_unet(SMALL)
    tome_core.apply_patch(unet, preset="fast")
    counter = GraphCounter()
    compiled = torch.compile(unet, backend=counter, fullgraph=True)
    for size, graphs in ((16, 1), (24, 2), (16, 2)):
        inputs = make_inputs(2, size, size)
        assert_close(call(compiled, inputs, 500.0), call(unet, inputs, 500.0))
        assert len(counter.graphs) == graphs
    latents = [
        node.meta["example_value"]
        for node in counter.graphs[-1].graph.nodes
        if node.op == "placeholder" and getattr(node.meta.get("example_value"), "dim", lambda: 0)() == 4
    ]
    assert latents, "no 4-d input in the graph"
    sizes = [tuple(latent.shape[-2:]) for latent in latents]
    assert all(isinstance(d, int) for hw in sizes for d in hw), sizes
    assert (24, 24) in sizes


def _compile_first(how: str) -> tuple[nn.Module, Any, Callable[[Any, float], torch.Tensor]]:
    """A UNet compiled before any patch, the object a host would patch, and how the host calls it."""
    unet = build_unet(SMALL)
    counter = GraphCounter()
    if how == "in place":
        unet.compile(backend=counter, fullgraph=True)
        return unet, (unet, counter), lambda inputs, t: call(unet, inputs, t)
    compiled = torch.compile(unet, backend=counter, fullgraph=True)
    if how == "the wrapper":
        return unet, (compiled, counter), lambda inputs, t: call(compiled, inputs, t)
    if how == "the module it wraps":
        return unet, (unet, counter), lambda inputs, t: call(compiled, inputs, t)
    webui = WebUILike(unet)
    webui.model.diffusion_model = compiled  # a host that swapped in the compiled UNet
    return unet, (webui, counter), lambda inputs, t: call(compiled, inputs, t)


@pytest.mark.parametrize("how", ["in place", "the wrapper", "the module it wraps", "a host's model"])
def test_unet_compiled_before_the_patch_runs_merged(how: str) -> None:
    unet, (target, counter), run = _compile_first(how)
    inputs = make_inputs(2, 16, 16)
    plain = run(inputs, 500.0)
    assert len(counter.graphs) == 1
    tome_core.apply_patch(target, preset="balanced")
    assert tome_core.find_unet(target) is unet
    merged = run(inputs, 500.0)
    stats = tome_core.stats(target)
    assert len(counter.graphs) == 2  # traced again, once, with the patch
    assert not torch.equal(merged, plain)
    assert stats.applied == stats.selected > 0 and stats.unet_calls == 1
    tome_core.remove_patch(target)
    torch.testing.assert_close(run(inputs, 500.0), plain, rtol=0, atol=0)
    assert len(counter.graphs) == 2  # the first graph is valid again
    compiled_merged = merged
    eager_unet = build_unet(SMALL)
    tome_core.apply_patch(eager_unet, preset="balanced")
    assert_close(compiled_merged, call(eager_unet, inputs, 500.0))


@pytest.mark.parametrize("dynamic", [None, False])
def test_counts_stay_true_when_a_compiled_graph_cannot_see_the_patch(dynamic: bool | None) -> None:
    """A host that drops torch.compile's guards on modules may keep running the graph it traced before the patch:
    then the counts say the blocks ran without ToMe's hooks, never that they merged. (Since ToMe marks the latent's
    sizes static for each call, a tensor guard that module guard filters keep, the graph is traced again with the
    patch here and merges; a host whose latent carries marks of its own would keep the old graph.)"""
    unet = build_unet(SMALL)
    counter = GraphCounter()
    skip_module_guards = torch.compiler.skip_guard_on_all_nn_modules_unsafe
    compiled = torch.compile(
        unet, backend=counter, fullgraph=True, dynamic=dynamic, options={"guard_filter_fn": skip_module_guards}
    )
    inputs = make_inputs(1, 16, 16)
    plain = call(compiled, inputs, 500.0)
    tome_core.apply_patch(unet, preset="balanced")
    out = call(compiled, inputs, 500.0)
    stats = tome_core.stats(unet)
    if torch.equal(out, plain):
        assert len(counter.graphs) == 1
        assert (stats.unet_calls, stats.block_calls, stats.applied) == (1, 0, 0)
    else:
        assert len(counter.graphs) == 2
        assert stats.applied == stats.selected > 0 and stats.unet_calls == 1


#: What a compiled graph must never do on a GPU: read back to the host, draw random numbers, size by data.
HOST_READS = {"item", "tolist", "cpu", "numpy", "nonzero", "unique", "masked_select", "bincount", "__bool__"}
RANDOM = {"rand", "randn", "randint", "randperm", "bernoulli", "multinomial", "normal_", "uniform_"}
FACTORIES = {"arange", "ones", "zeros", "full", "empty", "tensor"}


def assert_ready_for_cuda_graphs(graph: fx.GraphModule) -> None:
    """Nothing our code put in the graph reads back, draws from a generator or makes a tensor on the host."""
    for node in graph.graph.nodes:
        if node.op not in ("call_function", "call_method"):
            continue
        frames = [line for line in node.meta.get("stack_trace", "").splitlines() if line.strip().startswith("File")]
        if not frames or "tome_core" not in frames[-1]:
            continue  # the model's own code (its timestep embedding makes an arange on the host, say)
        name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", str(node.target))
        assert name not in HOST_READS | RANDOM, node.format_node()
        assert "generator" not in node.kwargs, node.format_node()
        if name in FACTORIES:
            assert node.kwargs.get("device") is not None, f"made on the host: {node.format_node()}"


def test_the_graph_check_sees_a_tensor_made_on_the_host() -> None:
    def made_on_host(x: torch.Tensor) -> torch.Tensor:
        return x + torch.ones(x.shape[-1])

    made_on_host.__code__ = made_on_host.__code__.replace(co_filename="/x/tome_core/fake.py")
    counter = GraphCounter()
    torch.compile(made_on_host, backend=counter, fullgraph=True)(torch.zeros(2, 3))
    with pytest.raises(AssertionError, match="made on the host"):
        assert_ready_for_cuda_graphs(counter.graphs[0])


def large_literals(codes: list[str]) -> list[int]:
    """Integer literals of 2**31 and more in inductor's generated code: its GPU (triton) kernels index in int32 and
    fail on such a literal next to an index (H200, 2026-11-26: "Scalar 2654435761 is out of range for type int32");
    the CPU kernels this test can build come from the same index expressions."""
    found = (int(m) for code in codes for m in re.findall(r"(?<![\w.])(\d{10,})(?![\w.])", code))
    return [value for value in found if value >= 2**31]


def test_inductor_runs_with_one_vector_switch_and_the_checkout_cache() -> None:
    """Every process of the run reads the same vector switch at import and caches in the checkout: a switch flipped
    inside one test let a process write vector C++ under the switch-off key, which the next process built without the
    vector headers (CI, 2026-11-29)."""
    from torch._inductor import config
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    assert config.cpp.vec_isa_ok is False
    assert Path(cache_dir()).resolve().is_relative_to(Path(__file__).resolve().parents[1])


def test_random_partitions_compile_into_int32_indexed_kernels() -> None:
    def draw(t: torch.Tensor) -> torch.Tensor:
        return hashed_slots(4096, 16, timestep_key(t, t.device), 0x70E5)

    t = torch.tensor([999.0])
    out, codes = run_and_get_code(torch.compile(draw, fullgraph=True), t)
    assert torch.equal(out, draw(t))
    assert large_literals(codes) == []


def test_inductor_float16_output_equals_eager() -> None:
    """Inductor, the default backend, in float16, on the preset with the most kinds of kernels (random partitions,
    whole stacks merged, keys/values pooled), at two timesteps: equal to eager, the second timestep without a
    recompile, counted as merged, and its kernels index without literals past int32. One compile for all of it
    (inductor's C++ compile dominates this file).

    The SDXL presets merge whole stacks (batched products over one-hot plan matrices) and pool keys/values: in a
    float16 graph every matrix must stay float16 (H100, 2026-11-26: inductor's lowering of a scatter-built one-hot
    matrix gave float32 and the graph failed to compile). Inductor lowers the graph and indexes its kernels the
    same with or without the CPU's vector instructions (conftest turns them off for the whole run)."""
    unet = build_unet("diffusers_sdxl").half()
    tome_core.apply_patch(unet, preset="fastest")
    inputs = make_inputs(2, 16, 16)
    half = type(inputs)(
        **{k: v.half() if torch.is_tensor(v) and v.is_floating_point() else v for k, v in vars(inputs).items()}
    )
    compiled = torch.compile(unet, fullgraph=True)
    out, codes = run_and_get_code(call, compiled, half, 999.0)
    with torch._dynamo.config.patch(error_on_recompile=True):
        second = call(compiled, half, 500.0)
    assert codes and large_literals(codes) == []
    for t, got in ((999.0, out), (500.0, second)):
        assert got.dtype == torch.float16
        torch.testing.assert_close(got.float(), call(unet, half, t).float(), rtol=2e-2, atol=2e-2)
    stats = tome_core.stats(unet)
    assert stats.applied == stats.selected > 0
    assert dict(stats.modules).get("attn1", 0) > 0 and dict(stats.modules).get("kv", 0) > 0


def _graph_inputs(graph: fx.GraphModule) -> int:
    return sum(1 for node in graph.graph.nodes if node.op == "placeholder")


def test_the_graph_takes_no_tensor_from_the_patch() -> None:
    # Under CUDA graphs (mode="reduce-overhead") every tensor a graph reads from Python state is a static input:
    # when the next patch (the next generation) or the allocator hands it another address, the CUDA graph is
    # recorded again (H200, SD1.5 1024 px: 28 -> 65 ms per call), and past inductor's re-record limit it runs
    # without CUDA graphs. The patched graph's inputs must be the plain graph's: the UNet's own. One generation
    # after another, each with its own setting: random partitions, shared plans with keys/values, fixed partitions.
    unet = build_unet(SMALL)
    inputs = make_inputs(2, 16, 16)
    counter = GraphCounter()
    compiled = torch.compile(unet, backend=counter, fullgraph=True)
    call(compiled, inputs, 500.0)
    settings = {"random partitions": {"preset": "fast"}, "shared plans, kv": {"preset": "balanced"}}
    settings["fixed partitions"] = CUSTOM["tomesd-style"]
    for n, (name, fields) in enumerate(settings.items(), start=2):
        tome_core.apply_patch(unet, **fields)
        assert_close(call(compiled, inputs, 500.0), call(unet, inputs, 500.0))
        assert tome_core.stats(unet).applied > 0, name
        tome_core.remove_patch(unet)
        assert len(counter.graphs) == n, name
        assert _graph_inputs(counter.graphs[-1]) == _graph_inputs(counter.graphs[0]), name
