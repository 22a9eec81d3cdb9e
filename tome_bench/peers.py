"""`python -m tome_bench peers --steps N`: whole generations of a diffusers pipeline per variant (the final latent,
no VAE), ours beside the alternatives a user could pick instead (`--peers`), side by side in one process; the
pipeline, the inputs and the rounds are `generate`'s. Writes OUT/gen.md, gen.json and gen.png.

Each peer comes from its own PyPI package (`make peers`: requirements-peers.txt, `--no-deps`), imported here at run
time only; the extension never imports them. Every peer runs at its documented default and one faster setting
(docs/benchmarks.md has the table): tomesd 0.1.3 (`tomesd:fast`: max_downsample doubled), CA-ToMe 0.1.3 (its
README's CacheConf.CONFIG_3 at r=0.8, `ca-tome:fast` r=0.5; generations through its own `pipe.call`), DeepCache
0.1.1 (interval 3, `deepcache:fast` 5), HiDiffusion 0.1.10 (RAU-Net and MSW-MSA, `hidiffusion:msw-msa` the windowed
attention alone), and `deepcache+ours`: DeepCache at its default on ours at each --ratios ratio. What a peer's own
removal leaves behind is put back before the next variant runs, and reported (`generate.Snapshot`).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import importlib.metadata
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

import tome_core
from tome_bench import archs, generate, options, report, run
from tome_bench.archs import Arch
from tome_bench.generate import GenVariant
from tome_bench.options import Defaults, Options, Row
from tome_core import TomeConfig

#: Peer names on the command line, in the order they run; `all` selects every one.
PEER_NAMES = ("tomesd", "ca-tome", "deepcache", "hidiffusion", "deepcache+ours")


@dataclass(frozen=True)
class Package:
    """A peer's PyPI distribution, its import name and the version requirements-peers.txt pins."""

    dist: str
    module: str
    pin: str


PACKAGES = {
    "tomesd": Package("tomesd", "tomesd", "0.1.3"),
    "ca-tome": Package("ca-tome", "ca_tome", "0.1.3"),
    "deepcache": Package("DeepCache", "DeepCache", "0.1.1"),
    "hidiffusion": Package("hidiffusion", "hidiffusion", "0.1.10"),
}
#: The package each peer name needs.
NEEDS = {name: name for name in PACKAGES} | {"deepcache+ours": "deepcache"}


def load(package: str) -> tuple[Any | None, str]:
    """(module, installed version) of one of `PACKAGES`, or (None, why it cannot be used)."""
    pkg = PACKAGES[package]
    try:
        module = importlib.import_module(pkg.module)
    except ImportError as exc:
        why = f"{pkg.dist} is not installed ({type(exc).__name__}: {exc})"
        return None, f"{why}; make peers (pip install --no-deps {pkg.dist}=={pkg.pin})"
    return module, importlib.metadata.version(pkg.dist)


def versions(names: Sequence[str]) -> dict[str, str]:
    """Installed version (or 'not installed') of every package the named peers need."""
    found = {NEEDS[name]: load(NEEDS[name]) for name in names}
    return {PACKAGES[p].dist: text if module is not None else "not installed" for p, (module, text) in found.items()}


def settings(
    peer: str, *, spec: Arch, ratios: Sequence[float], ours: Callable[[float], Any], tomesd_md: int
) -> list[GenVariant]:
    """The settings a peer runs at (default first, then the faster one), or one row saying why it cannot run;
    `ours(r)` gives (apply, remove) of ours at ratio r, for the stacked variant."""
    module, why = load(NEEDS[peer])
    if module is None or (peer == "ca-tome" and spec.text_time):
        why = why if module is None else CA_TOME_SDXL
        return [GenVariant(peer, None, run.noop, run.noop, error=why, setting="-", strict=False, peer=peer)]
    out: list[GenVariant] = []

    def add(
        variant: str,
        setting: str,
        apply: Callable[[Any], None],
        remove: Callable[[Any], None],
        ratio: float | None = None,
        call: Any = None,
    ) -> None:
        out.append(GenVariant(variant, ratio, apply, remove, setting=setting, call=call, strict=False, peer=peer))

    if peer == "tomesd":
        for variant, md in (("tomesd", tomesd_md), ("tomesd:fast", min(8, 2 * tomesd_md))):
            for r in ratios:
                apply = lambda pipe, r=r, md=md: module.apply_patch(pipe.unet, ratio=r, max_downsample=md)
                add(variant, f"ratio={r:g}, max_downsample={md}", apply, lambda pipe: module.remove_patch(pipe.unet), r)
    elif peer == "ca-tome":
        remove = importlib.import_module("ca_tome.patch").remove_patch  # its forward and `call` stay: the snapshot's
        for variant, r, note in (("ca-tome", 0.8, " (its README)"), ("ca-tome:fast", 0.5, "")):
            apply = lambda pipe, r=r: module.apply_CA_ToMe(pipe, module.CacheConf.CONFIG_3, r)
            add(variant, f"CacheConf.CONFIG_3, r={r:g}{note}", apply, remove, call=lambda pipe: pipe.call)
    elif peer == "deepcache":
        for variant, interval, note in (("deepcache", 3, " (its README)"), ("deepcache:fast", 5, "")):
            add(variant, f"cache_interval={interval}, cache_branch_id=0{note}", *_deepcache(module, interval))
    elif peer == "hidiffusion":
        for variant, raunet, note in (("hidiffusion", True, " (its defaults)"), ("hidiffusion:msw-msa", False, "")):
            apply = lambda pipe, raunet=raunet: module.apply_hidiffusion(
                pipe, apply_raunet=raunet, apply_window_attn=True
            )
            add(variant, f"apply_raunet={raunet}, apply_window_attn=True{note}", apply, module.remove_hidiffusion)
    else:  # deepcache+ours: ours applied first and removed last
        for r in ratios:
            add(
                peer,
                f"DeepCache cache_interval=3, cache_branch_id=0 on ours at ratio {r:g}",
                *_stacked(module, ours(r)),
                r,
            )
    return out


