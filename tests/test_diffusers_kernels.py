"""Each query's own key under diffusers' other attention backends (issue 58): `model.set_attention_backend("sage")`
and the like make each attention processor call its library (SageAttention, flash-attn, xformers) from diffusers'
`attention_dispatch`, never scaled_dot_product_attention. The patch routes a reduced block's call to diffusers'
native backend for that block's forward, runs the kept keys' attention with the library the user chose (the
function diffusers imported) and joins each query's own key through its log-sum-exp; every other call runs the
user's backend. No real kernel here: the libraries are the stand-ins of tests/attention_kernels.py, put where
diffusers keeps them, with diffusers' availability flags set, for one test each."""

from __future__ import annotations

import math
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import tome_core
from tome_core import kernels
from tome_core.kernels import RUNS

import attention_kernels as lib
from dit_models import TEXT, TINY, H, Tiny, W

#: diffusers' backend -> (its availability flag, where diffusers keeps the library function, the stand-in, the
#: kernel's name in the stats).
LIBRARIES: dict[str, tuple[str, str, Callable[..., Any], str]] = {
    "sage": ("_CAN_USE_SAGE_ATTN", "sageattn", lib.sageattn, "SageAttention"),
    "flash": ("_CAN_USE_FLASH_ATTN", "flash_attn_func", lib.flash_attn_func, "flash-attn"),
    "_flash_3": ("_CAN_USE_FLASH_ATTN_3", "flash_attn_3_func", lib.flash_attn_func, "flash-attn 3"),
    "xformers": ("_CAN_USE_XFORMERS_ATTN", "xops", lib.xformers.ops, "xformers"),
}

#: Keys/values subsampled 2x2 in every block at every step: the presets run Flux.1's last blocks on merged tokens
#: (the model's own attention there) and only in later steps, where these tests count every block's kernel.
KV = {"mode": "kv", "sx": 2, "sy": 2}


def dispatch() -> Any:
    from diffusers.models import attention_dispatch

    return attention_dispatch


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, bool]]:
    """Every stand-in library call diffusers or the core makes: (function, keys, whether it asked for the lse).
    Also puts back diffusers' process-wide active backend, which `set_attention_backend` sets."""
    ad = dispatch()
    monkeypatch.setattr(ad._AttentionBackendRegistry, "_active_backend", ad._AttentionBackendRegistry._active_backend)
    seen: list[tuple[str, int, bool]] = []

    def spy(name: str, fn: Callable[..., Any], seq: Callable[[Any], int]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            key = args[1] if len(args) > 1 else kwargs.get("k", kwargs.get("key"))
            asked = bool(kwargs.get("return_lse") or kwargs.get("return_attn_probs")) or name.endswith("partial")
            seen.append((name, seq({**kwargs, "key": key}), asked))
            return fn(*args, **kwargs)

        return call

    def nhd(kwargs: dict[str, Any]) -> int:  # the keys' sequence: [B, L, H, D], or [B, H, L, D] in HND layout
        return int(kwargs["key"].shape[2 if kwargs.get("tensor_layout") == "HND" else 1])

    ops = lib.xformers.ops
    standins = {
        "sageattn": spy("sageattn", lib.sageattn, nhd),
        "flash_attn_func": spy("flash_attn_func", lib.flash_attn_func, nhd),
        "flash_attn_3_func": spy("flash_attn_3_func", lib.flash_attn_func, nhd),
        "xops": type(ops)(
            memory_efficient_attention=spy("memory_efficient_attention", ops.memory_efficient_attention, nhd),
            memory_efficient_attention_partial=spy(
                "memory_efficient_attention_partial", ops.memory_efficient_attention_partial, nhd
            ),
        ),
    }
    for flag, attr, _, _ in LIBRARIES.values():
        monkeypatch.setattr(ad, flag, True)
        monkeypatch.setattr(ad, attr, standins[attr])

    def flash_3_op(q: Any, k: Any, v: Any, softmax_scale: Any = None, causal: bool = False, **_: Any) -> Any:
        # diffusers' `_flash_3` backend calls flash-attn 3 through a custom op registered for CUDA alone: the same
        # call of the function (lse [B, H, L] turned to [B, L, H]), on the CPU.
        out, lse, *_rest = ad.flash_attn_3_func(
            q, k, v, softmax_scale=softmax_scale, causal=causal, return_attn_probs=True
        )
        return out, lse.permute(0, 2, 1)

    monkeypatch.setattr(ad, "_wrapped_flash_attn_3", flash_3_op)
    return seen


def half(tiny: Tiny) -> tuple[torch.nn.Module, dict[str, Any]]:
    """The tiny Flux in float16 (SageAttention and flash-attn run 16-bit tensors only), and its inputs."""
    return tiny.build().to(torch.float16), half_inputs(tiny, 0)


def half_inputs(tiny: Tiny, seed: int) -> dict[str, Any]:
    return {
        name: value.to(torch.float16) if name not in ("img_ids", "txt_ids") and torch.is_tensor(value) else value
        for name, value in tiny.inputs(seed).items()
    }


def kept_keys(config: Any) -> int:
    """The keys a reduced block of the tiny Flux keeps: the text's and one per cell of the H x W grid."""
    return TEXT + math.ceil(H / config.sy) * math.ceil(W / config.sx)


def forward(model: torch.nn.Module, inputs: dict[str, Any]) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs)[0]


