"""Measuring variants side by side: the variants (baseline, ours, tomesd, the presets), the round-robin rounds both
timing modes run (`run_rounds`: one UNet call here, a whole generation in `generate`), one size of the per-call mode
(`bench_size`), the merge overhead of one block on the product's path, and the progress bar of the calls."""

from __future__ import annotations

import importlib
import importlib.metadata
import math
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from torch import nn

import tome_core
from tome_bench import archs, timing
from tome_bench.options import PRESET_PREFIX, Options, Row, spread
from tome_core import TomeConfig
from tome_core import merge as merge_ops

Inputs = tuple[tuple[Any, ...], dict[str, Any]]
#: One run of a variant: (seconds, output as float32 on the CPU, peak memory growth in bytes or None).
Run = tuple[float, torch.Tensor, int | None]

# ---------------------------------------------------------------------------------------------- measures


def run_step(
    unet: nn.Module, inputs: Inputs, device: torch.device, *, sample_rss: bool, clock_name: str = "wall"
) -> Run:
    """One timed UNet call: (seconds, output as float32 on CPU, peak memory growth in bytes or None)."""
    args, kwargs = inputs
    call = lambda: unet(*args, **kwargs, return_dict=False)[0]
    seconds, out, mem = timing.timed_call(call, device, clock_name=clock_name, sample_rss=sample_rss)
    return seconds, out.detach().float().cpu(), mem


def deviation(out: torch.Tensor, base: torch.Tensor) -> float:
    """Relative L2 distance ||out - base|| / ||base||, in float64."""
    base64 = base.double()
    return float((out.double() - base64).norm() / base64.norm().clamp_min(1e-30))


def psnr_db(out: torch.Tensor, base: torch.Tensor) -> float | None:
    """PSNR of `out` against `base` in dB, the peak being the range of `base`; None when identical (JSON null)."""
    base64 = base.double()
    mse = float((out.double() - base64).pow(2).mean())
    return None if mse == 0.0 else 10.0 * math.log10(max(float(base64.max() - base64.min()), 1e-30) ** 2 / mse)


def hook_count(model: nn.Module) -> int:
    """Hooks on `model` and every submodule, and the forwards set on their instances: a removal must bring it back."""
    return sum(
        len(m._forward_hooks)
        + len(m._forward_pre_hooks)
        + len(m._backward_hooks)
        + len(m._forward_hooks_with_kwargs)
        + ("forward" in m.__dict__)
        for m in model.modules()
    )


def class_names(model: nn.Module) -> list[str]:
    return [type(m).__qualname__ + "@" + type(m).__module__ for m in model.modules()]


def size_label(size: tuple[int, int]) -> str:
    """(height, width) -> '512' or '768x512' (width x height)."""
    height, width = size
    return f"{width}" if width == height else f"{width}x{height}"


# ---------------------------------------------------------------------------------------------- variants


@dataclass
class Variant:
    kind: str  # baseline | ours | ours:NAME | ours:preset=NAME | tomesd | a peer's setting
    ratio: float | None
    apply: Callable[[Any], None]
    remove: Callable[[Any], None]
    times: list[float] = field(default_factory=list)
    mems: list[int] = field(default_factory=list)
    output: torch.Tensor | None = None
    #: Output per start latent kind (the first kind's is `output`).
    outputs: dict[str, torch.Tensor] = field(default_factory=dict)
    error: str | None = None

    @property
    def label(self) -> str:
        return self.kind if self.ratio is None else f"{self.kind} r={self.ratio:g}"


def noop(model: Any) -> None:
    """The baseline's apply and remove: nothing."""


def load_tomesd() -> tuple[Any | None, str]:
    """(module, version) or (None, why not)."""
    try:
        module = importlib.import_module("tomesd")
    except ImportError as exc:
        return None, f"tomesd is not installed ({exc}); the tomesd comparison is skipped (pip install tomesd==0.1.3)"
    return module, importlib.metadata.version("tomesd")


def preset_variant_name(name: str) -> str:
    return f"{PRESET_PREFIX}{name}"


def tomesd_max_downsample(setting: str, unet: nn.Module) -> int:
    """tomesd's max_downsample from --tomesd-max-downsample ('auto': the UNet's first attention level)."""
    return min(tome_core.blocks_per_level(unet)) if setting == "auto" else int(setting)


