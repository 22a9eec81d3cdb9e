"""Measuring: the variants (baseline, ours, tomesd), one timed UNet step, and the merge overhead of one block."""

from __future__ import annotations

import importlib
import importlib.metadata
import math
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from torch import nn

import tome_core
from tome_bench import archs, compiled, ops, timing
from tome_bench.options import PRESET_PREFIX, Options, OverheadRow, Row, spread
from tome_bench.timing import timed_call
from tome_core import TomeConfig
from tome_core import merge as merge_ops

__all__ = [
    "OverheadRow",
    "Row",
    "SeededGlobalRng",
    "Variant",
    "bench_overhead",
    "bench_size",
    "deviation",
    "hook_count",
    "make_variants",
    "noop",
    "psnr_db",
    "run_step",
]

# ---------------------------------------------------------------------------------------------- measuring


def run_step(
    unet: nn.Module,
    inputs: tuple[tuple[Any, ...], dict[str, Any]],
    device: torch.device,
    *,
    sample_rss: bool,
    clock_name: str = "wall",
) -> tuple[float, torch.Tensor, int | None]:
    """One timed UNet call: (seconds, output as float32 on CPU, peak memory growth in bytes or None)."""
    args, kwargs = inputs
    seconds, out, mem = timed_call(
        lambda: unet(*args, **kwargs, return_dict=False)[0], device, clock_name=clock_name, sample_rss=sample_rss
    )
    return seconds, out.detach().float().cpu(), mem


def deviation(out: torch.Tensor, base: torch.Tensor) -> float:
    """Relative L2 distance ||out - base|| / ||base||, in float64."""
    base64 = base.double()
    return float((out.double() - base64).norm() / base64.norm().clamp_min(1e-30))


def psnr_db(out: torch.Tensor, base: torch.Tensor) -> float | None:
    """PSNR of `out` against `base` in dB, the peak being the range of `base` (max - min), in float64.

    None when the two are identical (infinite PSNR); JSON writes it as null.
    """
    base64 = base.double()
    mse = float((out.double() - base64).pow(2).mean())
    if mse == 0.0:
        return None
    peak = float(base64.max() - base64.min())
    return 10.0 * math.log10(max(peak, 1e-30) ** 2 / mse)


def hook_count(model: nn.Module) -> int:
    """Forward, pre-forward and backward hooks on `model` and every submodule, and the forwards set on their
    instances (how ours and diffusers' hooks install): a removal must bring it back."""
    return sum(
        len(m._forward_hooks)
        + len(m._forward_pre_hooks)
        + len(m._backward_hooks)
        + len(m._forward_hooks_with_kwargs)
        + ("forward" in m.__dict__)
        for m in model.modules()
    )


def _class_names(model: nn.Module) -> list[str]:
    return [type(m).__qualname__ + "@" + type(m).__module__ for m in model.modules()]


# ---------------------------------------------------------------------------------------------- variants


@dataclass
class Variant:
    kind: str  # baseline | ours | ours:NAME | ours:preset=NAME | tomesd
    ratio: float | None
    apply: Callable[[nn.Module], None]
    remove: Callable[[nn.Module], None]
    times: list[float] = field(default_factory=list)
    mems: list[int] = field(default_factory=list)
    output: torch.Tensor | None = None
    #: Output per start latent kind (the first kind's is `output`).
    outputs: dict[str, torch.Tensor] = field(default_factory=dict)
    error: str | None = None
    #: --compile: runs through the compiled UNet; graphs dynamo compiled for it in the warm-up and in timed runs,
    #: and its first run's time (compiling included).
    compiled: bool = False
    graphs: int = 0
    recompiles: int = 0
    cudagraph_skips: int = 0
    first_s: float | None = None

    @property
    def label(self) -> str:
        return self.kind if self.ratio is None else f"{self.kind} r={self.ratio:g}"


def noop(model: Any) -> None:
    """The baseline's apply and remove: nothing."""
    return None


def load_tomesd() -> tuple[Any | None, str]:
    """(module, version) or (None, why not)."""
    try:
        module = importlib.import_module("tomesd")
    except ImportError as exc:
        return None, f"tomesd is not installed ({exc}); the tomesd comparison is skipped (pip install tomesd==0.1.3)"
    try:
        version = importlib.metadata.version("tomesd")
    except importlib.metadata.PackageNotFoundError:
        version = getattr(module, "__version__", "unknown")
    return module, version


def preset_variant_name(name: str) -> str:
    return f"{PRESET_PREFIX}{name}"


def _first_attention_level(unet: nn.Module) -> int:
    """Downsampling (1, 2, 4, ...) of the shallowest transformer block, read the way the core reads it."""
    return min(tome_core.blocks_per_level(unet))


