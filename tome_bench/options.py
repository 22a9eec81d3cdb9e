"""What the jobs share: the options every job picks from (one definition each), the parsed `Options` of the jobs
that time variants (main, compare, peers, images), the result rows and the timing-spread rule.

It imports no other module of the lab but `archs`, which keeps the package free of import cycles.
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import tome_core
from tome_bench import archs
from tome_bench.archs import Arch
from tome_core import FieldSpec, TomeConfig, field_spec, field_specs

#: Above this spread ((max - min) / median of a variant's timed runs) a report warns that the machine was too busy to
#: trust the speed-ups: a quiet machine keeps it within a few percent.
SPREAD_LIMIT = 0.10
#: Start latents: white noise (what a sampler starts from) and a field with a natural image's power spectrum.
LATENT_KINDS = ("noise", "natural")
SCHEDULERS = ("euler", "dpm++2m")
CLOCK_NAMES = ("wall", "cpu")
#: Variant name of ours at a preset of `tome_core.presets()`: PRESET_PREFIX + the preset's name.
PRESET_PREFIX = "ours:preset="
VARIANTS = ("baseline", "ours", "tomesd")
_TRUE, _FALSE = {"true", "1", "yes", "on"}, {"false", "0", "no", "off"}


@dataclass
class Options:
    """The parsed command line of a job that times variants side by side (`build`)."""

    job: str
    device: torch.device
    dtype: torch.dtype
    dtype_name: str
    arches: list[Arch]
    #: Sizes (height, width) per architecture name.
    arch_sizes: dict[str, list[tuple[int, int]]]
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
    #: Start latents, the first one timed, each further one run once more per variant for its deviation.
    latents: list[str]
    presets: list[str]
    clock: str = "wall"
    plot: Path | None = None
    #: Whole generations: sampler steps, sampler, guidance, peers and the img2img strength (1: txt2img).
    steps: int | None = None
    scheduler: str = "euler"
    guidance: float = 7.0
    peers: list[str] = field(default_factory=list)
    strength: float = 1.0
    #: Why the device is what it is when no --device was given (the main job on a machine with CUDA).
    device_note: str | None = None
    prompt: str = ""
    gpu: str = "h200"
    timestep: int = 500

    @property
    def main_job(self) -> bool:
        return self.job == "main"

    @property
    def mode(self) -> str:
        return "call" if self.steps is None else "generate"

    def sizes_of(self, arch: str) -> list[tuple[int, int]]:
        return self.arch_sizes[arch]

    @property
    def sizes(self) -> list[tuple[int, int]]:
        return list(dict.fromkeys(s for sizes in self.arch_sizes.values() for s in sizes))

    @property
    def steps_run(self) -> int | None:
        """Sampler steps one generation runs: int(steps * strength) as diffusers' img2img counts them."""
        return None if self.steps is None else steps_at_strength(self.steps, self.strength)


@dataclass
class Row:
    """One variant at one architecture and size: the JSON row and a line of the table. `deviation` is ||out - base||
    / ||base|| on the first start latent; `deviations` and `psnr_db` per start latent; `spread` of `times_s`."""

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
    spread: float | None = None
    deviations: dict[str, float] = field(default_factory=dict)
    psnr_db: dict[str, float | None] = field(default_factory=dict)
    #: What the variant runs, in its own package's terms (peers: their arguments).
    setting: str | None = None

    @property
    def label(self) -> str:
        return self.variant if self.ratio is None else f"{self.variant} r={self.ratio:g}"


def steps_at_strength(steps: int, strength: float) -> int:
    """The last steps of an N-step schedule a pass at `strength` runs: min(int(N * strength), N), as diffusers'
    img2img pipelines count them (`get_timesteps`)."""
    return min(int(steps * strength), steps)


def spread(times: Sequence[float]) -> float | None:
    """(max - min) / median of timed runs; None with fewer than two runs (nothing to compare)."""
    if len(times) < 2:
        return None
    med = statistics.median(times)
    return (max(times) - min(times)) / med if med > 0 else None