def backends(model: torch.nn.Module) -> list[tuple[bool, Any]]:
    """Each attention processor's own backend as it holds it: (set on the instance, its value)."""
    found = []
    for module in model.modules():
        processor = getattr(module, "processor", None)
        if processor is not None and hasattr(processor, "_attention_backend"):
            found.append(("_attention_backend" in vars(processor), vars(processor).get("_attention_backend")))
    return found


@pytest.mark.parametrize("backend", list(LIBRARIES))
def test_each_query_keeps_its_own_key_under_the_users_backend(backend: str, calls: list[Any]) -> None:
    """Under `set_attention_backend(backend)` every reduced block runs the kept keys' attention with that backend's
    library, asking for its log-sum-exp, and each query's own key joins them: the output is the native backend's
    with ToMe, within the kernel's own error (SageAttention's INT8 rounding; the others' float32 accumulation)."""
    tiny = TINY["flux"]()
    model, inputs = half(tiny)
    native = forward(model, inputs)
    tome_core.apply_patch(model, **KV)
    native_tome = forward(model, inputs)
    tome_core.remove_patch(model)

    model.set_attention_backend(backend)
    plain = forward(model, inputs)
    tome_core.apply_patch(model, **KV)
    calls.clear()
    out = forward(model, inputs)
    stats = tome_core.stats(model)
    config = tome_core.get_config(model)
    tome_core.remove_patch(model)

    assert stats is not None and stats.applied == stats.reached == stats.planned == stats.selected > 0, stats
    assert stats.kernels == ((LIBRARIES[backend][3], stats.applied),)
    assert dict(stats.modules)["own"] == stats.applied and stats.own_key_off == ()
    kept = kept_keys(config)
    assert [lse for _, keys, lse in calls if keys == kept] == [True] * stats.applied, calls  # one per reduced block
    assert all(keys in (kept, TEXT + H * W) for _, keys, _ in calls)  # the others: the blocks outside the window
    within_kernel_error(out, native_tome, plain, native)


def within_kernel_error(out: torch.Tensor, expected: torch.Tensor, plain: torch.Tensor, native: torch.Tensor) -> None:
    """`out` (the user's kernel with ToMe) is `expected` (the native backend with ToMe) within the kernel's own error
    on the model (`plain` against `native`, unpatched) and one rounding of the output: the largest difference within
    that error and one ulp at the output's size, the mean within 1.25 times its mean and a quarter of an ulp (the
    combine rounds once per reduced block: four here). Each query without its own key (the kept keys alone) fails
    both, with every kernel here."""
    eps = torch.finfo(out.dtype).eps
    error, kernel_error = (out.float() - expected.float()).abs(), (plain.float() - native.float()).abs()
    assert float(error.max()) <= float(kernel_error.max()) + eps * float(expected.abs().max()), (
        error.max(),
        kernel_error.max(),
    )
    mean, kernel_mean = float(error.mean()), float(kernel_error.mean())
    assert mean <= 1.25 * kernel_mean + eps / 4 * float(expected.abs().mean()), (mean, kernel_mean)