def tomesd_merges_nothing(setting: str, unet: nn.Module) -> bool:
    """Whether tomesd at `setting` reaches no transformer block of `unet` (its default 1 on SDXL): patched, it
    computes exactly what the unpatched UNet does."""
    return tomesd_max_downsample(setting, unet) < min(tome_core.blocks_per_level(unet))


def tomesd_patch(tomesd: Any, ratio: float, max_downsample: int, seed: int, device: torch.device) -> tuple[Any, Any]:
    """(apply, remove) of tomesd at its defaults but `ratio` and `max_downsample`, its partitions seeded."""
    rng = SeededGlobalRng(seed, device)

    def apply(unet: nn.Module) -> None:
        rng.enter()
        tomesd.apply_patch(unet, ratio=ratio, max_downsample=max_downsample)

    def remove(unet: nn.Module) -> None:
        tomesd.remove_patch(unet)
        rng.exit()

    return apply, remove


def make_variants(opts: Options, unet: nn.Module, tomesd: Any | None) -> list[Variant]:
    """baseline; at every ratio ours, each --ours configuration and tomesd; then each preset once. The main job
    leaves out a tomesd that merges nothing (SDXL: its calls would time the unpatched UNet again)."""
    variants = [Variant("baseline", None, noop, noop)]
    if opts.main_job and tomesd is not None and tomesd_merges_nothing(opts.tomesd_max_downsample, unet):
        tomesd = None
    ours = [("ours", opts.ours_fields)] if "ours" in opts.variants else []
    for r in opts.ratios:
        for kind, fields in [*ours, *opts.extra_ours]:
            cfg = TomeConfig.from_dict(fields).replace(ratio=r)
            variants.append(Variant(kind, r, lambda u, cfg=cfg: tome_core.apply_patch(u, cfg), tome_core.remove_patch))
        if "tomesd" in opts.variants and tomesd is not None:
            md = tomesd_max_downsample(opts.tomesd_max_downsample, unet)
            variants.append(Variant("tomesd", r, *tomesd_patch(tomesd, r, md, opts.seed, opts.device)))
    for name in opts.presets:  # a preset fixes its own ratio: once, whatever --ratios says
        apply = lambda u, name=name: tome_core.apply_patch(u, preset=name)
        variants.append(Variant(preset_variant_name(name), None, apply, tome_core.remove_patch))
    return variants


class SeededGlobalRng:
    """tomesd forks the global RNG on its first call: seed it for reproducible partitions, then put back the
    caller's state (CPU and CUDA), so that an in-process run leaves torch's global RNG as it found it."""

    def __init__(self, seed: int, device: torch.device) -> None:
        self.seed, self.cuda = seed, device.type == "cuda"
        self.saved: tuple[torch.Tensor, list[torch.Tensor] | None] | None = None

    def enter(self) -> None:
        self.saved = (torch.get_rng_state(), torch.cuda.get_rng_state_all() if self.cuda else None)
        torch.manual_seed(self.seed)

    def exit(self) -> None:
        if self.saved is not None:
            torch.set_rng_state(self.saved[0])
            if self.saved[1] is not None:
                torch.cuda.set_rng_state_all(self.saved[1])
            self.saved = None


# ---------------------------------------------------------------------------------------------- rounds


def rounds(opts: Options) -> list[tuple[int, str]]:
    """(round, start latent): the warm-up and timed rounds on the first latent kind, and one untimed round (-1) per
    further kind, after them or, in the main job, first: there they give every variant its untimed first run."""
    timed = [(rep, opts.latents[0]) for rep in range(opts.warmup + opts.repeats)]
    extra = [(-1, kind) for kind in opts.latents[1:]]
    return extra + timed if extra_latents_first(opts) else timed + extra


def extra_latents_first(opts: Options) -> bool:
    return opts.main_job and opts.warmup == 0 and len(opts.latents) > 1


def primes(opts: Options) -> bool:
    """Whether one untimed unpatched run precedes the rounds: the first run at a shape pays one-time costs (kernel
    selection, allocator growth) that would otherwise land on the first timed variant, the baseline."""
    return opts.warmup == 0 and not extra_latents_first(opts)