def tomesd_max_downsample(opts: Options, unet: nn.Module) -> int:
    """tomesd's max_downsample from --tomesd-max-downsample ('auto': the UNet's first attention level)."""
    if opts.tomesd_max_downsample == "auto":
        return _first_attention_level(unet)
    return int(opts.tomesd_max_downsample)


def tomesd_merges_nothing(opts: Options, unet: nn.Module) -> bool:
    """Whether tomesd at --tomesd-max-downsample reaches no transformer block of `unet` (its default 1 on SDXL,
    which has no attention at full resolution): patched, it computes exactly what the unpatched UNet does."""
    return tomesd_max_downsample(opts, unet) < _first_attention_level(unet)


def make_variants(opts: Options, unet: nn.Module, tomesd: Any | None) -> list[Variant]:
    """baseline; at every ratio ours, each --ours configuration and tomesd; then each --presets preset once.

    The main job and the GPU estimate leave out a tomesd that merges nothing (`tomesd_merges_nothing`): on SDXL its
    calls would time the unpatched UNet again, a minute of a ten-minute job on a CPU; the report says so instead.
    """
    variants = [Variant("baseline", None, noop, noop)]
    base_cfg = TomeConfig.from_dict(opts.ours_fields)
    tomesd_md = tomesd_max_downsample(opts, unet)
    if (opts.main_job or opts.estimate_only) and tomesd is not None and tomesd_merges_nothing(opts, unet):
        tomesd = None
    ours = [("ours", base_cfg)] if "ours" in opts.variants else []
    ours += [(kind, TomeConfig.from_dict(fields)) for kind, fields in opts.extra_ours]
    for r in opts.ratios:
        for kind, ours_cfg in ours:
            cfg = ours_cfg.replace(ratio=r)
            variants.append(Variant(kind, r, lambda u, cfg=cfg: tome_core.apply_patch(u, cfg), tome_core.remove_patch))
        if "tomesd" in opts.variants and tomesd is not None:
            rng = SeededGlobalRng(opts.seed, opts.device)

            def apply_tomesd(u: nn.Module, r: float = r, rng: SeededGlobalRng = rng) -> None:
                rng.enter()
                tomesd.apply_patch(u, ratio=r, max_downsample=tomesd_md)

            def remove_tomesd(u: nn.Module, rng: SeededGlobalRng = rng) -> None:
                tomesd.remove_patch(u)
                rng.exit()

            variants.append(Variant("tomesd", r, apply_tomesd, remove_tomesd))
    for name in opts.presets:  # a preset fixes its own ratio: once, whatever --ratios says
        variants.append(
            Variant(
                preset_variant_name(name),
                None,
                lambda u, name=name: tome_core.apply_patch(u, preset=name),
                tome_core.remove_patch,
            )
        )
    return variants


class SeededGlobalRng:
    """tomesd forks the global RNG on its first call: seed it for reproducible partitions, then restore it.

    The caller's global RNG state is saved on `enter` and put back on `exit`, so running the benchmark
    in-process (tests) leaves torch's global RNG as it found it.
    """

    def __init__(self, seed: int, device: torch.device) -> None:
        self.seed = seed
        self.cuda = device.type == "cuda"
        self.saved: tuple[torch.Tensor, list[torch.Tensor] | None] | None = None

    def enter(self) -> None:
        self.saved = (torch.get_rng_state(), torch.cuda.get_rng_state_all() if self.cuda else None)
        torch.manual_seed(self.seed)

    def exit(self) -> None:
        if self.saved is None:
            return
        cpu, cuda = self.saved
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        self.saved = None


def run_variants(opts: Options, unet: nn.Module, tomesd: Any | None) -> list[Variant]:
    """What `bench_size` runs at each size: `make_variants`, and with --compile a compiled twin of each."""
    variants = make_variants(opts, unet, tomesd)
    return compiled.twins(variants, compiled_twin) if opts.compile_mode else variants


def extra_latents_first(opts: Options) -> bool:
    """Whether the untimed rounds on the further start latents run before the timed ones, as the warm-up: the main
    job's way of giving every variant an untimed first call without a priming call of its own."""
    return opts.main_job and opts.warmup == 0 and len(opts.latents) > 1


def primes(opts: Options) -> bool:
    """Whether `bench_size` makes one untimed unpatched call before its rounds (no warm-up round otherwise)."""
    return opts.warmup == 0 and not extra_latents_first(opts)


def calls_per_size(opts: Options, variants: int) -> int:
    """UNet calls `bench_size` makes at one size with `variants` variants (the priming call included)."""
    return (opts.warmup + opts.repeats + len(opts.latents) - 1) * variants + primes(opts)