def _stacked(deepcache: Any, ours: tuple[Callable[[Any], None], Callable[[Any], None]]) -> tuple[Any, Any]:
    (apply_ours, remove_ours), (apply_cache, remove_cache) = ours, _deepcache(deepcache, 3)

    def remove(pipe: Any) -> None:
        try:
            remove_cache(pipe)
        finally:
            remove_ours(pipe)

    return lambda pipe: (apply_ours(pipe), apply_cache(pipe)), remove


CA_TOME_SDXL = (
    "ca-tome 0.1.3 patches StableDiffusionPipeline only: apply_CA_ToMe replaces the pipeline's call with its copy of"
    " SD1.5's __call__ (no pooled text embeddings or time ids) and the UNet's forward with one that takes the step as"
    " a third argument; SDXL pipelines are not supported"
)


def _deepcache(deepcache: Any, interval: int) -> tuple[Callable[[Any], None], Callable[[Any], None]]:
    helpers: list[Any] = []

    def apply(pipe: Any) -> None:
        helpers.append(deepcache.DeepCacheSDHelper(pipe=pipe))
        helpers[-1].set_params(cache_interval=interval, cache_branch_id=0)
        helpers[-1].enable()

    return apply, lambda pipe: helpers.pop().disable() if helpers else None


# ---------------------------------------------------------------------------------------------- the job

#: `make bench-gen` (docs/benchmarks.md): SD1.5 at 512 and 768 px with 10 Euler steps and SDXL at 768 px with 4,
#: every peer at its default and a faster setting, ours at ratio 0.5 and at each preset.
GEN_COMMANDS = (
    "python -m tome_bench peers --steps 10 --arch sd15 --sizes 512,768 --peers all --presets all --out bench-out/gen-sd15",
    "python -m tome_bench peers --steps 4 --arch sdxl --sizes 768 --peers all --presets all --out bench-out/gen-sdxl",
)
GEN = Defaults("512", 3, latents="noise,natural", out="bench-out/gen")
QUICK = Defaults("256", 1, latents="noise,natural", out="bench-out/gen")