def run_rounds(
    opts: Options,
    variants: Sequence[Variant],
    measure: Callable[[Variant, str, int], Run],
    skip: Callable[[Variant], None],
    subject: str,
    checks: list[tuple[bool, str]],
) -> None:
    """Every round of `rounds(opts)`, every variant in turn: `measure(v, kind, rep)` applies, runs and removes it.
    A variant that fails is left out of the later rounds (its row says why; `skip` hears of each run it misses);
    the baseline's later timed outputs must stay bitwise its first (a check, unless it ran once)."""
    base, compared, max_diff = variants[0], 0, 0.0
    for rep, kind in rounds(opts):
        warm = 0 <= rep < opts.warmup
        for v in variants:
            if v.error is not None:
                skip(v)
                continue
            try:
                seconds, out, mem = measure(v, kind, rep)
            except Exception as exc:  # a failing variant must not stop the others
                if v is base:
                    raise
                v.error = f"{type(exc).__name__}: {exc}"
                print(f"\n{v.label} failed at {subject}: {v.error}", file=sys.stderr)
                continue
            if rep < 0:
                v.outputs[kind] = out
                continue
            if rep == 0:
                v.output = v.outputs[kind] = out
                v.mems += [] if mem is None else [mem]
            if warm:
                continue
            v.times.append(seconds)
            v.mems += [mem] if mem is not None and opts.device.type == "cuda" else []
            if v is base and rep > 0 and base.output is not None:
                compared += 1
                max_diff = max(max_diff, float((out - base.output).abs().max()))
    if base.output is not None and not torch.isfinite(base.output).all():
        checks.append((False, f"{subject}: the baseline's output is not finite ({opts.dtype_name})"))
    if compared:
        cycles = sum(v.error is None for v in variants[1:]) * (opts.warmup + opts.repeats - 1)
        cycles += len(opts.latents) - 1 if extra_latents_first(opts) else 0
        ok = max_diff == 0.0
        text = f"{subject}: the baseline's output bitwise identical in {compared} later timed run(s) after {cycles}"
        text += " apply/remove cycles of the other variants" + ("" if ok else f": NO, max |diff| = {max_diff:.3g}")
        checks.append((ok, text))


def make_row(arch: str, label: str, v: Variant, base: Variant, kinds: Sequence[str], setting: str | None = None) -> Row:
    """The row of one variant: median, speed-up over `base`, spread, deviation and PSNR per start latent."""
    if v.error is not None or not v.times:
        return Row(arch, label, v.kind, v.ratio, None, None, None, None, [], v.error or "no timed run", setting=setting)
    med = statistics.median(v.times)
    deviations: dict[str, float] = {}
    psnrs: dict[str, float | None] = {}
    for kind in kinds:
        if kind in v.outputs and kind in base.outputs:
            deviations[kind] = 0.0 if v is base else deviation(v.outputs[kind], base.outputs[kind])
            psnrs[kind] = None if v is base else psnr_db(v.outputs[kind], base.outputs[kind])
    row = Row(
        arch, label, v.kind, v.ratio, med, statistics.median(base.times) / med, None, deviations.get(kinds[0]), v.times
    )
    row.peak_mem_mib = max(v.mems) / 2**20 if v.mems else None
    row.spread, row.deviations, row.psnr_db, row.setting = spread(v.times), deviations, psnrs, setting
    return row


