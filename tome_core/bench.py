"""Benchmark one UNet step: baseline vs. ours (tome_core) vs. tomesd, interleaved in one process.

    python -m tome_core.bench                       # SD1.5, 512 and 1024 px, ratios 0.3/0.5/0.7, CPU fp32
    python -m tome_core.bench --quick               # smoke test: 256 px, ratio 0.5, 1 repeat
    python -m tome_core.bench --device cuda --arch sdxl --sizes 1024 --set max_downsample=2 --set matching=global

For every architecture and size it times one UNet call with batch 2 (cond + uncond, as a sampler does) for
the unpatched baseline and, at each ratio, `tome_core.apply_patch` with the config under test and
`tomesd.apply_patch(unet, ratio=r)` with tomesd's defaults. The variants run round-robin within each
repetition (so clock or thermal drift affects all of them alike) after one warm-up round; a patch is removed
right after its variant ran and the baseline output is checked to be bitwise identical afterwards. Reported:
the median time, speed-up over baseline, peak memory and the output deviation ||out - base|| / ||base||.
Writes a markdown table to stdout and bench.md, bench.json and bench.png (speed-up vs. deviation) to --out.

Weights are random (see tome_core.archs) unless --checkpoint names a real .safetensors file; inputs are
seeded random latents and text states. tomesd is optional: without it that variant is skipped with a note.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime as _dt
import gc
import importlib
import importlib.metadata
import json
import os
import platform
import shlex
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tome_core import archs
from tome_core.config import FieldSpec, TomeConfig, field_spec, field_specs
from tome_core.patch import _structural_levels

VARIANTS = ("baseline", "ours", "tomesd")
DEFAULT_SIZES = "512,1024"
DEFAULT_RATIOS = "0.3,0.5,0.7"
DEFAULT_REPEATS = 3
QUICK_SIZES = "256"
QUICK_RATIOS = "0.5"
#: Fields of TomeConfig that --set may not touch because another option owns them.
_OWNED_FIELDS = {"ratio": "--ratios"}
_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


# ---------------------------------------------------------------------------------------------- options


def parse_field_value(spec: FieldSpec, text: str) -> Any:
    """Parse the text of `--set NAME=VALUE` for one TomeConfig field, by its kind and choices.

    Raises ValueError naming the field and its allowed values. Range checks are left to TomeConfig.
    """
    raw = text.strip()
    if spec.optional and raw.lower() == "none":
        return None
    try:
        if spec.choices is not None:
            for choice in spec.choices:
                if raw == str(choice) or (isinstance(choice, str) and raw.lower() == choice.lower()):
                    return choice
            raise ValueError
        if spec.kind is bool:
            if raw.lower() in _TRUE:
                return True
            if raw.lower() in _FALSE:
                return False
            raise ValueError
        if spec.kind is int:
            return int(raw)
        if spec.kind is float:
            return float(raw)
        return raw
    except ValueError:
        raise ValueError(f"--set {spec.name}: must be {spec.allowed()}, got {text!r}") from None


def parse_sets(items: Sequence[str]) -> dict[str, Any]:
    """`["mode=kv", "sx=4"]` -> {"mode": "kv", "sx": 4}, validated as a whole by TomeConfig."""
    known = [s.name for s in field_specs() if s.name not in _OWNED_FIELDS]
    values: dict[str, Any] = {}
    for item in items:
        name, sep, text = item.partition("=")
        name = name.strip()
        if not sep:
            raise ValueError(f"--set expects NAME=VALUE, got {item!r}; fields: {', '.join(known)}")
        if name in _OWNED_FIELDS:
            raise ValueError(f"--set {name}: use {_OWNED_FIELDS[name]} instead")
        try:
            spec = field_spec(name)
        except KeyError:
            raise ValueError(f"--set: unknown field {name!r}; fields: {', '.join(known)}") from None
        values[name] = parse_field_value(spec, text)
    TomeConfig.from_dict(values)  # range and cross-field checks, errors name the field
    return values


def parse_extra_ours(item: str, base: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """`"kv:mode=kv,sx=4"` -> ("ours:kv", {**base, "mode": "kv", "sx": 4}), validated by TomeConfig."""
    name, sep, body = item.partition(":")
    name = name.strip()
    if not sep or not name or not name.replace("-", "").replace("_", "").isalnum():
        raise ValueError(f"--ours expects NAME:FIELD=VALUE[,FIELD=VALUE...] with a simple NAME, got {item!r}")
    fields = parse_sets([part for part in body.split(",") if part.strip()])
    merged = {**base, **fields}
    TomeConfig.from_dict(merged)
    return f"ours:{name}", merged


def _csv(text: str, kind: Callable[[str], Any], what: str) -> list[Any]:
    try:
        items = [kind(part.strip()) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"bad {what} list {text!r}: {exc}") from None
    if not items:
        raise argparse.ArgumentTypeError(f"empty {what} list")
    return items


def _size(text: str) -> tuple[int, int]:
    """'512' -> (512, 512); '768x512' -> width 768, height 512 -> (height, width) = (512, 768)."""
    w, _, h = text.lower().partition("x")
    width = int(w)
    height = int(h) if h else width
    if width <= 0 or height <= 0 or width % archs.VAE_SCALE or height % archs.VAE_SCALE:
        raise ValueError(f"sizes must be positive multiples of {archs.VAE_SCALE} px, got {text!r}")
    return height, width


def _ratio(text: str) -> float:
    value = float(text)
    spec = field_spec("ratio")
    if not spec.minimum <= value <= spec.maximum:
        raise ValueError(f"ratio must be {spec.allowed()}, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    specs = [s for s in field_specs() if s.name not in _OWNED_FIELDS]
    set_help = "; ".join(f"{s.name}: {s.allowed()} (default {s.default!r})" for s in specs)
    p = argparse.ArgumentParser(
        prog="python -m tome_core.bench",
        description="Time one Stable Diffusion UNet step (batch 2) unpatched, with tome_core and with tomesd.",
    )
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--dtype", choices=tuple(archs.DTYPES), default=None, help="default: fp32 on cpu, fp16 on cuda")
    p.add_argument(
        "--arch",
        default="sd15",
        metavar="{sd15,sdxl}",
        help="architecture, or a comma-separated list (default sd15)",
    )
    p.add_argument(
        "--sizes", default=None, help=f"image sizes in px, W or WxH, comma-separated (default {DEFAULT_SIZES})"
    )
    p.add_argument("--ratios", default=None, help=f"merge ratios, comma-separated (default {DEFAULT_RATIOS})")
    p.add_argument("--repeats", type=int, default=None, help=f"timed runs per variant (default {DEFAULT_REPEATS})")
    p.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="untimed warm-up rounds of every variant before the timed ones (default 1; 0 still makes one untimed"
        " baseline call first)",
    )
    p.add_argument("--checkpoint", default=None, help="real UNet weights: .safetensors, diffusers or single-file SD")
    p.add_argument("--out", default="bench-out", help="output folder (default bench-out/)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help="comma-separated subset of baseline,ours,tomesd (the baseline always runs: it is the reference)",
    )
    p.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help=f"a TomeConfig field for 'ours' (repeatable). {set_help}",
    )
    p.add_argument(
        "--ours",
        dest="extra_ours",
        action="append",
        default=[],
        metavar="NAME:FIELD=VALUE[,FIELD=VALUE...]",
        help="an extra configuration of ours, run side by side with the others at every ratio (repeatable),"
        " e.g. --ours kv:mode=kv --ours global:matching=global; fields as for --set, on top of --set",
    )
    p.add_argument(
        "--tomesd-max-downsample",
        default="1",
        choices=("1", "2", "4", "8", "auto"),
        help="tomesd's max_downsample (default 1, tomesd's own default; 'auto' = the first level with attention,"
        " e.g. 2 for SDXL, where 1 merges nothing)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights and inputs (default 0)")
    p.add_argument("--timestep", type=int, default=500, help="UNet timestep of the step (default 500)")
    p.add_argument(
        "--quick", action="store_true", help=f"smoke test: sizes {QUICK_SIZES}, ratio {QUICK_RATIOS}, 1 repeat"
    )
    return p


@dataclass
class Options:
    device: torch.device
    dtype: torch.dtype
    dtype_name: str
    arches: list[archs.Arch]
    sizes: list[tuple[int, int]]
    ratios: list[float]
    repeats: int
    warmup: int
    checkpoint: str | None
    out: Path
    threads: int | None
    variants: list[str]
    ours_fields: dict[str, Any]
    extra_ours: list[tuple[str, dict[str, Any]]]
    tomesd_max_downsample: str
    seed: int
    timestep: int


def parse_options(argv: Sequence[str]) -> Options:
    parser = build_parser()
    a = parser.parse_args(argv)
    try:
        arches = [archs.get_arch(name.strip()) for name in a.arch.split(",") if name.strip()]
        if not arches:
            raise ValueError("--arch is empty")
        sizes = _csv(a.sizes or (QUICK_SIZES if a.quick else DEFAULT_SIZES), _size, "size")
        ratios = _csv(a.ratios or (QUICK_RATIOS if a.quick else DEFAULT_RATIOS), _ratio, "ratio")
        repeats = a.repeats if a.repeats is not None else (1 if a.quick else DEFAULT_REPEATS)
        if repeats < 1:
            raise ValueError(f"--repeats must be at least 1, got {repeats}")
        variants = [v.strip() for v in a.variants.split(",") if v.strip()]
        bad = [v for v in variants if v not in VARIANTS]
        if bad:
            raise ValueError(f"--variants: unknown {', '.join(map(repr, bad))}; choose from {', '.join(VARIANTS)}")
        variants = [v for v in VARIANTS if v in variants or v == "baseline"]
        ours_fields = parse_sets(a.sets)
        extra_ours = [parse_extra_ours(item, ours_fields) for item in a.extra_ours]
        if a.checkpoint and len(arches) != 1:
            raise ValueError("--checkpoint needs exactly one --arch")
        if a.checkpoint and not os.path.isfile(a.checkpoint):
            raise ValueError(f"--checkpoint {a.checkpoint!r} is not a file")
        if a.checkpoint and not a.checkpoint.endswith(".safetensors"):
            raise ValueError(
                f"--checkpoint must be a .safetensors file (pickled .ckpt is not loaded), got {a.checkpoint!r}"
            )
        if a.warmup < 0:
            raise ValueError(f"--warmup must be at least 0, got {a.warmup}")
        if a.threads is not None and a.threads < 1:
            raise ValueError(f"--threads must be at least 1, got {a.threads}")
        if a.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("--device cuda: torch.cuda.is_available() is False")
    except (ValueError, TypeError, argparse.ArgumentTypeError) as exc:
        parser.error(str(exc))
    dtype_name = a.dtype or ("fp16" if a.device == "cuda" else "fp32")
    return Options(
        device=torch.device(a.device),
        dtype=archs.as_dtype(dtype_name),
        dtype_name=dtype_name,
        arches=arches,
        sizes=sizes,
        ratios=ratios,
        repeats=repeats,
        warmup=a.warmup,
        checkpoint=a.checkpoint,
        out=Path(a.out),
        threads=a.threads,
        variants=variants,
        ours_fields=ours_fields,
        extra_ours=extra_ours,
        tomesd_max_downsample=a.tomesd_max_downsample,
        seed=a.seed,
        timestep=a.timestep,
    )


# ---------------------------------------------------------------------------------------------- measuring


def _rss_bytes() -> int | None:
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
        self._base = _rss_bytes()
        if self._base is not None:
            self._max = self._base
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            rss = _rss_bytes()
            if rss is not None and rss > self._max:
                self._max = rss

    def __exit__(self, *exc: Any) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        rss = _rss_bytes()
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
                if v is base and rep > 0 and not torch.equal(out, base.output):
                    max_diff = max(max_diff, float((out - base.output).abs().max()))
    if base.output is not None and not torch.isfinite(base.output).all():
        checks.append((False, f"{spec.name} {size_label}px: the baseline output is not finite ({opts.dtype_name})"))
    cycles = sum(1 for v in variants if v.kind != "baseline" and v.error is None) * opts.repeats
    checks.append(
        (
            max_diff == 0.0,
            f"{spec.name} {size_label}px: baseline output bitwise identical in all {opts.repeats} timed runs after"
            f" {cycles} patch/unpatch cycles" + ("" if max_diff == 0.0 else f": NO, max |diff| = {max_diff:.3g}"),
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


def format_overhead(rows: Sequence[OverheadRow]) -> str:
    header = [
        "arch",
        "size",
        "level",
        "tokens x channels",
        "ratio",
        "ours local ms",
        "ours global ms",
        "tomesd ms",
        "local / tomesd",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * 4 + "---:|" * 5]
    for r in rows:
        ref = r.ms.get("tomesd")
        cells = [
            r.arch,
            r.size,
            f"1/{r.level}",
            f"{r.tokens} x {r.channels}",
            f"{r.ratio:g}",
            f"{r.ms['ours local']:.1f}",
            f"{r.ms['ours global']:.1f}",
            f"{ref:.1f}" if ref else "-",
            f"{r.ms['ours local'] / ref:.2f}" if ref else "-",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- reporting


def mem_header(device: torch.device) -> str:
    if device.type == "cuda":
        return "peak mem MiB (CUDA max_memory_allocated growth)"
    if _rss_bytes() is None:
        return "peak mem (n/a on this OS)"
    return "peak mem MiB (RSS growth, sampled, warm-up run)"


def format_table(rows: Sequence[Row], device: torch.device) -> str:
    header = ["arch", "size", "variant", "ratio", "median s", "speed-up", mem_header(device), "deviation"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] * 3 + ["---:"] * 5) + "|"]
    for r in rows:
        ratio = "-" if r.ratio is None else f"{r.ratio:g}"
        if r.error is not None or r.median_s is None:
            cells = [r.arch, r.size, r.variant, ratio, "error", "-", "-", (r.error or "no result").replace("|", "/")]
        else:
            cells = [
                r.arch,
                r.size,
                r.variant,
                ratio,
                f"{r.median_s:.3f}",
                f"{r.speedup:.2f}x",
                "n/a" if r.peak_mem_mib is None else f"{r.peak_mem_mib:.0f}",
                f"{r.deviation:.4f}",
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def machine_info(opts: Options, tomesd_version: str | None) -> dict[str, str]:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info = {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "cpu": f"{cpu} ({os.cpu_count()} logical CPUs)",
        "torch threads": str(torch.get_num_threads()),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "diffusers": _version("diffusers"),
        "tomesd": tomesd_version or "not installed",
        "load average (1 min) at start": _loadavg(),
        "device": str(opts.device),
        "dtype": opts.dtype_name,
    }
    if opts.device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(opts.device)
    return info


def _loadavg() -> str:
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except (OSError, AttributeError):
        return "n/a"


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def write_plot(rows: Sequence[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[tuple[str, str], list[Row]] = {}
    for r in rows:
        groups.setdefault((r.arch, r.size), []).append(r)
    fig, axes = plt.subplots(1, len(groups), figsize=(5.5 * len(groups), 4.5), squeeze=False)
    styles = {"baseline": ("black", "x"), "ours": ("tab:blue", "o"), "tomesd": ("tab:orange", "s")}
    extra_colors = iter(("tab:green", "tab:purple", "tab:red", "tab:brown", "tab:pink", "tab:olive", "tab:cyan"))
    for kind in dict.fromkeys(r.variant for r in rows if r.variant.startswith("ours:")):
        styles[kind] = (next(extra_colors, "tab:gray"), "^")
    for ax, ((arch, size), group) in zip(axes[0], groups.items()):
        for kind, (color, marker) in styles.items():
            pts = [r for r in group if r.variant == kind and r.median_s is not None]
            if not pts:
                continue
            ax.scatter([r.deviation for r in pts], [r.speedup for r in pts], c=color, marker=marker, s=50, label=kind)
            for r in pts:
                if r.ratio is not None:
                    ax.annotate(
                        f"{kind} r={r.ratio:g}",
                        (r.deviation, r.speedup),
                        textcoords="offset points",
                        xytext=(5, 4),
                        fontsize=8,
                        color=color,
                    )
        ax.axhline(1.0, color="grey", lw=0.6, ls=":")
        ax.set_title(f"{arch} {size}px: one UNet step, batch 2")
        ax.set_xlabel("output deviation ||out - base|| / ||base||")
        ax.set_ylabel("speed-up over baseline (x)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(
    opts: Options,
    argv: Sequence[str],
    rows: Sequence[Row],
    checks: Sequence[tuple[bool, str]],
    notes: Sequence[str],
    info: dict[str, str],
    wall: float,
    overhead: Sequence[OverheadRow] = (),
) -> str:
    command = "python -m tome_core.bench" + ("" if not argv else " " + shlex.join(argv))
    cfg = TomeConfig.from_dict(opts.ours_fields)
    changed = {k: v for k, v in cfg.to_dict().items() if k != "ratio" and k in opts.ours_fields}
    lines = [
        "# ToMe benchmark: one UNet step",
        "",
        f"Command: `{command}`",
        "",
        *[f"- {k}: {v}" for k, v in info.items()],
        f"- weights: {opts.checkpoint or f'random (seed {opts.seed})'}; inputs: seeded random (seed {opts.seed}),"
        f" batch 2 (cond + uncond), timestep {opts.timestep}",
        f"- repeats: {opts.repeats} timed runs per variant after {opts.warmup} warm-up round(s), variants interleaved"
        " round-robin",
        "- ours: `tome_core.apply_patch(unet, TomeConfig(ratio=r"
        + "".join(f", {k}={v!r}" for k, v in changed.items())
        + "))`",
        "  full config: " + ", ".join(f"{k}={v!r}" for k, v in cfg.to_dict().items() if k != "ratio"),
        f"- tomesd: `tomesd.apply_patch(unet, ratio=r, max_downsample={opts.tomesd_max_downsample})`, other arguments"
        " at tomesd's defaults (sx=sy=2, use_rand=True, merge_attn only)",
        f"- total wall time: {wall:.1f} s; load average (1 min) at the end: {_loadavg()}",
        "",
        "## Results",
        "",
        format_table(rows, opts.device),
        "",
        "median s: median wall time of one UNet call. speed-up: baseline median / median. deviation: relative L2"
        " distance of the output from the baseline output on the same input (warm-up run).",
        "",
        "## Merge overhead per block",
        "",
        "Matching + merge + unmerge on one block input of the first merged level (random tokens, sx = sy = 2,"
        " random partitions), median of the interleaved runs; the attention itself is not included.",
        "",
        format_overhead(overhead),
        "",
        "## Sanity checks",
        "",
        *[f"- {'PASS' if ok else 'FAIL'}: {text}" for ok, text in checks],
    ]
    if notes:
        lines += ["", "## Notes", "", *[f"- {n}" for n in notes]]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    opts = parse_options(argv)
    from tqdm import tqdm

    started = time.perf_counter()
    if opts.threads is not None:
        torch.set_num_threads(opts.threads)
    notes: list[str] = []
    tomesd = None
    tomesd_version: str | None = None
    if "tomesd" in opts.variants:
        tomesd, msg = load_tomesd()
        if tomesd is None:
            print(msg, file=sys.stderr)
            notes.append(msg)
        else:
            tomesd_version = msg
    info = machine_info(opts, tomesd_version)
    runs_per_size = (opts.warmup + opts.repeats) * (
        1
        + len(opts.ratios)
        * (("ours" in opts.variants) + len(opts.extra_ours) + ("tomesd" in opts.variants and tomesd is not None))
    )
    rows: list[Row] = []
    overhead: list[OverheadRow] = []
    checks: list[tuple[bool, str]] = []
    with tqdm(total=runs_per_size * len(opts.sizes) * len(opts.arches), unit="step", file=sys.stderr) as progress:
        for spec in opts.arches:
            progress.set_postfix_str(f"building {spec.name}")
            unet = archs.build_unet(spec, opts.dtype, opts.device, opts.seed)
            if opts.checkpoint:
                progress.set_postfix_str(f"loading {opts.checkpoint}")
                archs.load_checkpoint(unet, opts.checkpoint, spec)
            processors = {type(p).__name__ for p in unet.attn_processors.values()}
            if processors != {"AttnProcessor2_0"}:
                notes.append(f"{spec.name}: attention processors are {sorted(processors)}, not AttnProcessor2_0")
            for size in opts.sizes:
                progress.set_postfix_str(f"{spec.name} {size[1]}px merge overhead")
                overhead += bench_overhead(opts, unet, spec, size, tomesd)
                rows += bench_size(opts, unet, spec, size, tomesd, checks, progress)
            del unet
            gc.collect()
            if opts.device.type == "cuda":
                torch.cuda.empty_cache()

    for r in rows:
        if r.variant != "baseline" and r.ratio and r.deviation == 0.0:
            notes.append(
                f"{r.arch} {r.size}px {r.variant} r={r.ratio:g}: output identical to the baseline, nothing was merged"
                + (
                    " (tomesd's max_downsample=1 has no attention block on this architecture; try"
                    " --tomesd-max-downsample auto)"
                    if r.variant == "tomesd"
                    else ""
                )
            )
    wall = time.perf_counter() - started
    table = format_table(rows, opts.device)
    opts.out.mkdir(parents=True, exist_ok=True)
    report = write_report(opts, argv, rows, checks, notes, info, wall, overhead)
    (opts.out / "bench.md").write_text(report)
    payload = {
        "command": ["python", "-m", "tome_core.bench", *argv],
        "machine": info,
        "ours_config": TomeConfig.from_dict(opts.ours_fields).to_dict(),
        "rows": [r.__dict__ for r in rows],
        "merge_overhead": [r.__dict__ for r in overhead],
        "checks": [{"ok": ok, "text": text} for ok, text in checks],
        "notes": notes,
        "wall_s": wall,
    }
    (opts.out / "bench.json").write_text(json.dumps(payload, indent=2))
    write_plot(rows, opts.out / "bench.png")

    print(table)
    print()
    print(format_overhead(overhead))
    print()
    for ok, text in checks:
        print(f"{'PASS' if ok else 'FAIL'}: {text}")
    for n in notes:
        print(f"note: {n}")
    print(f"\nwrote {opts.out / 'bench.md'}, {opts.out / 'bench.json'}, {opts.out / 'bench.png'} ({wall:.1f} s)")
    return 0 if all(ok for ok, _ in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