def size_label(size: tuple[int, int]) -> str:
    """(height, width) -> '512' or '768x512' (width x height)."""
    height, width = size
    return f"{width}" if width == height else f"{width}x{height}"


def make_row(spec: archs.Arch, label: str, v: Variant, base: Variant, kinds: list[str]) -> Row:
    """The row of one variant: median, speed-up over `base`, spread, deviation and PSNR per start latent."""
    if v.error is not None or not v.times:
        return Row(spec.name, label, v.kind, v.ratio, None, None, None, None, [], v.error or "no timed run")
    base_median = statistics.median(base.times)
    med = statistics.median(v.times)
    mem = max(v.mems) / 2**20 if v.mems else None
    deviations: dict[str, float] = {}
    psnrs: dict[str, float | None] = {}
    for kind in kinds:
        out, ref = v.outputs.get(kind), base.outputs.get(kind)
        if out is None or ref is None:
            continue
        deviations[kind] = 0.0 if v is base else deviation(out, ref)
        psnrs[kind] = None if v is base else psnr_db(out, ref)
    return Row(
        spec.name,
        label,
        v.kind,
        v.ratio,
        med,
        base_median / med,
        mem,
        deviations.get(kinds[0]),
        list(v.times),
        spread=spread(v.times),
        deviations=deviations,
        psnr_db=psnrs,
    )


def record(
    v: Any,
    base: Any,
    kind: str,
    out: torch.Tensor,
    seconds: float,
    mem: int | None,
    *,
    rep: int,
    warm: bool,
    device: torch.device,
) -> float | None:
    """Keep one run's output, time and memory on variant `v` (rep < 0: an untimed run on another start latent).

    Returns max |out - first baseline output| for a later timed baseline run, which must stay 0.0; else None.
    """
    if rep < 0:
        v.outputs[kind] = out
        return None
    if rep == 0:
        v.output = v.outputs[kind] = out
        if mem is not None:
            v.mems.append(mem)
    if warm:
        return None
    v.times.append(seconds)
    if mem is not None and device.type == "cuda":
        v.mems.append(mem)
    if v is not base or rep == 0 or base.output is None:
        return None
    return 0.0 if torch.equal(out, base.output) else float((out - base.output).abs().max())