def bench_size(
    opts: Options,
    unet: nn.Module,
    spec: archs.Arch,
    size: tuple[int, int],
    tomesd: Any | None,
    checks: list[tuple[bool, str]],
    progress: Any,
) -> list[Row]:
    """Time every variant on one UNet call at one size, round-robin; rows in the order of `make_variants`.
    `progress` hears of every call: `set_postfix_str` names it before, `update(1)` follows it."""
    label, kinds = size_label(size), opts.latents
    inputs = {
        kind: archs.make_inputs(spec, *size, dtype=opts.dtype, device=opts.device, seed=opts.seed, latent_kind=kind)
        for kind in kinds
    }
    variants = make_variants(opts, unet, tomesd)
    subject = f"{spec.name} {label}px"
    hooks, classes = hook_count(unet), class_names(unet)
    if primes(opts):
        progress.set_postfix_str(f"{subject} priming call")
        run_step(unet, inputs[kinds[0]], opts.device, sample_rss=False)
        progress.update(1)
    left: list[str] = []

    def measure(v: Variant, kind: str, rep: int) -> Run:
        what = " warm-up" if 0 <= rep < opts.warmup else f" {kind} latent" if rep < 0 else ""
        progress.set_postfix_str(f"{subject} {v.label}{what}")
        try:
            v.apply(unet)
            sample = opts.device.type == "cpu" and rep == 0
            return run_step(unet, inputs[kind], opts.device, sample_rss=sample, clock_name=opts.clock)
        finally:
            v.remove(unet)
            progress.update(1)
            if hook_count(unet) != hooks or class_names(unet) != classes:
                left.append(v.label)

    run_rounds(opts, variants, measure, lambda v: progress.update(1), subject, checks)
    for name in dict.fromkeys(left):
        checks.append((False, f"{subject}: {name} left hooks or classes behind after removal"))
    if not left:
        checks.append((True, f"{subject}: no hook or class left behind by any removal"))
    return [make_row(spec.name, label, v, variants[0], kinds) for v in variants]


def calls_per_size(opts: Options, variants: int) -> int:
    """UNet calls `bench_size` makes at one size with `variants` variants (the priming call included)."""
    return (opts.warmup + opts.repeats + len(opts.latents) - 1) * variants + primes(opts)


# ---------------------------------------------------------------------------------------------- merge overhead


@dataclass
class OverheadRow:
    """What one preset adds per block at one level (`bench_overhead`): merging or pooling keys/values."""

    arch: str
    size: str
    preset: str
    what: str  # "merge" or "pool"
    level: int
    tokens: int
    channels: int
    ratio: float | None  # the share merged away (merge rows)
    sx: int
    sy: int
    ms: dict[str, float]  # median ms: "plan", "merge" (and unmerge), "tomesd" (the same merge); or "pool"


def bench_overhead(
    opts: Options, unet: nn.Module, spec: archs.Arch, size: tuple[int, int], tomesd: Any | None
) -> list[OverheadRow]:
    """What each preset adds per block on the product's path, in the first block (the largest grid) where it merges
    and the first where it pools keys/values as `tome_core.block_table` plans them, on a random input of that
    block's shape, timed by `torch.utils.benchmark.Timer` (`blocked_autorange`, the median): the call's partition,
    `band_match` and `band_merge` (the plan), then `BandMerge.merge_with_residual` and `unmerge_add` (a block merged
    whole), beside tomesd's `bipartite_soft_matching_random2d` merging the same share of the same tokens in the same
    cells; pooling (kv mode, pool_kv): `kv_downsample`."""
    family = tome_core.model_family(unet)
    width_of = {lv: b.norm1.normalized_shape[0] for b, lv in reversed(tome_core.transformer_blocks(unet))}
    ref = importlib.import_module(f"{tomesd.__name__}.merge").bipartite_soft_matching_random2d if tomesd else None
    gen = torch.Generator(device="cpu").manual_seed(opts.seed)
    rows = []
    for name in opts.presets or [p.name for p in tome_core.presets()]:
        cfg = tome_core.get_preset(name).config(family)
        blocks = tome_core.block_table(unet, cfg).blocks
        merging = next((b for b in blocks if b.merges and b.matching == "local"), None)
        for what, block in (("merge", merging), ("pool", next((b for b in blocks if b.pools), None))):
            if block is None:
                continue
            h, w = (math.ceil(side / archs.VAE_SCALE / block.level) for side in size)
            x = torch.randn(2, h * w, width_of[block.level], generator=gen).to(opts.device, opts.dtype)
            ratio = block.ratios[0] if what == "merge" else None
            if ratio is not None:
                fns = _merge_fns(x, h, w, block.sx, block.sy, ratio, cfg.seed or 0, ref, whole=block.kind == "whole")
            else:
                fns = {"pool": partial(merge_ops.kv_downsample, x, w, h, block.sx, block.sy)}
            ms = {key: _median_ms(fn, opts.clock) for key, fn in fns.items() if fn is not None}
            shape = (block.level, h * w, x.shape[-1], ratio, block.sx, block.sy)
            rows.append(OverheadRow(spec.name, size_label(size), name, what, *shape, ms))
    return rows