def spread_warning(rows: Sequence[Row], limit: float = SPREAD_LIMIT) -> str | None:
    """One line when any variant's timed runs spread by more than `limit`, naming the worst; else None."""
    spread_rows = [r for r in rows if r.spread is not None and r.spread > limit]
    if not spread_rows:
        return None
    worst = max(spread_rows, key=lambda r: r.spread or 0.0)
    times = ", ".join(f"{t:.3g}" for t in worst.times_s)
    return (
        f"warning: the machine was too busy to trust these timings: {len(spread_rows)} variant(s) spread by more"
        f" than {limit:.0%} over their timed runs (worst: {worst.arch} {worst.size}px {worst.label}, {worst.spread:.0%}:"
        f" {times} s); compare speed-ups only from a run on a quiet machine"
    )


# ---------------------------------------------------------------------------------------------- parsing values


def parse_field_value(spec: FieldSpec, text: str) -> Any:
    """The text of `--set NAME=VALUE` for one TomeConfig field, by its kind and choices; ValueError naming the field
    and its allowed values (ranges are TomeConfig's to check)."""
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
            if raw.lower() in _TRUE | _FALSE:
                return raw.lower() in _TRUE
            raise ValueError
        return spec.kind(raw) if spec.kind in (int, float) else raw
    except ValueError:
        raise ValueError(f"--set {spec.name}: must be {spec.allowed()}, got {text!r}") from None


def parse_sets(items: Sequence[str]) -> dict[str, Any]:
    """`["mode=kv", "sx=4"]` -> {"mode": "kv", "sx": 4}, validated as a whole by TomeConfig (ratio is --ratios')."""
    known = [s.name for s in field_specs() if s.name != "ratio"]
    values: dict[str, Any] = {}
    for item in items:
        name, sep, text = (part.strip() for part in item.partition("="))
        if not sep:
            raise ValueError(f"--set expects NAME=VALUE, got {item!r}; fields: {', '.join(known)}")
        if name == "ratio":
            raise ValueError("--set ratio: use --ratios instead")
        try:
            spec = field_spec(name)
        except KeyError:
            raise ValueError(f"--set: unknown field {name!r}; fields: {', '.join(known)}") from None
        values[name] = parse_field_value(spec, text)
    TomeConfig.from_dict(values)  # range and cross-field checks, errors name the field
    return values