def baseline_check(subject: str, runs: str, max_diff: float) -> tuple[bool, str]:
    """The check that the baseline stayed bitwise identical over `runs` (what `record` measured as `max_diff`)."""
    ok = max_diff == 0.0
    return ok, f"{subject} bitwise identical in {runs}" + ("" if ok else f": NO, max |diff| = {max_diff:.3g}")


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

    The first start latent of --latents is timed; every further one is run once more per variant, untimed,
    for its deviation (after the timed rounds, or before them in the main job: `extra_latents_first`).
    `progress` hears of every call: `set_postfix_str` names it before, `update(1)` follows it.
    """
    height, width = size
    label = size_label(size)
    kinds = opts.latents
    inputs = {
        kind: archs.make_inputs(
            spec,
            height,
            width,
            dtype=opts.dtype,
            device=opts.device,
            seed=opts.seed,
            timestep=opts.timestep,
            latent_kind=kind,
        )
        for kind in kinds
    }
    variants = run_variants(opts, unet, tomesd)
    runner = compiled.Compiled(opts.compile_mode) if opts.compile_mode else None
    if runner is not None:
        runner.of(unet)  # wrapped now: torch.compile marks the module it wraps
    hooks0, classes0 = hook_count(unet), _class_names(unet)
    sample_rss = opts.device.type == "cpu"
    base = variants[0]
    restore_ok = True
    max_diff = 0.0
    compared = 0  # timed baseline runs compared with the first baseline output
    if primes(opts):
        # One untimed unpatched call: the first call at a shape pays one-time costs (kernel selection,
        # allocator growth) that would otherwise land on whichever variant runs first, the baseline.
        progress.set_postfix_str(f"{spec.name} {label}px priming call")
        run_step(unet, inputs[kinds[0]], opts.device, sample_rss=False)
        progress.update(1)
    # (round, start latent): the timed rounds on the first kind and one untimed round per further kind, after them
    # or, in the main job, before them: there they pay the one-time costs of every variant.
    timed = [(rep, kinds[0]) for rep in range(opts.warmup + opts.repeats)]
    extra = [(-1, kind) for kind in kinds[1:]]
    rounds = extra + timed if extra_latents_first(opts) else timed + extra
    with timing.TimingLock(opts.lock, opts.lock_after) as lock:  # --lock: the timed runs, one process at a time
        for rep, kind in rounds:
            warm = rep < opts.warmup
            if not warm:
                lock.hold()
            for v in variants:
                what = " warm-up" if 0 <= rep < opts.warmup else (f" {kind} latent" if rep < 0 else "")
                progress.set_postfix_str(f"{spec.name} {label}px {v.label}{what}")
                if v.error is not None:
                    progress.update(1)
                    continue
                try:
                    v.apply(unet)
                    module = runner.of(unet) if runner is not None and v.compiled else unet
                    with compiled.counting(v, warm):
                        seconds, out, mem = run_step(
                            module, inputs[kind], opts.device, sample_rss=sample_rss and rep == 0, clock_name=opts.clock
                        )
                except Exception as exc:  # a failing comparison must not stop the benchmark
                    if v.kind == "baseline":
                        raise
                    v.error = f"{type(exc).__name__}: {exc}"
                    print(f"\n{v.label} failed at {label}px: {v.error}", file=sys.stderr)
                finally:
                    v.remove(unet)
                progress.update(1)
                if v.error is not None:
                    continue
                if hook_count(unet) != hooks0 or _class_names(unet) != classes0:
                    restore_ok = False
                    checks.append(
                        (False, f"{spec.name} {label}px: {v.label} left hooks or classes behind after removal")
                    )
                if rep == 0:
                    v.first_s = seconds
                diff = record(v, base, kind, out, seconds, mem, rep=rep, warm=warm, device=opts.device)
                if diff is not None:
                    compared += 1
                    max_diff = max(max_diff, diff)
    if base.output is not None and not torch.isfinite(base.output).all():
        checks.append((False, f"{spec.name} {label}px: the baseline output is not finite ({opts.dtype_name})"))
    # Patch/unpatch cycles before the last baseline run (the first of the last round). With one baseline run
    # only (--warmup 0 --repeats 1) nothing was compared and no check is claimed.
    before = opts.warmup + opts.repeats - 1 + (len(extra) if extra_latents_first(opts) else 0)
    cycles = sum(1 for v in variants if v.kind != "baseline" and v.error is None) * before
    if compared:
        checks.append(
            baseline_check(
                f"{spec.name} {label}px: baseline output",
                f"{compared} later timed run(s) after {cycles} patch/unpatch cycles",
                max_diff,
            )
        )
    if restore_ok:
        checks.append((True, f"{spec.name} {label}px: no hook or class left behind by any removal"))
    rows = [make_row(spec, label, v, base_of(v, variants), kinds) for v in variants]
    compiled.fill_rows(rows, variants)
    return rows


def compiled_twin(v: Variant) -> Variant:
    """The same patch, run through the compiled UNet."""
    return Variant(compiled.twin_name(v.kind), v.ratio, v.apply, v.remove, compiled=True)


def base_of(v: Variant, variants: list[Variant]) -> Variant:
    """The baseline a variant's speed-up is over: the eager one, or for a compiled twin the compiled one."""
    return next(b for b in variants if compiled.eager_name(b.kind) == "baseline" and b.compiled == v.compiled)


def _is_ours(kind: str) -> bool:
    return kind == "ours" or kind.startswith("ours:")


def bench_ops(
    opts: Options, unet: nn.Module, spec: archs.Arch, size: tuple[int, int], tomesd: Any | None
) -> dict[str, dict[str, float]]:
    """aten operations each variant's patch adds per block that merged, at one size: variant label -> counts.

    (ops of one patched UNet call - ops of the unpatched call) / blocks that merged, counted by
    `tome_bench.ops.count_ops` in kinds: total, kernel-launching, views and host syncs. Blocks that merged:
    ours `tome_core.stats(unet).applied` after `reset_stats`; tomesd the transformer blocks at the levels its
    max_downsample reaches (it patches every block, merges in those). Counted on the second patched call, the
    steady state of every later step (the first builds the per-grid index tables once). The counts do not depend on
    the size, only on which blocks merge.
    """
    height, width = size
    args, kwargs = archs.make_inputs(
        spec, height, width, dtype=opts.dtype, device=opts.device, seed=opts.seed, timestep=opts.timestep
    )

    def call() -> Any:
        return unet(*args, **kwargs, return_dict=False)

    base, _ = ops.count_ops(call)
    tomesd_md = tomesd_max_downsample(opts, unet)
    tomesd_blocks = sum(n for level, n in tome_core.blocks_per_level(unet).items() if level <= tomesd_md)
    out: dict[str, dict[str, float]] = {}
    for v in make_variants(opts, unet, tomesd)[1:]:
        v.apply(unet)
        try:
            with torch.inference_mode():
                call()
            if _is_ours(v.kind):
                tome_core.reset_stats(unet)
            counts, _ = ops.count_ops(call)
            if _is_ours(v.kind):
                merged = tome_core.stats(unet)
                blocks = 0 if merged is None else merged.applied
            else:
                blocks = tomesd_blocks
        finally:
            v.remove(unet)
        diff = counts - base
        row: dict[str, float] = {"blocks": float(blocks)}
        if blocks:
            row.update({k: getattr(diff, k) / blocks for k in ("total", "launching", "views", "syncs")})
        out[v.label] = row
    return out