def make_gen_variants(opts: Options, pipe: Any, spec: Arch) -> list[GenVariant]:
    """baseline; ours at every ratio, each --ours configuration, each preset; tomesd (--variants) and --peers."""
    variants = [GenVariant("baseline", None, run.noop, run.noop, setting="unpatched")]
    ours = [("ours", opts.ours_fields)] if "ours" in opts.variants else []
    pair = lambda cfg=None, **kw: ((lambda p: tome_core.apply_patch(p, cfg, **kw)), tome_core.remove_patch)
    for r in opts.ratios:
        for kind, fields in [*ours, *opts.extra_ours]:
            setting = ", ".join(f"{k}={v!r}" for k, v in fields.items() if k != "ratio") or "defaults"
            variants.append(GenVariant(kind, r, *pair(TomeConfig.from_dict(fields).replace(ratio=r)), setting=setting))
    for name in opts.presets:
        variants.append(GenVariant(run.preset_variant_name(name), None, *pair(preset=name), setting=f"preset={name}"))
    names = (["tomesd"] if "tomesd" in opts.variants and "tomesd" not in opts.peers else []) + opts.peers
    base = TomeConfig.from_dict(opts.ours_fields)
    md = run.tomesd_max_downsample(opts.tomesd_max_downsample, pipe.unet)
    for name in names:
        found = settings(name, spec=spec, ratios=opts.ratios, ours=lambda r: pair(base.replace(ratio=r)), tomesd_md=md)
        # --variants tomesd: its default only
        variants += [v for v in found if name in opts.peers or v.kind != "tomesd:fast"]
    return variants


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tome_bench peers",
        description=__doc__.split("\n\n")[0],
        epilog=f"make bench-gen: {'; '.join(GEN_COMMANDS)}",
    )
    p.add_argument("--steps", type=int, default=10, help="sampler steps per generation (default 10)")
    p.add_argument(
        "--strength",
        type=float,
        default=1.0,
        help="below 1 an img2img pass like a hires fix: the start latent noised to where S of the schedule remains, the last int(N * S) steps run (default 1)",
    )
    p.add_argument("--scheduler", choices=options.SCHEDULERS, default="euler", help="sampler (default euler)")
    p.add_argument("--guidance", type=float, default=7.0, help="classifier-free guidance (default 7)")
    p.add_argument(
        "--peers",
        metavar="NAME[,NAME...]|all",
        help=f"alternatives from their PyPI packages (make peers): {', '.join(PEER_NAMES)}",
    )
    keys = (
        "arch",
        "sizes",
        "ratios",
        "variants",
        "set",
        "ours",
        "presets",
        "tomesd-max-downsample",
        "repeats",
        "warmup",
    )
    defaults = {
        "arch": "sd15",
        "sizes": "512 (--quick 256)",
        "repeats": "3 (--quick 1)",
        "latents": GEN.latents,
        "out": GEN.out,
    }
    return options.add(
        p,
        *keys,
        "latents",
        "quick",
        "device",
        "dtype",
        "threads",
        "clock",
        "out",
        "plot",
        "seed",
        "checkpoint",
        defaults=defaults,
    )


def parse_options(argv: Sequence[str]) -> Options:
    def make(a: argparse.Namespace) -> Options:
        opts = options.build("peers", a, QUICK if a.quick else GEN)
        if a.steps < 1 or a.guidance < 1.0:
            raise ValueError(f"--steps must be at least 1 and --guidance at least 1, got {a.steps} and {a.guidance:g}")
        if not 0.0 < a.strength <= 1.0 or options.steps_at_strength(a.steps, a.strength) < 1:
            raise ValueError(f"--strength must be in (0, 1] and run a step: int({a.steps} * {a.strength:g}) = 0 steps")
        peers = options.names(a.peers, PEER_NAMES, "--peers") if a.peers else []
        opts.steps, opts.strength, opts.scheduler, opts.guidance, opts.peers = (
            a.steps,
            a.strength,
            a.scheduler,
            a.guidance,
            peers,
        )
        return opts

    return options.parse(build_parser(), argv, make)


def main(argv: Sequence[str]) -> int:
    """Whole generations of every variant; OUT/gen.md, gen.json and gen.png. 0 when every check passed."""
    from tqdm import tqdm

    opts, started = parse_options(argv), time.perf_counter()
    if opts.threads is not None:
        torch.set_num_threads(opts.threads)
    names = opts.peers + (["tomesd"] if "tomesd" in opts.variants and "tomesd" not in opts.peers else [])
    found = versions(names)
    info = report.machine_info(opts, found.pop("tomesd", None)) | {f"peer {d}": v for d, v in found.items()}
    info["transformers"] = report.version("transformers")
    rows: list[Row] = []
    checks: list[tuple[bool, str]] = []
    notes: list[str] = []
    with tqdm(total=0, unit="step") as progress:
        for spec in opts.arches:
            progress.set_postfix_str(f"building {spec.name}")
            unet = archs.build_unet(spec, opts.dtype, opts.device, opts.seed)
            if opts.checkpoint:
                archs.load_checkpoint(unet, opts.checkpoint, spec)
            pipe = generate.build_pipeline(spec, unet, opts.scheduler, name=opts.checkpoint)
            for size in opts.sizes_of(spec.name):
                variants = make_gen_variants(opts, pipe, spec)
                rows += generate.bench_generation_size(opts, pipe, spec, size, variants, checks, notes, progress)
            del pipe, unet
            gc.collect()
    return report.finish(opts, ["peers", *argv], rows, checks, notes, info, started, extra=_sampler(opts))


def _sampler(opts: Options) -> dict[str, Any]:
    return {
        "steps": opts.steps,
        "strength": opts.strength,
        "steps_run": opts.steps_run,
        "scheduler": opts.scheduler,
        "guidance": opts.guidance,
    }
