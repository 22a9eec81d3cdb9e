"""Command line of the benchmark: the options, the matrices of both modes, and `main` (the per-call mode; the
whole-generation mode, `--steps N`, runs `generate.main`)."""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import tome_core
from tome_bench import archs, compiled, peers, report, run
from tome_bench.options import CLOCK_NAMES, LATENT_KINDS, SCHEDULERS, Options, OverheadRow, Row, steps_at_strength
from tome_core import FieldSpec, TomeConfig, field_spec, field_specs

VARIANTS = ("baseline", "ours", "tomesd")


@dataclass(frozen=True)
class Matrix:
    """Sizes, ratios, timed runs and warm-up rounds of a run, unless --sizes, --ratios, --repeats, --warmup say
    otherwise."""

    sizes: str
    ratios: str
    repeats: int
    warmup: int

    def describe(self, generation: bool = False) -> str:
        ratios = "ratio" if "," not in self.ratios else "ratios"
        unit = "generation" if generation else "run"
        repeats = f"1 timed {unit}" if self.repeats == 1 else f"{self.repeats} timed {unit}s"
        if self.warmup == 0:
            warmup = "after one untimed 1-step baseline generation" if generation else "after one untimed baseline call"
        else:
            warmup = f"after {self.warmup} warm-up round{'s' if self.warmup > 1 else ''} of every variant"
        return f"sizes {self.sizes} px, {ratios} {self.ratios}, {repeats} {warmup}"


def _defaults(name: str) -> str:
    """'default X on cpu, Y on cuda and with --full, Z with --quick' for one field of the matrices."""
    cpu, full, quick = (getattr(m, name) for m in (DEFAULT_MATRIX, FULL_MATRIX, QUICK_MATRIX))
    return f"default {cpu} on cpu, {full} on cuda and with --full, {quick} with --quick"