def bench_overhead(
    opts: Options, unet: nn.Module, spec: archs.Arch, size: tuple[int, int], tomesd: Any | None
) -> list[OverheadRow]:
    """What each preset adds per block, on the product's path, in the first block (the largest grid) where it merges
    and the first where it pools keys/values, as `tome_core.block_table` plans them: one row each, timed by
    `torch.utils.benchmark.Timer` on a random input of that block's shape (--clock; `blocked_autorange`, the median).

    Merging, as `tome_core.patch` runs a preset's blocks: the call's partition (a row of the grid's table of random
    partitions, built once per grid and kept), `band_match` and `band_merge` (the plan, made once per call by the
    first block of a stack that shares it), then `BandMerge.merge_with_residual` and `unmerge_add` (the merge and the
    unmerge of a block merged whole); beside it tomesd's `bipartite_soft_matching_random2d` merging the same share
    of the same tokens in the same cells (plan, merge and unmerge). Pooling (kv mode, pool_kv): `kv_downsample`.
    """
    family = tome_core.model_family(unet)
    width_of = {lv: b.norm1.normalized_shape[0] for b, lv in reversed(tome_core.transformer_blocks(unet))}
    ref = importlib.import_module(f"{tomesd.__name__}.merge").bipartite_soft_matching_random2d if tomesd else None
    gen = torch.Generator(device="cpu").manual_seed(opts.seed)
    rows = []
    for name in opts.presets or [p.name for p in tome_core.presets()]:
        cfg = tome_core.get_preset(name).config(family)
        blocks = tome_core.block_table(unet, cfg).blocks
        merging = next((b for b in blocks if b.merges and b.matching == "local"), None)
        pooling = next((b for b in blocks if b.pools), None)
        for what, block in (("merge", merging), ("pool", pooling)):
            if block is None:
                continue
            h, w = (math.ceil(side / archs.VAE_SCALE / block.level) for side in size)
            x = torch.randn(2, h * w, width_of[block.level], generator=gen).to(opts.device, opts.dtype)
            ratio = block.ratios[0] if what == "merge" else None
            if ratio is not None:
                fns = _merge_fns(x, h, w, block.sx, block.sy, ratio, cfg.seed or 0, ref, whole=block.kind == "whole")
            else:
                fns = {"pool": partial(merge_ops.kv_downsample, x, w, h, block.sx, block.sy)}
            ms = {key: _median_ms(fn, opts) for key, fn in fns.items() if fn is not None}
            label = size_label(size)
            rows.append(
                OverheadRow(
                    spec.name, label, name, what, block.level, h * w, x.shape[-1], ratio, block.sx, block.sy, ms
                )
            )
    return rows


def _merge_fns(
    x: torch.Tensor,
    h: int,
    w: int,
    sx: int,
    sy: int,
    ratio: float,
    seed: int,
    ref: Callable[..., Any] | None,
    *,
    whole: bool,
) -> dict[str, Callable[[], Any] | None]:
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

    fns: dict[str, Callable[[], Any] | None] = {"plan": plan, "merge": merge_unmerge, "tomesd": None}
    if ref is not None:
        r = int(h * w * ratio)  # tomesd's count of tokens to merge away

        def tomesd_merge() -> torch.Tensor:
            merge, unmerge = ref(x, w, h, sx, sy, r, no_rand=False, generator=torch.Generator(x.device))
            return unmerge(merge(x))

        fns["tomesd"] = tomesd_merge
    return fns


def _median_ms(fn: Callable[[], Any], opts: Options) -> float:
    """Median milliseconds of `fn()` over `Timer.blocked_autorange` (0.2 s at least) on --clock, with this process's
    thread count (Timer's default is one thread); the device is synchronised by Timer's own clock."""
    from torch.utils.benchmark import Timer

    extra = {"timer": timing.clock("cpu")} if opts.clock == "cpu" else {}
    timer = Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads(), **extra)
    with torch.inference_mode():
        return timer.blocked_autorange(min_run_time=0.2).median * 1e3