def test_removal_leaves_the_users_backends_and_run_exactly(calls: list[Any]) -> None:
    """The processors' backends are never touched outside a reduced block's forward: during and after a patched
    run they hold what the user set, and after `remove_patch` the output is the unpatched SageAttention run's,
    bitwise; diffusers' process-wide backend stays the user's."""
    tiny = TINY["flux"]()
    model, inputs = half(tiny)
    model.set_attention_backend("sage")
    before, active = backends(model), dispatch()._AttentionBackendRegistry._active_backend
    plain = forward(model, inputs)
    tome_core.apply_patch(model, **KV)
    seen: list[list[tuple[bool, Any]]] = []
    blocks = model.transformer_blocks[0].register_forward_hook(lambda *_: seen.append(backends(model)))
    forward(model, inputs)
    blocks.remove()
    assert tome_core.stats(model).applied > 0  # type: ignore[union-attr]
    tome_core.remove_patch(model)
    assert seen == [before] and backends(model) == before
    assert dispatch()._AttentionBackendRegistry._active_backend == active
    assert torch.equal(forward(model, inputs), plain)


def test_the_process_wide_backend_is_followed_too(calls: list[Any]) -> None:
    """A processor without a backend of its own runs diffusers' active one (the `attention_backend(...)` context
    manager, or DIFFUSERS_ATTN_BACKEND): under `attention_backend("sage")` the reduced blocks run SageAttention with
    each query's own key, and the processors are left without a backend of their own."""
    from diffusers.models.attention_dispatch import attention_backend

    tiny = TINY["flux"]()
    model, inputs = half(tiny)
    before = backends(model)
    assert before and not any(own for own, _ in before)
    tome_core.apply_patch(model, **KV)
    with attention_backend("sage"):
        forward(model, inputs)
    stats = tome_core.stats(model)
    tome_core.remove_patch(model)
    assert stats is not None and stats.applied == stats.selected > 0
    assert stats.kernels == (("SageAttention", stats.applied),) and dict(stats.modules)["own"] == stats.applied
    assert any(lse for _, _, lse in calls) and backends(model) == before


def test_a_call_the_kernel_cannot_take_runs_the_users_backend(calls: list[Any]) -> None:
    """xformers' partial attention takes no mask: a masked call runs diffusers' xformers backend on the kept keys
    (never PyTorch's attention in its place), and the stats name it and why the own key was off."""
    tiny = TINY["flux"]()
    model = tiny.build()
    model.set_attention_backend("xformers")
    tome_core.apply_patch(model, **KV)
    mask = torch.zeros(2, 1, 1, TEXT + H * W)  # additive, as the processors that take a mask make it
    with torch.no_grad():
        model(**tiny.inputs(0), joint_attention_kwargs={"attention_mask": mask})
    stats = tome_core.stats(model)
    config = tome_core.get_config(model)
    tome_core.remove_patch(model)
    assert stats is not None and stats.applied == stats.selected > 0
    assert stats.kernels == (("xformers", stats.applied),)
    assert stats.own_key_off == (("xformers takes no attention mask", stats.applied),)
    kept = kept_keys(config)
    ran = [(name, keys) for name, keys, _ in calls]
    assert ran.count(("memory_efficient_attention", kept)) == stats.applied, ran
    assert not any(name.endswith("partial") for name, _ in ran)


def test_a_backend_the_core_cannot_run_is_left_as_it_is_and_says_why(calls: list[Any]) -> None:
    """flex attention gives the core no kernel to call: the blocks run diffusers' flex backend unreduced, as without
    ToMe, counted planned and not reached, and the stats say why."""
    tiny = TINY["flux"]()
    model = tiny.build()
    model.set_attention_backend("flex")
    before = backends(model)
    with torch.no_grad():
        plain = model(**tiny.inputs(0))[0]
    tome_core.apply_patch(model, **KV)
    with torch.no_grad():
        out = model(**tiny.inputs(0))[0]
    stats = tome_core.stats(model)
    tome_core.remove_patch(model)
    assert torch.equal(out, plain) and backends(model) == before
    assert stats is not None and stats.planned == stats.selected > 0 and stats.reached == stats.applied == 0
    assert stats.not_reached == (
        (f"diffusers' attention backend 'flex' calls a kernel ToMe cannot run ({RUNS})", stats.selected),
    )