def parse_extra_ours(item: str, base: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """`"kv:mode=kv,sx=4"` -> ("ours:kv", {**base, "mode": "kv", "sx": 4}), validated by TomeConfig."""
    name, sep, body = (part.strip() for part in item.partition(":"))
    if not sep or not name or not name.replace("-", "").replace("_", "").isalnum():
        raise ValueError(f"--ours expects NAME:FIELD=VALUE[,FIELD=VALUE...] with a simple NAME, got {item!r}")
    merged = {**base, **parse_sets([part for part in body.split(",") if part.strip()])}
    TomeConfig.from_dict(merged)
    return f"ours:{name}", merged


def parse_size(text: str) -> tuple[int, int]:
    """'512' -> (512, 512); '768x512' (width x height) -> (height, width) = (512, 768)."""
    w, _, h = text.strip().lower().partition("x")
    width = int(w)
    height = int(h) if h else width
    if width <= 0 or height <= 0 or width % archs.VAE_SCALE or height % archs.VAE_SCALE:
        raise ValueError(f"sizes must be positive multiples of {archs.VAE_SCALE} px, got {text!r}")
    return height, width


def parse_sizes(
    text: str | None, names: Sequence[str], defaults: Mapping[str, str]
) -> dict[str, list[tuple[int, int]]]:
    """--sizes -> sizes per architecture: 'W[xH]' items for all of them, 'ARCH:W[xH]' for one; an architecture that
    --sizes does not reach keeps its default."""
    per_arch = {name: [parse_size(s) for s in defaults[name].split(",")] for name in names}
    if text is None:
        return per_arch
    plain: list[tuple[int, int]] = []
    named: dict[str, list[tuple[int, int]]] = {}
    for part in (item.strip() for item in text.split(",") if item.strip()):
        name, sep, size = part.rpartition(":")
        if sep and name not in names:
            raise ValueError(f"--sizes {part!r}: {name!r} is not one of --arch ({', '.join(names)})")
        target = named.setdefault(name, []) if sep else plain
        if parse_size(size) not in target:
            target.append(parse_size(size))
    if not plain and not named:
        raise ValueError("empty size list")
    return {name: named.get(name) or plain or per_arch[name] for name in names}


def names(text: str, known: Sequence[str], option: str) -> list[str]:
    """'a,b' or 'all' -> names in the order given (no repeats), each one of `known`."""
    if text.strip() == "all":
        return list(known)
    got = list(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    bad = [n for n in got if n not in known]
    if not got or bad:
        raise ValueError(
            f"{option}: unknown {', '.join(map(repr, bad)) or 'empty list'}; choose from {', '.join(known)} or all"
        )
    return got


def preset_names() -> list[str]:
    return [p.name for p in tome_core.presets()]


def _ratio(text: str) -> float:
    spec = field_spec("ratio")
    if not spec.minimum <= float(text) <= spec.maximum:
        raise ValueError(f"ratio must be {spec.allowed()}, got {text}")
    return float(text)


# ---------------------------------------------------------------------------------------------- the options


#: Every option a job may take, defined once: name -> (help, argparse keywords); the flag is --name. A job's own
#: default is added to the help by `add`.
_APPEND, _MDS = {"action": "append", "default": []}, ("1", "2", "4", "8", "auto")
OPTIONS: dict[str, tuple[str, dict[str, Any]]] = {
    "arch": ("architectures, comma-separated, run one after the other", {"metavar": "ARCH[,ARCH...]"}),
    "sizes": ("sizes in px, W or WxH, comma-separated; ARCH:W[xH] for one architecture", {}),
    "presets": ("presets of tome_core.presets() as variants ours:preset=NAME", {"metavar": "NAME[,NAME...]|all"}),
    "repeats": ("timed runs per variant", {"type": int}),
    "warmup": ("untimed warm-up rounds of every variant (0: one untimed baseline run)", {"type": int}),
    "latents": ("start latents, the first timed: noise, natural (1/f^2 spectrum)", {"metavar": "KIND[,KIND]"}),
    "device": ("where it runs", {"choices": ("cpu", "cuda")}),
    "dtype": ("default fp32 on cpu, fp16 on cuda", {"choices": tuple(archs.DTYPES)}),
    "threads": ("torch CPU threads (default: torch's choice)", {"type": int}),
    "clock": ("wall, or cpu: this process's CPU time (use --threads 1)", {"choices": CLOCK_NAMES, "default": "wall"}),
    "out": ("output folder", {"type": Path}),
    "plot": ("where the speed-up/deviation plot goes (default: next to the JSON)", {"type": Path}),
    "seed": ("seed of the random weights and inputs", {"type": int, "default": 0}),
    "checkpoint": ("real weights: a .safetensors file (diffusers or single-file SD)", {}),
    "ratios": ("ratios of ours and tomesd, comma-separated (default 0.5)", {}),
    "variants": (f"a subset of {','.join(VARIANTS)} (the baseline always runs)", {}),
    "set": ("a TomeConfig field of ours (repeatable), e.g. mode=kv", {"dest": "sets", **_APPEND}),
    "ours": ("another configuration of ours (repeatable): NAME:FIELD=VALUE[,...]", {"dest": "extra_ours", **_APPEND}),
    "tomesd-max-downsample": ("tomesd's (auto: its first level with attention)", {"default": "1", "choices": _MDS}),
    "quick": ("smoke test: 256 px, one timed run", {"action": "store_true"}),
    "gpu": ("the GPU the estimate prices calls on (default h200)", {"default": "h200"}),
}


def add(parser: argparse.ArgumentParser, *keys: str, defaults: Mapping[str, Any] = {}) -> argparse.ArgumentParser:
    """Add the shared options `keys` to `parser`, each help ending with the job's default from `defaults`."""
    for key in keys:
        text, kwargs = OPTIONS[key]
        text += f" (default {defaults[key]})" if key in defaults else ""
        parser.add_argument(f"--{key}", help=text, **kwargs)
    return parser


@dataclass(frozen=True)
class Defaults:
    """What a job runs unless its options say otherwise."""

    sizes: Mapping[str, str] | str  # per architecture, or the same for every one
    repeats: int
    warmup: int = 0
    latents: str = "noise"
    variants: str = ",".join(VARIANTS)
    presets: str | None = None
    arches: str = "sd15"
    out: str = "bench-out"


def build(job: str, a: argparse.Namespace, defaults: Defaults, device: str | None = None) -> Options:
    """The Options of a parsed command line; ValueError naming the option that is wrong."""
    get = lambda name, value=None: getattr(a, name, value)
    device = get("device") or device or "cpu"
    arches = [archs.get_arch(n.strip()) for n in (get("arch") or defaults.arches).split(",") if n.strip()]
    if not arches:
        raise ValueError("--arch is empty")
    sizes = defaults.sizes
    known = {s.name: sizes if isinstance(sizes, str) else sizes.get(s.name, str(s.native_size)) for s in arches}
    arch_sizes = parse_sizes(get("sizes"), [s.name for s in arches], known)
    variants = names(get("variants") or defaults.variants, VARIANTS, "--variants")
    ours_fields = parse_sets(get("sets", []))
    repeats = defaults.repeats if get("repeats") is None else a.repeats
    warmup = defaults.warmup if get("warmup") is None else a.warmup
    checkpoint = get("checkpoint")
    for value, name, least in ((repeats, "--repeats", 1), (warmup, "--warmup", 0), (get("threads"), "--threads", 1)):
        if value is not None and value < least:
            raise ValueError(f"{name} must be at least {least}, got {value}")
    if checkpoint and (len(arches) != 1 or not os.path.isfile(checkpoint) or not checkpoint.endswith(".safetensors")):
        raise ValueError(f"--checkpoint needs one --arch and a .safetensors file, got {checkpoint!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: torch.cuda.is_available() is False")
    if get("clock") == "cpu" and device == "cuda":
        raise ValueError("--clock cpu times the CPU only; on cuda the GPU's work is not CPU time: use --clock wall")
    dtype_name = get("dtype") or ("fp16" if device == "cuda" else "fp32")
    presets = get("presets") or defaults.presets
    opts = Options(
        job=job, device=torch.device(device), dtype=archs.as_dtype(dtype_name), dtype_name=dtype_name, arches=arches,
        arch_sizes=arch_sizes, ratios=[], repeats=repeats, warmup=warmup, checkpoint=checkpoint, threads=get("threads"),
        out=get("out") or Path(defaults.out), variants=[v for v in VARIANTS if v in variants or v == "baseline"],
        ours_fields=ours_fields, extra_ours=[], tomesd_max_downsample=get("tomesd_max_downsample", "1"),
        seed=get("seed", 0), latents=names(get("latents") or defaults.latents, LATENT_KINDS, "--latents"),
        presets=names(presets, preset_names(), "--presets") if presets else [], clock=get("clock", "wall"),
        plot=get("plot"), gpu=get("gpu", "h200"),
    )  # fmt: skip
    opts.ratios = [_ratio(r) for r in (get("ratios") or "0.5").split(",") if r.strip()]
    opts.extra_ours = [parse_extra_ours(item, ours_fields) for item in get("extra_ours", [])]
    return opts


def parse(parser: argparse.ArgumentParser, argv: Sequence[str], make: Callable[[argparse.Namespace], Any]) -> Any:
    """`make(parser.parse_args(argv))`, a ValueError turned into the parser's usage error (exit status 2)."""
    a = parser.parse_args(argv)
    try:
        return make(a)
    except (ValueError, TypeError) as exc:
        parser.error(str(exc))