#: The default on CPU: baseline, ours and tomesd side by side at 512 and 1024 px, one ratio, the median of three
#: timed runs after one untimed baseline call (about 8 minutes on 2 cores).
DEFAULT_MATRIX = Matrix(sizes="512,1024", ratios="0.5", repeats=3, warmup=0)
#: --full, and the default on CUDA: three ratios, a warm-up round of every variant, three timed runs
#: (2.8 times the UNet calls of the default: 20-25 minutes on 2 CPU cores).
FULL_MATRIX = Matrix(sizes="512,1024", ratios="0.3,0.5,0.7", repeats=3, warmup=1)
#: --quick: a smoke test of the whole pipeline.
QUICK_MATRIX = Matrix(sizes="256", ratios="0.5", repeats=1, warmup=1)
#: The GPU run: SD1.5 and SDXL at 1024 and 2048 px, ours in merge mode (the default), in kv mode and at every
#: preset, and tomesd, over the full matrix's ratios and repeats (shown by --help and docs/benchmarks.md).
GPU_COMMAND = (
    "python -m tome_bench --device cuda --dtype fp16 --arch sd15,sdxl --sizes 1024,2048 --presets all --ours kv:mode=kv"
)
#: Its whole-generation counterpart: every preset and every peer, 20 Euler steps, at the same sizes.
GPU_GEN_COMMAND = (
    "python -m tome_bench --device cuda --dtype fp16 --steps 20 --arch sd15,sdxl --sizes 1024,2048 --presets all"
    " --peers all --out bench-out/gen-gpu"
)
#: --steps N (whole generations) on any device: SD1.5 at 512 px, ratio 0.5, three timed generations per variant.
GEN_MATRIX = Matrix(sizes="512", ratios="0.5", repeats=3, warmup=0)
#: --steps N --full: 512 and 768 px, three ratios, a warm-up generation of every variant.
GEN_FULL_MATRIX = Matrix(sizes="512,768", ratios="0.3,0.5,0.7", repeats=3, warmup=1)
#: --steps N --quick: a smoke test.
GEN_QUICK_MATRIX = Matrix(sizes="256", ratios="0.5", repeats=1, warmup=0)
#: The whole-generation comparison (`make bench-gen`, docs/benchmarks.md): SD1.5 at 512 and 768 px with 10 Euler
#: steps and SDXL at 768 px with 4, every peer at its default and a faster setting, ours stacked with DeepCache,
#: ours at ratio 0.5 and at each preset.
GEN_COMMANDS = (
    "python -m tome_bench --steps 10 --arch sd15 --sizes 512,768 --peers all --presets all --out bench-out/gen-sd15",
    "python -m tome_bench --steps 4 --arch sdxl --sizes 768 --peers all --presets all --out bench-out/gen-sdxl",
)
#: Largest size (px) at which operations per merged block are counted.
OPS_SIZE = 256
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
        prog="python -m tome_bench",
        description="Time one Stable Diffusion UNet step (batch 2) unpatched, with tome_core and with tomesd."
        f" Default matrix on cpu: {DEFAULT_MATRIX.describe()} (about 8 minutes on 2 cores); on cuda, and on"
        f" cpu with --full: {FULL_MATRIX.describe()}. --sizes, --ratios, --repeats and --warmup override the matrix."
        " With --steps N: whole generations of a diffusers pipeline instead of one call, side by side with --peers;"
        f" matrix {GEN_MATRIX.describe(generation=True)} (--full: {GEN_FULL_MATRIX.describe(generation=True)};"
        f" --quick: {GEN_QUICK_MATRIX.describe(generation=True)}).",
        epilog=f"GPU run of SD1.5 and SDXL at 1024 and 2048 px, ours in merge and kv mode and at every preset, and"
        f" tomesd: {GPU_COMMAND}; whole generations: {GPU_GEN_COMMAND}."
        f" Whole-generation comparison (make bench-gen): {GEN_COMMANDS[0]}; {GEN_COMMANDS[1]}",
    )
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--dtype", choices=tuple(archs.DTYPES), default=None, help="default: fp32 on cpu, fp16 on cuda")
    p.add_argument(
        "--arch",
        default="sd15",
        metavar="ARCH[,ARCH...]",
        help="sd15 or sdxl, or a comma-separated list such as sd15,sdxl run one after the other (default sd15)",
    )
    p.add_argument("--sizes", default=None, help=f"image sizes in px, W or WxH, comma-separated ({_defaults('sizes')})")
    p.add_argument("--ratios", default=None, help=f"merge ratios, comma-separated ({_defaults('ratios')})")
    p.add_argument("--repeats", type=int, default=None, help=f"timed runs per variant ({_defaults('repeats')})")
    p.add_argument(
        "--warmup",
        type=int,
        default=None,
        help=f"untimed warm-up rounds of every variant before the timed ones ({_defaults('warmup')}); 0 still"
        " makes one untimed baseline call first",
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
        "--presets",
        default=None,
        metavar="NAME[,NAME...]|all",
        help="ours at each named preset of tome_core.presets() (variants ours:preset=NAME), in both modes; a"
        " preset fixes its own ratio, so --ratios and --set do not apply to it",
    )
    p.add_argument(
        "--tomesd-max-downsample",
        default="1",
        choices=("1", "2", "4", "8", "auto"),
        help="tomesd's max_downsample (default 1, tomesd's own default; 'auto' = the first level with attention,"
        " e.g. 2 for SDXL, where 1 merges nothing)",
    )
    p.add_argument(
        "--latents",
        default=None,
        metavar="KIND[,KIND]",
        help="start latents, the first one timed, each further one run once more per variant for its deviation:"
        " noise (white) and natural (power falling with frequency as in real latents; white noise makes every"
        " token unlike its neighbours, which overstates what merging loses). Default noise; noise,natural with"
        " --steps",
    )
    p.add_argument(
        "--clock",
        choices=CLOCK_NAMES,
        default="wall",
        help="what times a call: wall (time.perf_counter, default) or cpu (time.process_time, the CPU time of this"
        " process: on a machine shared with other processes it stays near the quiet wall time with --threads 1; with"
        " more threads it adds up their times); --device cpu only",
    )
    p.add_argument(
        "--plot",
        default=None,
        metavar="PATH.png",
        help="where the speed-up/deviation plot goes (default: next to the JSON, bench.png or gen.png in --out)",
    )
    p.add_argument(
        "--compile",
        nargs="?",
        const="default",
        default=None,
        choices=compiled.COMPILE_MODES,
        metavar="MODE",
        help="also run every variant (peers and tomesd aside) through torch.compile(unet, fullgraph=True, mode=MODE),"
        f" inductor, side by side with the eager ones: {', '.join(compiled.COMPILE_MODES)} (default 'default');"
        " compiled speed-ups are over the compiled baseline; compiling happens in a warm-up round (at least one; two"
        " in the CUDA-graph modes, whose second call records the graph)",
    )
    p.add_argument(
        "--lock",
        default=None,
        metavar="PATH",
        help="hold an exclusive lock on the file PATH from each size's first timed run to its end: several benchmark"
        " processes sharing PATH warm up and compile side by side and time one at a time (POSIX)",
    )
    p.add_argument(
        "--lock-after",
        type=int,
        default=0,
        metavar="N",
        help="with --lock: time only once N processes sharing the lock have finished their warm-ups (at most 300 s"
        " of waiting), so that none compiles on the CPU while another times",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights and inputs (default 0)")
    p.add_argument("--timestep", type=int, default=500, help="UNet timestep of the step (default 500; per-call mode)")
    gen = p.add_argument_group("whole generations")
    gen.add_argument(
        "--steps",
        type=int,
        default=None,
        help="run N sampler steps of a diffusers pipeline per variant (final latent, no VAE) instead of one UNet call",
    )
    gen.add_argument("--scheduler", choices=SCHEDULERS, default=None, help="sampler with --steps (default euler)")
    gen.add_argument("--guidance", type=float, default=None, help="classifier-free guidance with --steps (default 7)")
    gen.add_argument(
        "--strength",
        type=float,
        default=None,
        metavar="S",
        help="with --steps: 0 < S <= 1, default 1 (txt2img from the start latent as noise). Below 1 an img2img pass"
        " like the WebUI's hires fix: the start latent, at --sizes (the 2x size of a hires pass), is noised to the"
        " timestep where S of the schedule remains and only the last int(N * S) of the --steps N run (--steps 10"
        " --strength 0.5 runs 5); every variant starts from the same noised latent",
    )
    gen.add_argument(
        "--peers",
        default=None,
        metavar="NAME[,NAME...]|all",
        help=f"with --steps: alternatives from their PyPI packages (make peers), each at its documented default and"
        f" one faster setting: {', '.join(peers.PEER_NAMES)} (deepcache+ours: DeepCache stacked on ours); one that"
        " is not installed or cannot run gets a row saying why",
    )
    matrix = p.add_mutually_exclusive_group()
    matrix.add_argument(
        "--full",
        action="store_true",
        help=f"the full matrix: {FULL_MATRIX.describe()} (the default on cuda; 20-25 minutes on 2 CPU cores)",
    )
    matrix.add_argument("--quick", action="store_true", help=f"smoke test: {QUICK_MATRIX.describe()}")
    return p


def pick_matrix(full: bool, quick: bool, device: str, steps: int | None = None) -> Matrix:
    """--quick, --full, else the default of the device: the full matrix on cuda, the short one on cpu. With
    --steps the whole-generation matrices, the same on every device."""
    if steps is not None:
        return GEN_QUICK_MATRIX if quick else GEN_FULL_MATRIX if full else GEN_MATRIX
    if quick:
        return QUICK_MATRIX
    if full or device == "cuda":
        return FULL_MATRIX
    return DEFAULT_MATRIX


def _names(text: str, known: Sequence[str], option: str) -> list[str]:
    """'a,b' or 'all' -> names in the order given (no repeats), each one of `known`."""
    if text.strip() == "all":
        return list(known)
    names = list(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    if not names:
        raise ValueError(f"{option} is empty; choose from {', '.join(known)} or all")
    bad = [n for n in names if n not in known]
    if bad:
        raise ValueError(f"{option}: unknown {', '.join(map(repr, bad))}; choose from {', '.join(known)} or all")
    return names


def parse_presets(text: str | None) -> list[str]:
    """--presets: names of tome_core.presets(), or 'all'."""
    if text is None:
        return []
    return _names(text, [p.name for p in tome_core.presets()], "--presets")


def parse_strength(strength: float | None, steps: int | None) -> float:
    """--strength: 0 < S <= 1 with --steps N, running at least one of the N steps; 1 when not given."""
    if strength is None:
        return 1.0
    if steps is None:
        raise ValueError("--strength needs --steps N (whole generations); the per-call mode times one UNet call")
    if not 0.0 < strength <= 1.0:
        raise ValueError(f"--strength must be in (0, 1], got {strength:g}")
    if steps_at_strength(steps, strength) < 1:
        raise ValueError(
            f"--strength {strength:g} with --steps {steps} runs int({steps} * {strength:g}) = 0 steps; raise one of them"
        )
    return strength


def parse_options(argv: Sequence[str]) -> Options:
    parser = build_parser()
    a = parser.parse_args(argv)
    try:
        arches = [archs.get_arch(name.strip()) for name in a.arch.split(",") if name.strip()]
        if not arches:
            raise ValueError("--arch is empty")
        if a.steps is not None and a.steps < 1:
            raise ValueError(f"--steps must be at least 1, got {a.steps}")
        for given, name in ((a.scheduler, "--scheduler"), (a.guidance, "--guidance"), (a.peers, "--peers")):
            if given is not None and a.steps is None:
                raise ValueError(
                    f"{name} needs --steps N (whole generations); the per-call mode times one UNet call"
                    + (" against tomesd (--variants)" if name == "--peers" else "")
                )
        matrix = pick_matrix(a.full, a.quick, a.device, a.steps)
        sizes = _csv(a.sizes or matrix.sizes, _size, "size")
        ratios = _csv(a.ratios or matrix.ratios, _ratio, "ratio")
        repeats = a.repeats if a.repeats is not None else matrix.repeats
        warmup = a.warmup if a.warmup is not None else matrix.warmup
        if a.compile is not None:
            # Untimed: the call that compiles, and under CUDA graphs the one that records the graph.
            warmup = max(warmup, 2 if a.compile in compiled.CUDAGRAPH_MODES else 1)
        if repeats < 1:
            raise ValueError(f"--repeats must be at least 1, got {repeats}")
        variants = [v.strip() for v in a.variants.split(",") if v.strip()]
        bad = [v for v in variants if v not in VARIANTS]
        if bad:
            raise ValueError(f"--variants: unknown {', '.join(map(repr, bad))}; choose from {', '.join(VARIANTS)}")
        variants = [v for v in VARIANTS if v in variants or v == "baseline"]
        ours_fields = parse_sets(a.sets)
        extra_ours = [parse_extra_ours(item, ours_fields) for item in a.extra_ours]
        presets = parse_presets(a.presets)
        latents = _names(a.latents or ("noise,natural" if a.steps else "noise"), LATENT_KINDS, "--latents")
        peer_names = _names(a.peers, peers.PEER_NAMES, "--peers") if a.peers is not None else []
        if a.guidance is not None and a.guidance < 1.0:
            raise ValueError(f"--guidance must be at least 1 (classifier-free guidance), got {a.guidance:g}")
        if a.checkpoint and len(arches) != 1:
            raise ValueError("--checkpoint needs exactly one --arch")
        if a.checkpoint and not os.path.isfile(a.checkpoint):
            raise ValueError(f"--checkpoint {a.checkpoint!r} is not a file")
        if a.checkpoint and not a.checkpoint.endswith(".safetensors"):
            raise ValueError(
                f"--checkpoint must be a .safetensors file (pickled .ckpt is not loaded), got {a.checkpoint!r}"
            )
        if warmup < 0:
            raise ValueError(f"--warmup must be at least 0, got {warmup}")
        if a.threads is not None and a.threads < 1:
            raise ValueError(f"--threads must be at least 1, got {a.threads}")
        if a.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("--device cuda: torch.cuda.is_available() is False")
        if a.clock == "cpu" and a.device == "cuda":
            raise ValueError("--clock cpu times the CPU only; on cuda the GPU's work is not CPU time: use --clock wall")
        strength = parse_strength(a.strength, a.steps)
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
        warmup=warmup,
        checkpoint=a.checkpoint,
        out=Path(a.out),
        threads=a.threads,
        variants=variants,
        ours_fields=ours_fields,
        extra_ours=extra_ours,
        tomesd_max_downsample=a.tomesd_max_downsample,
        seed=a.seed,
        timestep=a.timestep,
        latents=latents,
        presets=presets,
        steps=a.steps,
        scheduler=a.scheduler or "euler",
        guidance=7.0 if a.guidance is None else a.guidance,
        peers=peer_names,
        clock=a.clock,
        strength=strength,
        plot=Path(a.plot) if a.plot else None,
        compile_mode=a.compile,
        lock=Path(a.lock) if a.lock else None,
        lock_after=a.lock_after,
    )


# ---------------------------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line and run the per-call benchmark, or the whole-generation one with --steps."""
    argv = list(sys.argv[1:] if argv is None else argv)
    opts = parse_options(argv)
    if opts.steps is not None:
        from tome_bench import generate  # imports diffusers' pipelines (and transformers) only when needed

        return generate.main(opts, argv)
    return main_call(opts, argv)


def main_call(opts: Options, argv: Sequence[str]) -> int:
    """The per-call mode: one UNet step per variant; writes bench.md, bench.json and bench.png."""
    from tqdm import tqdm

    started = time.perf_counter()
    if opts.threads is not None:
        torch.set_num_threads(opts.threads)
    notes: list[str] = []
    tomesd = None
    tomesd_version: str | None = None
    if "tomesd" in opts.variants:
        tomesd, msg = run.load_tomesd()
        if tomesd is None:
            print(msg, file=sys.stderr)
            notes.append(msg)
        else:
            tomesd_version = msg
    info = report.machine_info(opts, tomesd_version)
    per_ratio = ("ours" in opts.variants) + len(opts.extra_ours) + ("tomesd" in opts.variants and tomesd is not None)
    variants_per_size = 1 + len(opts.ratios) * per_ratio + len(opts.presets)
    if opts.compile_mode:  # a compiled twin of each, tomesd aside
        variants_per_size += variants_per_size - len(opts.ratios) * ("tomesd" in opts.variants and tomesd is not None)
    runs_per_size = (opts.warmup + opts.repeats + len(opts.latents) - 1) * variants_per_size
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
            # Operations per merged block, once per architecture: they depend on which blocks merge, not on the size,
            # so they are counted at the smallest size or OPS_SIZE px, whichever is smaller (calls at 1024 px cost
            # minutes on a CPU), and shown with the smallest size's rows.
            ops_size = min(opts.sizes, key=lambda s: s[0] * s[1])
            ops_at = min(ops_size, (OPS_SIZE, OPS_SIZE), key=lambda s: s[0] * s[1])
            progress.set_postfix_str(f"{spec.name} {ops_at[1]}px counting operations")
            block_ops = run.bench_ops(opts, unet, spec, ops_at, tomesd)
            if ops_at != ops_size:
                notes.append(f"{spec.name}: operations per merged block counted at {ops_at[1]}x{ops_at[0]} px")
            for size in opts.sizes:
                progress.set_postfix_str(f"{spec.name} {size[1]}px merge overhead")
                overhead += run.bench_overhead(opts, unet, spec, size, tomesd)
                size_rows = run.bench_size(opts, unet, spec, size, tomesd, checks, progress)
                if size == ops_size:
                    for r in size_rows:
                        label = r.variant if r.ratio is None else f"{r.variant} r={r.ratio:g}"
                        r.ops_per_block = block_ops.get(label)
                rows += size_rows
            del unet
            gc.collect()
            if opts.device.type == "cuda":
                torch.cuda.empty_cache()

    for r in rows:
        if not r.variant.startswith("baseline") and r.error is None and r.deviation == 0.0:
            notes.append(
                f"{r.arch} {r.size}px {r.variant}"
                + ("" if r.ratio is None else f" r={r.ratio:g}")
                + ": output identical to the baseline, nothing was merged"
                + (
                    " (tomesd's max_downsample=1 has no attention block on this architecture; try"
                    " --tomesd-max-downsample auto)"
                    if r.variant == "tomesd"
                    else ""
                )
            )
    checks += compiled.checks(rows)
    notes += report.clock_notes(opts)
    wall = time.perf_counter() - started
    table = report.format_table(rows, opts.device, opts.latents)
    warning = report.spread_line(rows)
    opts.out.mkdir(parents=True, exist_ok=True)
    markdown = report.write_report(opts, argv, rows, checks, notes, info, wall, overhead)
    paths = [opts.out / "bench.md", opts.out / "bench.json", opts.plot or opts.out / "bench.png"]
    paths[0].write_text(markdown)
    extra = {"merge_overhead": [r.__dict__ for r in overhead]}
    data = report.payload(opts, argv, info, rows, checks, notes, warning, wall, mode_keys={}, extra=extra)
    paths[1].write_text(json.dumps(data, indent=2))
    report.write_plot(rows, paths[2], latents=opts.latents)

    print(table)
    if warning:
        print(warning)
    if any(r.ops_per_block for r in rows):
        print()
        print(report.format_ops(rows))
    print()
    print(report.format_overhead(overhead))
    print()
    report.print_checks_and_notes(checks, notes)
    print(f"\nwrote {', '.join(map(str, paths))} ({wall:.1f} s)")
    return 0 if all(ok for ok, _ in checks) else 1
