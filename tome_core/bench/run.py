"""Measuring: the variants (baseline, ours, tomesd), one timed UNet step, and the merge overhead of one block."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib
import importlib.metadata
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from tome_core.bench import archs
from tome_core.config import TomeConfig
from tome_core.patch import _structural_levels

if TYPE_CHECKING:
    from tome_core.bench.cli import Options

# ---------------------------------------------------------------------------------------------- measuring


def rss_bytes() -> int | None:
    """Current resident set size from /proc (Linux); None elsewhere."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def _malloc_trim() -> None:
    """Give freed heap memory back to the OS (glibc) so RSS before a run is close to live memory."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class RssSampler:
    """Peak RSS growth over a block, sampled from /proc/self/statm every `interval` s by a thread.

    An estimate: short-lived peaks between samples are missed and allocator caching blurs it, but large
    tensors (attention maps, activations) are mmap'ed by glibc and show up. `peak` is None off Linux.
    """

    def __init__(self, interval: float = 0.001) -> None:
        self.interval = interval
        self.peak: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> RssSampler:
        gc.collect()
        _malloc_trim()
        self._base = rss_bytes()
        if self._base is not None:
            self._max = self._base
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            rss = rss_bytes()
            if rss is not None and rss > self._max:
                self._max = rss

    def __exit__(self, *exc: Any) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        rss = rss_bytes()
        self.peak = max(self._max, rss or 0) - self._base


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_step(
    unet: nn.Module, inputs: tuple[tuple[Any, ...], dict[str, Any]], device: torch.device, *, sample_rss: bool
) -> tuple[float, torch.Tensor, int | None]:
    """One timed UNet call: (seconds, output as float32 on CPU, peak memory growth in bytes or None)."""
    args, kwargs = inputs
    mem: int | None = None
    sampler = RssSampler() if sample_rss else None
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
    gc.disable()  # no collection pause inside the timed call
    try:
        with torch.inference_mode():
            if sampler is not None:
                sampler.__enter__()
            try:
                _sync(device)
                start = time.perf_counter()
                out = unet(*args, **kwargs, return_dict=False)[0]
                _sync(device)
                seconds = time.perf_counter() - start
            finally:
                if sampler is not None:
                    sampler.__exit__(None, None, None)
    finally:
        gc.enable()
    if device.type == "cuda":
        mem = torch.cuda.max_memory_allocated(device) - before
    elif sampler is not None:
        mem = sampler.peak
    return seconds, out.detach().float().cpu(), mem


def deviation(out: torch.Tensor, base: torch.Tensor) -> float:
    """Relative L2 distance ||out - base|| / ||base||, in float64."""
    base64 = base.double()
    return float((out.double() - base64).norm() / base64.norm().clamp_min(1e-30))


def _hook_count(model: nn.Module) -> int:
    return sum(
        len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks) + len(m._forward_hooks_with_kwargs)
        for m in model.modules()
    )


def _class_names(model: nn.Module) -> list[str]:
    return [type(m).__qualname__ + "@" + type(m).__module__ for m in model.modules()]


# ---------------------------------------------------------------------------------------------- variants


@dataclass
class Variant:
    kind: str  # baseline | ours | tomesd
    ratio: float | None
    apply: Callable[[nn.Module], None]
    remove: Callable[[nn.Module], None]
    times: list[float] = field(default_factory=list)
    mems: list[int] = field(default_factory=list)
    output: torch.Tensor | None = None
    error: str | None = None

    @property
    def label(self) -> str:
        return self.kind if self.ratio is None else f"{self.kind} r={self.ratio:g}"


def _noop(unet: nn.Module) -> None:
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


def _first_attention_level(unet: nn.Module) -> int:
    """Downsampling (1, 2, 4, ...) of the shallowest transformer block, read the way the core reads it."""
    return min(level for _, level in _structural_levels(unet))


def make_variants(opts: Options, unet: nn.Module, tomesd: Any | None) -> list[Variant]:
    variants = [Variant("baseline", None, _noop, _noop)]
    tome_core = importlib.import_module("tome_core")
    base_cfg = TomeConfig.from_dict(opts.ours_fields)
    if opts.tomesd_max_downsample == "auto":
        tomesd_md = _first_attention_level(unet)
    else:
        tomesd_md = int(opts.tomesd_max_downsample)
    ours = [("ours", base_cfg)] if "ours" in opts.variants else []
    ours += [(kind, TomeConfig.from_dict(fields)) for kind, fields in opts.extra_ours]
    for r in opts.ratios:
        for kind, ours_cfg in ours:
            cfg = ours_cfg.replace(ratio=r)
            variants.append(Variant(kind, r, lambda u, cfg=cfg: tome_core.apply_patch(u, cfg), tome_core.remove_patch))
        if "tomesd" in opts.variants and tomesd is not None:
            rng = _SeededGlobalRng(opts.seed, opts.device)

            def apply_tomesd(u: nn.Module, r: float = r, rng: _SeededGlobalRng = rng) -> None:
                rng.enter()
                tomesd.apply_patch(u, ratio=r, max_downsample=tomesd_md)

            def remove_tomesd(u: nn.Module, rng: _SeededGlobalRng = rng) -> None:
                tomesd.remove_patch(u)
                rng.exit()

            variants.append(Variant("tomesd", r, apply_tomesd, remove_tomesd))
    return variants


class _SeededGlobalRng:
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


@dataclass
class Row:
    arch: str
    size: str
    variant: str
    ratio: float | None
    median_s: float | None
    speedup: float | None
    peak_mem_mib: float | None
    deviation: float | None
    times_s: list[float]
    error: str | None = None


def bench_size(
    opts: Options,
    unet: nn.Module,
    spec: archs.Arch,
    size: tuple[int, int],
    tomesd: Any | None,
    checks: list[tuple[bool, str]],
    progress: Any,
) -> list[Row]:
    height, width = size
    size_label = f"{width}" if width == height else f"{width}x{height}"
    inputs = archs.make_inputs(
        spec, height, width, dtype=opts.dtype, device=opts.device, seed=opts.seed, timestep=opts.timestep
    )
    variants = make_variants(opts, unet, tomesd)
    hooks0, classes0 = _hook_count(unet), _class_names(unet)
    sample_rss = opts.device.type == "cpu"
    base = variants[0]
    restore_ok = True
    max_diff = 0.0
    compared = 0  # timed baseline runs compared with the first baseline output
    if opts.warmup == 0:
        # One untimed unpatched call: the first call at a shape pays one-time costs (kernel selection,
        # allocator growth) that would otherwise land on whichever variant runs first, the baseline.
        progress.set_postfix_str(f"{spec.name} {size_label}px priming call")
        run_step(unet, inputs, opts.device, sample_rss=False)
    for rep in range(opts.warmup + opts.repeats):
        warm = rep < opts.warmup
        for v in variants:
            progress.set_postfix_str(f"{spec.name} {size_label}px {v.label}" + (" warm-up" if warm else ""))
            if v.error is not None:
                progress.update(1)
                continue
            try:
                v.apply(unet)
                seconds, out, mem = run_step(unet, inputs, opts.device, sample_rss=sample_rss and rep == 0)
            except Exception as exc:  # a failing comparison must not stop the benchmark
                if v.kind == "baseline":
                    raise
                v.error = f"{type(exc).__name__}: {exc}"
                print(f"\n{v.label} failed at {size_label}px: {v.error}", file=sys.stderr)
            finally:
                v.remove(unet)
            progress.update(1)
            if v.error is not None:
                continue
            if _hook_count(unet) != hooks0 or _class_names(unet) != classes0:
                restore_ok = False
                checks.append(
                    (False, f"{spec.name} {size_label}px: {v.label} left hooks or classes behind after removal")
                )
            if rep == 0:
                v.output = out
                if mem is not None:
                    v.mems.append(mem)
            if not warm:
                v.times.append(seconds)
                if mem is not None and opts.device.type == "cuda":
                    v.mems.append(mem)
                if v is base and rep > 0:
                    compared += 1
                    if not torch.equal(out, base.output):
                        max_diff = max(max_diff, float((out - base.output).abs().max()))
    if base.output is not None and not torch.isfinite(base.output).all():
        checks.append((False, f"{spec.name} {size_label}px: the baseline output is not finite ({opts.dtype_name})"))
    # Patch/unpatch cycles before the last baseline run (the first of the last round). With one baseline run
    # only (--warmup 0 --repeats 1) nothing was compared and no check is claimed.
    cycles = sum(1 for v in variants if v.kind != "baseline" and v.error is None) * (opts.warmup + opts.repeats - 1)
    if compared:
        checks.append(
            (
                max_diff == 0.0,
                f"{spec.name} {size_label}px: baseline output bitwise identical in {compared} later timed run(s)"
                f" after {cycles} patch/unpatch cycles"
                + ("" if max_diff == 0.0 else f": NO, max |diff| = {max_diff:.3g}"),
            )
        )
    if restore_ok:
        checks.append((True, f"{spec.name} {size_label}px: no hook or class left behind by any removal"))

    base_median = statistics.median(base.times)
    rows = []
    for v in variants:
        if v.error is not None or not v.times:
            rows.append(Row(spec.name, size_label, v.kind, v.ratio, None, None, None, None, [], v.error))
            continue
        med = statistics.median(v.times)
        mem = max(v.mems) / 2**20 if v.mems else None
        dev = deviation(v.output, base.output) if v is not base else 0.0
        rows.append(Row(spec.name, size_label, v.kind, v.ratio, med, base_median / med, mem, dev, list(v.times)))
    return rows


@dataclass
class OverheadRow:
    arch: str
    size: str
    level: int
    tokens: int
    channels: int
    ratio: float
    ms: dict[str, float]  # matching name -> median ms of plan + merge + unmerge


def bench_overhead(
    opts: Options, unet: nn.Module, spec: archs.Arch, size: tuple[int, int], tomesd: Any | None
) -> list[OverheadRow]:
    """Merge overhead in one block of the first merged level: plan (matching) + merge + unmerge, interleaved.

    Times ours with local and global matching against tomesd's `bipartite_soft_matching_random2d` on a random
    tensor shaped like that block's input; the attention itself is not part of it.
    """
    from tome_core.merge import bipartite_soft_matching_random2d

    blocks = _structural_levels(unet)
    level = _first_attention_level(unet)
    channels = next(b for b, lv in blocks if lv == level).norm1.normalized_shape[0]
    height, width = size
    h, w = height // 8 // level, width // 8 // level
    gen = torch.Generator(device="cpu").manual_seed(opts.seed)
    x = torch.randn(2, h * w, channels, generator=gen).to(opts.device, opts.dtype)
    ref = importlib.import_module(f"{tomesd.__name__}.merge").bipartite_soft_matching_random2d if tomesd else None
    rows = []
    for ratio in opts.ratios:
        r = int(h * w * ratio)

        def ours(matching: str, r: int = r) -> Callable[[], Any]:
            def run() -> Any:
                g = torch.Generator().manual_seed(0)
                m, u = bipartite_soft_matching_random2d(x, w, h, 2, 2, r, generator=g, matching=matching)
                return u(m(x))

            return run

        fns: dict[str, Callable[[], Any]] = {"ours local": ours("local"), "ours global": ours("global")}
        if ref is not None:

            def run_ref(r: int = r) -> Any:
                g = torch.Generator(device=x.device).manual_seed(0)
                m, u = ref(x, w, h, 2, 2, r, no_rand=False, generator=g)
                return u(m(x))

            fns["tomesd"] = run_ref
        times: dict[str, list[float]] = {k: [] for k in fns}
        for rep in range(1 + max(3, opts.repeats)):
            for name, fn in fns.items():
                _sync(opts.device)
                start = time.perf_counter()
                fn()
                _sync(opts.device)
                if rep:
                    times[name].append(time.perf_counter() - start)
        ms = {k: statistics.median(v) * 1000 for k, v in times.items()}
        size_label = f"{width}" if width == height else f"{width}x{height}"
        rows.append(OverheadRow(spec.name, size_label, level, h * w, channels, ratio, ms))
    return rows