@pytest.mark.parametrize(
    ("processor", "why"),
    [
        (SimpleNamespace(), None),  # calls scaled_dot_product_attention itself (diffusers' `Attention` processors)
        (SimpleNamespace(_attention_backend="_native_flash"), None),
        (
            SimpleNamespace(_attention_backend="sage_hub"),
            "diffusers' attention backend 'sage_hub' has no Hub kernel loaded",
        ),
        (
            SimpleNamespace(_attention_backend="sage", _parallel_config=object()),
            "diffusers' attention backend 'sage' runs with context parallelism",
        ),
    ],
)
def test_what_the_core_makes_of_a_processors_backend(processor: Any, why: str | None) -> None:
    """diffusers' native backends reach scaled_dot_product_attention as they are; a Hub kernel diffusers has not
    loaded and context parallelism (the sequence split across devices) leave the block as without ToMe, saying why."""
    found = kernels.diffusers_backend(processor, dispatch())
    assert (found if found is None else found.why) == why
    assert found is None or found.kernel is None


def test_a_compiled_model_runs_the_users_kernel_in_one_graph(
    monkeypatch: pytest.MonkeyPatch, fresh_dynamo: None
) -> None:
    """torch.compile(fullgraph=True) traces the routing (the processor's backend set and put back inside the graph)
    and the user's kernel: one graph for every call, equal to eager, the processors' backends the user's after."""
    ad = dispatch()
    monkeypatch.setattr(ad._AttentionBackendRegistry, "_active_backend", ad._AttentionBackendRegistry._active_backend)
    monkeypatch.setattr(ad, "_CAN_USE_SAGE_ATTN", True)
    monkeypatch.setattr(ad, "sageattn", lib.sageattn)  # no spy: a list it appends to would be a guard
    tiny = TINY["flux"]()
    model, _ = half(tiny)
    model.set_attention_backend("sage")
    before = backends(model)
    tome_core.apply_patch(model, **KV)
    inputs = [half_inputs(tiny, seed) for seed in range(3)]
    eager = [forward(model, given) for given in inputs]
    graphs: list[Any] = []
    compiled = torch.compile(model, backend=lambda gm, _: graphs.append(gm) or gm.forward, fullgraph=True)
    for given, expected in zip(inputs, eager):
        assert torch.equal(forward(compiled, given), expected)
    stats = tome_core.stats(model)
    tome_core.remove_patch(model)
    assert len(graphs) == 1 and backends(model) == before
    assert stats is not None and stats.kernels == (("SageAttention", stats.applied),) and stats.applied > 0


def test_arguments_given_in_place_reach_the_attention() -> None:
    """A scaled_dot_product_attention call inside a hooked module that passes dropout_p and is_causal in place (not
    one ToMe answers or reduces) runs with them, not without."""
    from tome_core.dit import _SdpaKeys

    tiny = TINY["flux"]()
    model = tiny.build()
    tome_core.apply_patch(model, **KV)
    state = model._tome_sd_state
    q, k, v = torch.randn(3, 1, 2, 5, 8).unbind(0)
    with _SdpaKeys(state.hooks[0], state):
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, None, 0.0, True)
    tome_core.remove_patch(model)
    assert torch.equal(out, torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))


def test_every_backend_the_core_can_run_is_a_name_diffusers_knows() -> None:
    """A key diffusers never sets would leave its backend unreached (SageAttention's int8 kernels were keyed
    without their "_sage" prefix)."""
    from diffusers.models.attention_dispatch import AttentionBackendName

    known = {name.value for name in AttentionBackendName}
    assert set(kernels.DIFFUSERS_KERNELS) <= known, set(kernels.DIFFUSERS_KERNELS) - known
