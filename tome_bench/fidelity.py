"""Fidelity on models that attend like trained ones: the references the presets are held to, and the measures.

tomesd's default (ratio 0.5, 2x2 cells, self-attention only, global matching) and ToDo's default (self-attention's
keys/values from the tokens subsampled 2x2, arXiv 2402.13573), each at the first level with attention of a family:
level 1 on SD1/SD2, level 2 on SDXL (where tomesd's own default, max_downsample 1, merges nothing).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tome_bench import archs

#: The first level with attention per model family.
TOP_LEVEL = {"sd": 1, "sdxl": 2}


def references(family: str) -> dict[str, dict[str, Any]]:
    """name -> TomeConfig fields of each reference at `family`'s first level with attention, in our core (ToDo's
    subsampling as our 2x2 average pooling, the same cost on a GPU); on a diffusion transformer the naive port
    (keys/values 2x2 in every block)."""
    if family not in TOP_LEVEL:
        return {"ref-naive-port": {"mode": "kv", "sx": 2, "sy": 2}}
    top = TOP_LEVEL[family]
    level = {"min_downsample": top, "max_downsample": top}
    return {
        "ref-tomesd": {"ratio": 0.5, "matching": "global", **level},
        "ref-todo": {"mode": "kv", **level},
    }


# ---------------------------------------------------------------------------------------------- the references


def _grid(tokens: int, latent: tuple[int, int]) -> tuple[int, int]:
    """(h, w) of the token grid of a block with `tokens` tokens, for a latent of `latent` (h, w)."""
    h, w = latent
    for level in (1, 2, 4, 8, 16):
        gh, gw = -(-h // level), -(-w // level)
        if gh * gw == tokens:
            return gh, gw
    raise ValueError(f"{tokens} tokens fit no level of a {h}x{w} latent")


@contextlib.contextmanager
def todo(unet: nn.Module, factor: int = 2, levels: Sequence[int] = (1,), mode: str = "nearest-exact") -> Iterator[None]:
    """ToDo as its code does it: self-attention's keys and values come from the block's (normed) tokens subsampled
    by `factor` in both directions (`F.interpolate`, nearest-exact, ToDo's default), in the blocks at `levels`.
    The latent size is read from the UNet's input at each call."""
    from tome_core import transformer_blocks

    latent: dict[str, tuple[int, int]] = {}
    handles = [unet.register_forward_pre_hook(lambda m, args: latent.__setitem__("hw", tuple(args[0].shape[-2:])))]

    def pre(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        x = args[0] if args else kwargs["hidden_states"]
        if kwargs.get("encoder_hidden_states") is not None:
            return args, kwargs
        b, n, c = x.shape
        h, w = _grid(n, latent["hw"])
        grid = x.transpose(1, 2).reshape(b, c, h, w)
        small = F.interpolate(grid, size=(max(1, h // factor), max(1, w // factor)), mode=mode)
        return args, {**kwargs, "encoder_hidden_states": small.flatten(2).transpose(1, 2)}

    for block, level in transformer_blocks(unet):
        if level in levels:
            handles.append(block.attn1.register_forward_pre_hook(pre, with_kwargs=True))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def tomesd_patch(unet: nn.Module, **kwargs: Any) -> Iterator[None]:
    """tomesd 0.1.3 itself (the reference implementation) on `unet`."""
    import tomesd

    tomesd.apply_patch(unet, **kwargs)
    try:
        yield
    finally:
        tomesd.remove_patch(unet)


@contextlib.contextmanager
def ours(unet: nn.Module, **fields: Any) -> Iterator[None]:
    from tome_core import apply_patch, remove_patch

    apply_patch(unet, **fields)
    try:
        yield
    finally:
        remove_patch(unet)


# ---------------------------------------------------------------------------------------------- measures


def rel_change(out: torch.Tensor, base: torch.Tensor) -> float:
    """||out - base|| / ||base||."""
    return float((out.double() - base.double()).norm() / base.double().norm())


@torch.no_grad()
def call(unet: nn.Module, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> torch.Tensor:
    return unet(*args, **kwargs).sample


@dataclass(frozen=True)
class AttentionStats:
    """Self-attention's entropy as a share of log N and cross-attention's mass on the first text token, per level."""

    entropy: Mapping[int, float]
    bos_mass: Mapping[int, float]


class AttentionWatch:
    """While entered, records `AttentionStats` of every UNet call on `queries` evenly spaced queries of every block
    (the whole matrix is N^2), without changing the call's output: a measurement can watch a call it makes anyway."""

    def __init__(self, unet: nn.Module, queries: int = 256) -> None:
        self.unet, self.queries = unet, queries
        self.entropy: dict[int, list[float]] = {}
        self.bos: dict[int, list[float]] = {}
        self.handles: list[Any] = []

    def _probe(self, level: int, module: nn.Module, cross: bool) -> Callable[..., None]:
        @torch.no_grad()
        def hook(m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            x = args[0] if args else kwargs["hidden_states"]
            ctx = kwargs.get("encoder_hidden_states")
            ctx = x if ctx is None else ctx
            n = x.shape[1]
            pick = torch.linspace(0, n - 1, min(self.queries, n)).long()
            q = m.to_q(x[:, pick])
            k = m.to_k(ctx)
            b, heads = q.shape[0], m.heads
            q = q.view(b, -1, heads, q.shape[-1] // heads).transpose(1, 2)
            k = k.view(b, -1, heads, k.shape[-1] // heads).transpose(1, 2)
            p = torch.softmax((q @ k.transpose(-1, -2)).float() * m.scale, dim=-1)  # [B, heads, queries, keys]
            if cross:
                self.bos.setdefault(level, []).append(float(p[..., 0].mean()))
            else:
                h = -(p * p.clamp_min(1e-30).log()).sum(-1)
                self.entropy.setdefault(level, []).append(float(h.mean() / math.log(k.shape[2])))

        return hook

    def __enter__(self) -> AttentionWatch:
        from tome_core import transformer_blocks

        for block, level in transformer_blocks(self.unet):
            for attn, cross in ((block.attn1, False), (getattr(block, "attn2", None), True)):
                if attn is not None:
                    hook = self._probe(level, attn, cross)
                    self.handles.append(attn.register_forward_pre_hook(hook, with_kwargs=True))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()

    def stats(self) -> AttentionStats:
        mean = lambda values: sum(values) / len(values)
        return AttentionStats(
            {k: mean(v) for k, v in sorted(self.entropy.items())}, {k: mean(v) for k, v in sorted(self.bos.items())}
        )


# ---------------------------------------------------------------------------------------------- variants and panels

#: What a variant does to a UNet while it is measured: a context manager factory.
Patch = Callable[[nn.Module], contextlib.AbstractContextManager[Any]]


def reference_patches(family: str) -> dict[str, Patch]:
    """The references themselves at `family`'s first level with attention: tomesd 0.1.3 at its defaults (ratio 0.5,
    2x2, self-attention) and ToDo as its code does it (keys/values from the tokens subsampled 2x2, nearest)."""
    top = TOP_LEVEL[family]
    return {
        "tomesd's default": lambda unet: tomesd_patch(unet, ratio=0.5, max_downsample=top),
        "ToDo's default": lambda unet: todo(unet, 2, levels=(top,)),
    }


def config_patch(**fields: Any) -> Patch:
    """Our patch with `fields` (a preset as preset=name)."""
    return lambda unet: ours(unet, **fields)


@torch.no_grad()
def generate(
    unet: nn.Module, args: tuple[Any, ...], kwargs: Mapping[str, Any], steps: int, scheduler: str = "dpm++2m"
) -> torch.Tensor:
    """The final latent of a whole generation from `args[0]` as the start (no guidance: one text state)."""
    from tome_bench.generate import make_scheduler

    sched = make_scheduler(scheduler)
    sched.set_timesteps(steps)
    x = args[0] * sched.init_noise_sigma
    for t in sched.timesteps:
        eps = unet(sched.scale_model_input(x, t), t.expand(x.shape[0]), **kwargs).sample
        x = sched.step(eps, t, x).prev_sample
    return x


def changes(
    unet: nn.Module,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    patches: Mapping[str, Patch],
    steps: int | None = None,
    on_result: Callable[[str, float], None] | None = None,
    watch_base: contextlib.AbstractContextManager[Any] | None = None,
) -> dict[str, float]:
    """The relative change of each patched variant's output from the unpatched one's: one UNet call (`steps` None)
    or the final latent of a `steps`-step generation. `watch_base` (an `AttentionWatch`) is entered around the
    unpatched run only."""
    run = (lambda: call(unet, args, kwargs)) if steps is None else (lambda: generate(unet, args, kwargs, steps))
    with watch_base or contextlib.nullcontext():
        base = run()
    out: dict[str, float] = {}
    for name, patch in patches.items():
        with patch(unet):
            out[name] = rel_change(run(), base)
        if on_result is not None:
            on_result(name, out[name])
    again = run()
    if not torch.equal(again, base):
        raise RuntimeError("the unpatched output changed after the variants ran: a patch was not removed")
    return out


# ---------------------------------------------------------------------------------------------- relations and panel


def relation_patches(family: str) -> dict[str, Patch]:
    """The variants of the published relations (`standin.TARGETS` and tomesd's ablation), at `family`'s first level
    with attention and below it; tomesd's and ToDo's defaults (`reference_patches`) are two of them."""
    top = TOP_LEVEL[family]
    return {
        "ToMe 0.75, top level": lambda unet: tomesd_patch(unet, ratio=0.75, max_downsample=top),
        "ToDo 3x3, top level": lambda unet: todo(unet, 3, levels=(top,)),
        **reference_patches(family),
        "ToMe 0.5, two levels": lambda unet: tomesd_patch(unet, ratio=0.5, max_downsample=2 * top),
        "ToMe 0.5, every level": lambda unet: tomesd_patch(unet, ratio=0.5, max_downsample=8),
        "ToMe 0.5, every level, +cross-attention +MLP": lambda unet: tomesd_patch(unet, **_EVERY, merge_mlp=True),
    }


_EVERY = {"ratio": 0.5, "max_downsample": 8, "merge_crossattn": True}


def relations(changed: Mapping[str, float]) -> dict[str, float]:
    """The fitted relations (`standin.TARGETS`: ratios of mean squared change) from `relation_patches`' changes."""
    todo2 = changed["ToDo's default"]
    return {
        "tome.75/todo2": (changed["ToMe 0.75, top level"] / todo2) ** 2,
        "todo3/todo2": (changed["ToDo 3x3, top level"] / todo2) ** 2,
    }


def model(
    arch: str, size: int, kind: str, latent: str, timestep: int = 500
) -> tuple[nn.Module, tuple[Any, ...], dict[str, Any]]:
    """A UNet of `arch` and one call's inputs: the plain random-weight UNet ("random": uniform attention) or the
    stand-in fitted at `size` ("stand-in") and its "sharper"/"softer" variants (`standin.VARIANTS`)."""
    from tome_bench import standin

    if kind == "random":
        unet = archs.build_unet(arch, torch.float32, "cpu")
        args, kwargs = archs.make_inputs(arch, size, batch=1, latent_kind=latent, timestep=timestep)
    else:
        params = standin.fitted(arch, size, kind)
        unet = standin.build(arch, params)
        args, kwargs = standin.standin_inputs(unet, arch, size, params, latent_kind=latent, timestep=timestep)
    # Channels-last: a CPU call is a tenth faster (oneDNN's convolutions take it without reordering) and the same
    # to about 1e-6; nn.Module.to, as diffusers' own `to` warns about dtypes on any call.
    nn.Module.to(unet, memory_format=torch.channels_last)
    return unet, (args[0].contiguous(memory_format=torch.channels_last), *args[1:]), kwargs


def preset_patches(names: Sequence[str] | None = None) -> dict[str, Patch]:
    from tome_core import presets

    return {p.label: config_patch(preset=p.name) for p in presets() if names is None or p.name in names}


@dataclass(frozen=True)
class PanelRow:
    arch: str
    size: int
    model: str  # "random", "stand-in", "sharper", "softer"
    latent: str  # "natural", "noise"
    steps: int | None  # None: one UNet call at t=500; else a whole generation of this many steps
    variant: str
    change: float  # relative L2 change of the output (the final latent of a generation) from the unpatched one
    vs_tomesd: float  # change over tomesd's default's, same model and measure
    vs_todo: float  # change over ToDo's default's


def panel(
    arch: str,
    size: int,
    patches: Mapping[str, Patch],
    *,
    models: Sequence[str] = ("random", "stand-in", "sharper", "softer"),
    latents: Sequence[str] = ("natural", "noise"),
    steps: Sequence[int | None] = (None,),
    say: Callable[[str], None] = lambda text: None,
) -> list[PanelRow]:
    """Every variant of `patches` (beside the references, added first) on every model, start and measure."""
    family = archs.get_arch(arch).family
    every = {**reference_patches(family), **patches}
    rows: list[PanelRow] = []
    for kind in models:
        for latent in latents:
            unet, args, kwargs = model(arch, size, kind, latent)
            for count in steps:
                what = f"{arch} {size} px, {kind}, {latent} start, {'one call' if count is None else f'{count} steps'}"
                got = changes(
                    unet, args, kwargs, every, count, lambda name, v, what=what: say(f"{what}: {name} {v:.4f}")
                )
                tomesd, todo_ = got["tomesd's default"], got["ToDo's default"]
                rows += [
                    PanelRow(arch, size, kind, latent, count, name, value, value / tomesd, value / todo_)
                    for name, value in got.items()
                ]
            del unet
    return rows


def panel_table(rows: Sequence[PanelRow]) -> str:
    """Markdown: per architecture and size, a row per variant and a column per model, start and measure, each cell
    the change and, in brackets, its ratio to tomesd's default's."""
    out: list[str] = []
    for arch, size in dict.fromkeys((r.arch, r.size) for r in rows):
        group = [r for r in rows if (r.arch, r.size) == (arch, size)]
        columns = list(dict.fromkeys((r.model, r.latent, r.steps) for r in group))
        names = list(dict.fromkeys(r.variant for r in group))
        cell = {(r.variant, r.model, r.latent, r.steps): r for r in group}
        head = [f"{m}, {lat}, {'1 call' if s is None else f'{s} steps'}" for m, lat, s in columns]
        out += [f"### {arch} {size} px: change of the output (× tomesd's default's)", ""]
        out += ["| variant | " + " | ".join(head) + " |", "|---|" + "---:|" * len(head)]
        for name in names:
            values = []
            for m, lat, s in columns:
                r = cell.get((name, m, lat, s))
                values.append("-" if r is None else f"{r.change:.4f} ({r.vs_tomesd:.2f}×)")
            out.append(f"| {name} | " + " | ".join(values) + " |")
        out.append("")
    out.append(
        "random: the plain random-weight UNet, which attends uniformly (not a fidelity measure: pooling and deep merging"
        " look free there); stand-in, sharper, softer: tome_bench.standin, fitted to published real-weight relations."
    )
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------- the command

#: The panel's default sizes per architecture: where the stand-ins are fitted.
PANEL_SIZES = {"sd15": (512,), "sdxl": (1024,)}


def main(argv: Sequence[str]) -> int:
    """`python -m tome_bench fidelity`: the panel (every preset beside tomesd's and ToDo's defaults, on the
    random UNet, the stand-in and its variants), into OUT/fidelity.md and fidelity.json."""
    import argparse
    import json
    from dataclasses import asdict
    from pathlib import Path

    ap = argparse.ArgumentParser(prog="python -m tome_bench fidelity", description=main.__doc__)
    ap.add_argument("--arch", default="sd15,sdxl", help="comma-separated: sd15, sdxl (default both)")
    ap.add_argument("--sizes", help="comma-separated px (default: where the stand-ins are fitted, sd15 512, sdxl 1024)")
    ap.add_argument("--models", default="random,stand-in,sharper,softer")
    ap.add_argument("--latents", default="natural,noise")
    ap.add_argument(
        "--steps", default="call", help="comma-separated: call (one UNet call at t=500) and/or a step count"
    )
    ap.add_argument("--candidates", type=Path, help="JSON: name -> {family -> TomeConfig fields}, beside the presets")
    ap.add_argument("--relations", action="store_true", help="the fitted relations instead of the presets")
    ap.add_argument("--out", type=Path, default=Path("bench-out/fidelity"))
    a = ap.parse_args(argv)
    steps = [None if s == "call" else int(s) for s in a.steps.split(",")]
    rows: list[PanelRow] = []
    for arch in a.arch.split(","):
        family = archs.get_arch(arch).family
        patches = relation_patches(family) if a.relations else preset_patches()
        if a.candidates and not a.relations:
            per = json.loads(a.candidates.read_text())
            patches.update({name: config_patch(**f[family]) for name, f in per.items() if family in f})
        sizes = [int(s) for s in a.sizes.split(",")] if a.sizes else PANEL_SIZES[arch]
        for size in sizes:
            say = lambda text: print(text, flush=True)
            rows += panel(
                arch, size, patches, models=a.models.split(","), latents=a.latents.split(","), steps=steps, say=say
            )
    text = panel_table(rows)
    if a.relations:
        text += "\n\n" + relations_table(rows)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "fidelity.md").write_text(text + "\n")
    (a.out / "fidelity.json").write_text(json.dumps([asdict(r) for r in rows], indent=1))
    print(text)
    return 0


def relations_table(rows: Sequence[PanelRow]) -> str:
    """The fitted relations per model beside their targets."""
    from tome_bench.standin import TARGETS

    out = ["| model | " + " | ".join(f"{k} (target {v:g})" for k, v in TARGETS.items()) + " |", "|---|---:|---:|"]
    for key in dict.fromkeys((r.arch, r.size, r.model, r.latent, r.steps) for r in rows):
        got = relations({r.variant: r.change for r in rows if (r.arch, r.size, r.model, r.latent, r.steps) == key})
        arch, size, kind, latent, count = key
        label = f"{arch} {size} px, {kind}, {latent}, {'1 call' if count is None else f'{count} steps'}"
        out.append(f"| {label} | " + " | ".join(f"{got[k]:.2f}" for k in TARGETS) + " |")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------- the main job's section

#: The main job's stand-in sizes on a CPU: SD1.5 where it is fitted; SDXL at the main job's 640 px, with the
#: stand-in fitted at 1024 px (the nearest fit: SDXL calls at 1024 px take minutes on 2 cores).
MAIN_JOB_SIZES = {"sd15": 512, "sdxl": 640}


def main_job_rows(arches: Sequence[str], opts: Any) -> list[PanelRow]:
    """The presets beside the references on each architecture's stand-in: one call, natural-spectrum start, at
    `MAIN_JOB_SIZES` (another architecture, a test UNet: at the run's first size)."""
    rows: list[PanelRow] = []
    for arch in arches:
        size = MAIN_JOB_SIZES.get(arch) or opts.sizes_of(arch)[0][0]
        rows += panel(arch, size, preset_patches(), models=("stand-in",), latents=("natural",))
    return rows


def main_job_section(rows: Sequence[PanelRow]) -> list[str]:
    if not rows:
        return []
    return [
        "## How much each preset changes the image (stand-in model)", "", "Relative change of the output of one UNet call (t=500, natural-spectrum start, batch 1, float32) from the"
        " unpatched one, and over that under tomesd's default, on `tome_bench.standin`: the architecture with random"
        " weights whose attention behaves like a trained model's, fitted to published real-weight relations"
        " (docs/fidelity.md). `python -m tome_bench fidelity` runs the whole panel.", "", panel_table(rows),
    ]  # fmt: skip