def _merge_fns(x: torch.Tensor, h: int, w: int, sx: int, sy: int, ratio: float, seed: int, ref: Callable[..., Any] | None,
               *, whole: bool) -> dict[str, Callable[[], Any] | None]:  # fmt: skip
    """The plan, the merge and unmerge of one block (merged whole, else of one of its modules), and tomesd's same
    merge; None where nothing merges."""
    table = merge_ops.random_partitions(merge_ops.grid_layout(h, w, sx, sy, x.device), seed)
    row = torch.tensor([500], device=x.device).remainder(table.count)  # the step's row, picked on the device

    def plan() -> merge_ops.BandMerge | None:
        m = merge_ops.band_match(x, table.pick_row(row, numbers=False))
        return None if m is None else merge_ops.band_merge(m, ratio)

    with torch.inference_mode():
        planned = plan()
    if planned is None:
        return {"plan": None, "merge": None, "tomesd": None}

    def merge_unmerge(band: merge_ops.BandMerge = planned) -> torch.Tensor:
        if not whole:
            return band.unmerge(band.merge(x))
        merged, residual = band.merge_with_residual(x)
        return band.unmerge_add(residual, merged)  # the block's output stands in for its merged input

    def tomesd_merge() -> torch.Tensor:
        assert ref is not None
        merge, unmerge = ref(x, w, h, sx, sy, int(h * w * ratio), no_rand=False, generator=torch.Generator(x.device))
        return unmerge(merge(x))

    return {"plan": plan, "merge": merge_unmerge, "tomesd": tomesd_merge if ref is not None else None}


def _median_ms(fn: Callable[[], Any], clock: str) -> float:
    """Median ms of `fn()` over `Timer.blocked_autorange` (0.2 s at least) on `clock`, with this process's threads."""
    from torch.utils.benchmark import Timer

    extra = {"timer": timing.clock("cpu")} if clock == "cpu" else {}
    timer = Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads(), **extra)
    with torch.inference_mode():
        return timer.blocked_autorange(min_run_time=0.2).median * 1e3


# ---------------------------------------------------------------------------------------------- progress


def call_flops(meta_unet: nn.Module, arch: str, size: tuple[int, int]) -> float:
    """FLOPs of one unpatched call (batch 2) of a meta-device UNet, by `torch.utils.flop_counter.FlopCounterMode`."""
    from torch.utils.flop_counter import FlopCounterMode

    args, kwargs = archs.make_inputs(arch, *size, dtype=torch.float16, device="meta")
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        meta_unet(*args, **kwargs)
    return float(counter.get_total_flops())


class CallBar:
    """A tqdm bar over the planned UNet calls, each weighing its group's FLOPs (group: an architecture and size), so
    that the rate and the time left count one SDXL call as the several SD1.5 calls it costs."""

    def __init__(self, plan: Mapping[str, tuple[int, float]], file: Any = None) -> None:
        from tqdm import tqdm

        self.plan, self.done, self.key = dict(plan), 0, ""
        self.calls = sum(calls for calls, _ in self.plan.values())
        total = sum(calls * flops for calls, flops in self.plan.values())
        self.bar = tqdm(total=total, unit="FLOP", unit_scale=True, file=file or sys.stderr, smoothing=0.1)

    def group(self, key: str) -> None:
        self.key = key

    def set_postfix_str(self, text: str) -> None:
        self.bar.set_postfix_str(f"call {self.done + 1}/{self.calls} {text}")

    def update(self, n: int = 1) -> None:
        self.done += n
        self.bar.update(n * self.plan[self.key][1])

    def close(self) -> None:
        self.bar.close()


def say(text: str) -> None:
    """A line past the bar (on stderr, with the bar's lines)."""
    from tqdm import tqdm

    tqdm.write(text, file=sys.stderr)


@contextmanager
def task(text: str) -> Iterator[None]:
    """Work that is no timed call: a line as it starts and one with its seconds as it ends."""
    say(f"{text} ...")
    start = time.perf_counter()
    yield
    say(f"{text}: {time.perf_counter() - start:.1f} s")
