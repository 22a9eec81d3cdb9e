"""Command line of the benchmark: the options, the main job and the matrices of both modes, and `main` (the
per-call mode; the whole-generation mode, `--steps N`, runs `generate.main`; `--images`, `images.main`;
`--gpu-estimate` prints the GPU estimate alone; `--gpu-job` hands the rest of the line to `gpu_job.main`)."""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import tome_core
from tome_bench import archs, compiled, gpu_estimate, gpu_table, peers, report, run
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


@dataclass(frozen=True)
class MainJob:
    """The main job's sizes per architecture and timed runs on one kind of device (see `MAIN_JOB`)."""

    sizes: Mapping[str, str]
    repeats: int

    def describe(self) -> str:
        """'SD1.5 at 512 px and SDXL at 640 px, 3 timed runs'."""
        parts = [
            f"{archs.get_arch(name).label} at {sizes.replace(',', ' and ')} px" for name, sizes in self.sizes.items()
        ]
        return f"{' and '.join(parts)}, {self.repeats} timed runs"


#: The main job, `python -m tome_bench` (`make bench`) with no option that picks variants or a matrix
#: (`COMPARISON_OPTIONS`): SD1.5 and SDXL with random weights, the unpatched UNet, every preset of
#: `tome_core.presets()` and tomesd at its defaults (ratio 0.5, max_downsample 1: on SDXL it merges nothing and is
#: not timed), one UNet call (batch 2) per variant and round: an untimed round on the natural start latent (its
#: deviation, and every variant's first call), then four timed rounds on white noise; the GPU estimate beside it.
#: On a CPU SD1.5 at 512 px and SDXL at 640 px: about 20 minutes on 2
#: cores (a quiet round took 33 s and 77 s: docs/benchmarks.md).
MAIN_JOB = MainJob(sizes={"sd15": "512", "sdxl": "640"}, repeats=4)
#: The main job on CUDA (fp16): the sizes people generate at on a GPU, the ones the estimate covers, and more timed
#: rounds, as a GPU call takes milliseconds and varies more from call to call.
MAIN_JOB_CUDA = MainJob(sizes={"sd15": "512,1024", "sdxl": "1024"}, repeats=20)
#: The main job's start latents (noise timed, natural first and untimed), variants beside the presets, and ratio
#: (tomesd's default).
MAIN_LATENTS = "noise,natural"
MAIN_VARIANTS = ("baseline", "tomesd")
MAIN_RATIOS = "0.5"
#: Options that pick variants or a matrix: with any of them a run is the comparison they describe (the rest from
#: `COMPARE_MATRIX`, or `FULL_MATRIX` on cuda), not the main job.
COMPARISON_OPTIONS = (
    "--compare",
    "--full",
    "--quick",
    "--ratios",
    "--variants",
    "--set",
    "--ours",
    "--steps",
    "--images",
)


def _defaults(name: str) -> str:
    """'default X in the main job, Y with --compare, ...' for one field of the matrices."""
    compare, full, quick = (getattr(m, name) for m in (COMPARE_MATRIX, FULL_MATRIX, QUICK_MATRIX))
    main = {
        "sizes": f"{_sizes_text(MAIN_JOB)} (cuda: {_sizes_text(MAIN_JOB_CUDA)})",
        "ratios": f"{MAIN_RATIOS} for tomesd",
        "repeats": f"{MAIN_JOB.repeats} (cuda: {MAIN_JOB_CUDA.repeats})",
        "warmup": "0",
    }[name]
    return (
        f"default {main} in the main job; with an option that picks variants {compare} on cpu (as --compare),"
        f" {full} on cuda and with --full, {quick} with --quick"
    )


def _sizes_text(job: MainJob) -> str:
    """'sd15:512,sdxl:640', as --sizes takes it."""
    return ",".join(f"{name}:{size}" for name, sizes in job.sizes.items() for size in sizes.split(","))


#: --compare, and any run with an option that picks variants on CPU: baseline, ours and tomesd side by side at 512
#: and 1024 px, one ratio, the median of three timed runs after one untimed baseline call (the default before the
#: main job; about 8 minutes on 2 idle cores).
COMPARE_MATRIX = Matrix(sizes="512,1024", ratios="0.5", repeats=3, warmup=0)
#: --full, and the comparison's matrix on CUDA: three ratios, a warm-up round of every variant, three timed runs
#: (2.8 times the UNet calls of --compare: 20-25 minutes on 2 CPU cores).
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
#: --images: sampler steps and the prompt, unless --steps and --prompt say otherwise; the size is the
#: architecture's native one (SD1.5 512 px, SDXL 1024 px) unless --sizes says otherwise.
IMAGE_STEPS = 20
IMAGE_PROMPT = "a lighthouse on a rocky coast at sunset, waves, detailed photograph"
#: Options the image grid does not take (it runs the unpatched model and the presets, one whole generation each).
NOT_WITH_IMAGES = ("--ratios", "--variants", "--set", "--ours", "--peers", "--strength", "--compile", "--latents")
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
        f" Without an option that picks variants or a matrix ({', '.join(COMPARISON_OPTIONS)}) it runs the main"
        " job (make bench): SD1.5 and SDXL with random weights, the unpatched UNet, every preset of"
        " tome_core.presets() and tomesd at its defaults, speed-up and deviation (an untimed round on the natural"
        " start latent first, then the timed rounds on noise), the results table, the plot and the GPU estimate"
        f" beside them, into --out. On cpu: {MAIN_JOB.describe()} of every variant, about 20 minutes on 2 cores;"
        f" on a machine with CUDA it runs there in fp16 (--device cpu: on the CPU): {MAIN_JOB_CUDA.describe()}."
        " --arch, --sizes (ARCH:SIZE for one architecture), --presets, --repeats, --latents, --device adjust it."
        f" With an option that picks variants: cpu matrix (--compare) {COMPARE_MATRIX.describe()} (about 8"
        f" minutes on 2 cores); on cuda, and on cpu with --full: {FULL_MATRIX.describe()}. --sizes, --ratios,"
        " --repeats and --warmup override the matrix."
        " With --steps N: whole generations of a diffusers pipeline instead of one call, side by side with --peers;"
        f" matrix {GEN_MATRIX.describe(generation=True)} (--full: {GEN_FULL_MATRIX.describe(generation=True)};"
        f" --quick: {GEN_QUICK_MATRIX.describe(generation=True)}).",
        epilog=f"GPU run of SD1.5 and SDXL at 1024 and 2048 px, ours in merge and kv mode and at every preset, and"
        f" tomesd: {GPU_COMMAND}; whole generations: {GPU_GEN_COMMAND}."
        f" Whole-generation comparison (make bench-gen): {GEN_COMMANDS[0]}; {GEN_COMMANDS[1]}",
    )
    p.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default=None,
        help="default: cuda in the main job where torch.cuda.is_available() (and --clock is not cpu), else cpu",
    )
    p.add_argument("--dtype", choices=tuple(archs.DTYPES), default=None, help="default: fp32 on cpu, fp16 on cuda")
    p.add_argument(
        "--arch",
        default=None,
        metavar="ARCH[,ARCH...]",
        help="sd15 or sdxl, or a comma-separated list such as sd15,sdxl run one after the other (default sd15,sdxl in"
        " the main job, sd15 with an option that picks variants)",
    )
    p.add_argument(
        "--sizes",
        default=None,
        help="image sizes in px, W or WxH, comma-separated; ARCH:W[xH] for one architecture only, e.g."
        f" sd15:768,sdxl:1024 ({_defaults('sizes')})",
    )
    p.add_argument("--ratios", default=None, help=f"merge ratios, comma-separated ({_defaults('ratios')})")
    p.add_argument("--repeats", type=int, default=None, help=f"timed runs per variant ({_defaults('repeats')})")
    p.add_argument(
        "--warmup",
        type=int,
        default=None,
        help=f"untimed warm-up rounds of every variant before the timed ones ({_defaults('warmup')}); 0 still"
        " makes one untimed baseline call first (in the main job, with a second start latent: its untimed round)",
    )
    p.add_argument(
        "--checkpoint",
        default=None,
        help="real UNet weights: .safetensors, diffusers or single-file SD (with --images: a single-file SD1.x or SDXL"
        " checkpoint, whose UNet, VAE and text encoders are used)",
    )
    p.add_argument("--out", default="bench-out", help="output folder (default bench-out/)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument(
        "--variants",
        default=None,
        help="comma-separated subset of baseline,ours,tomesd (the baseline always runs: it is the reference; default"
        f" all three, in the main job {','.join(MAIN_VARIANTS)} beside the presets)",
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
        " preset fixes its own ratio, so --ratios and --set do not apply to it (default: all in the main job and"
        " with --gpu-estimate, none otherwise)",
    )
    p.add_argument(
        "--gpu-estimate",
        action="store_true",
        help="print only the GPU estimate (what each preset and tomesd are expected to gain per UNet call on a GPU,"
        " traced on the meta device and priced by tome_bench.gpu_estimate's cost model; no UNet is built or timed,"
        " about a minute): SD1.5 at 512, 768 and 1024 px and SDXL at 1024 px unless --arch/--sizes say otherwise",
    )
    p.add_argument(
        "--gpu",
        choices=tuple(gpu_estimate.GPUS),
        default="h200",
        help="the GPU the estimate prices the calls on (default h200)",
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
    p.add_argument("--prompt", default=None, help=f"with --images: the prompt (default {IMAGE_PROMPT!r})")
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
        help=f"the full matrix: {FULL_MATRIX.describe()} (the comparison's default on cuda; 20-25 minutes on 2 CPU"
        " cores)",
    )
    matrix.add_argument("--quick", action="store_true", help=f"smoke test: {QUICK_MATRIX.describe()}")
    matrix.add_argument(
        "--images",
        action="store_true",
        help="with --checkpoint FILE: one prompt and seed (--prompt, --seed) through your checkpoint, unpatched and at"
        f" each preset (--presets), {IMAGE_STEPS} Euler steps (--steps, --scheduler, --guidance) at the architecture's"
        " native size (--sizes), decoded by the checkpoint's VAE into OUT/images.png: a labelled grid with the speed"
        " (sampler time, unpatched over patched, side by side in this process), the PSNR against the unpatched image,"
        " the high-frequency energy kept (as ToDo measures it) and the latent change under each image; the numbers"
        " in OUT/images.json and images.md. The prompt is encoded by the checkpoint's text encoders when CLIP's"
        " tokenizer is in the local Hugging Face cache (nothing is downloaded), else seeded text states stand in and"
        " the grid says so. --arch defaults to the checkpoint's (SD1.5 or SDXL); on cuda where available",
    )
    matrix.add_argument(
        "--compare",
        action="store_true",
        help=f"ours (ratio 0.5) beside tomesd on SD1.5, the default before the main job: {COMPARE_MATRIX.describe()}",
    )
    return p


def pick_matrix(full: bool, quick: bool, device: str, steps: int | None = None) -> Matrix:
    """The comparison's matrix: --quick, --full, else the default of the device: the full matrix on cuda, the
    short one (--compare) on cpu. With --steps the whole-generation matrices, the same on every device."""
    if steps is not None:
        return GEN_QUICK_MATRIX if quick else GEN_FULL_MATRIX if full else GEN_MATRIX
    if quick:
        return QUICK_MATRIX
    if full or device == "cuda":
        return FULL_MATRIX
    return COMPARE_MATRIX


def is_comparison(a: argparse.Namespace) -> bool:
    """Whether an option of `COMPARISON_OPTIONS` was given: the run is the comparison it picks, not the main job."""
    return bool(
        a.compare
        or a.full
        or a.quick
        or a.ratios is not None
        or a.variants is not None
        or a.sets
        or a.extra_ours
        or a.steps is not None
        or a.images
    )


def parse_sizes(
    text: str | None, arch_names: Sequence[str], defaults: Mapping[str, str]
) -> dict[str, list[tuple[int, int]]]:
    """--sizes -> the sizes (height, width) of every architecture: 'W[xH]' items for all of them, 'ARCH:W[xH]' for
    one (its own items replace the others for it); an architecture that --sizes does not reach keeps its default
    from `defaults`."""
    per_arch = {name: _csv(defaults[name], _size, "size") for name in arch_names}
    if text is None:
        return per_arch
    plain: list[tuple[int, int]] = []
    named: dict[str, list[tuple[int, int]]] = {}
    for part in (item.strip() for item in text.split(",")):
        if not part:
            continue
        name, sep, size = part.rpartition(":")
        if sep and name not in arch_names:
            raise ValueError(f"--sizes {part!r}: {name!r} is not one of --arch ({', '.join(arch_names)})")
        try:
            parsed = _size(size)
        except ValueError as exc:
            raise ValueError(f"bad size list {text!r}: {exc}") from None
        target = named.setdefault(name, []) if sep else plain
        if parsed not in target:
            target.append(parsed)
    if not plain and not named:
        raise ValueError("empty size list")
    for name in arch_names:
        per_arch[name] = named.get(name) or plain or per_arch[name]
    return per_arch


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
    comparison = is_comparison(a)
    main_job = not comparison and not a.gpu_estimate
    device, device_note = a.device, None
    if device is None:
        # The main job runs where a user's images are made; a comparison stays on the device it is told (the
        # tests' in-process runs among them), and --clock cpu times the CPU only.
        device = "cuda" if (main_job or a.images) and a.clock != "cpu" and torch.cuda.is_available() else "cpu"
        if device == "cuda":
            device_note = "CUDA is available: the main job runs on the GPU in fp16 (--device cpu times the CPU instead)"
    try:
        if a.images:
            a.arch, a.steps, a.presets = _images_defaults(a)
        if a.gpu_estimate and comparison:
            raise ValueError(
                "--gpu-estimate estimates the presets and tomesd; it takes --arch, --sizes, --presets, --gpu and"
                f" --tomesd-max-downsample, not {', '.join(COMPARISON_OPTIONS)}"
            )
        arch_text = a.arch or ("sd15" if comparison else ",".join(MAIN_JOB.sizes))
        arches = [archs.get_arch(name.strip()) for name in arch_text.split(",") if name.strip()]
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
        names = [spec.name for spec in arches]
        if a.images:
            size_defaults = {spec.name: str(spec.native_size) for spec in arches}
            ratios_text, default_repeats, default_warmup = MAIN_RATIOS, 1, 0
        elif comparison:
            matrix = pick_matrix(a.full, a.quick, device, a.steps)
            size_defaults = {name: matrix.sizes for name in names}
            ratios_text, default_repeats, default_warmup = matrix.ratios, matrix.repeats, matrix.warmup
        else:
            job = MAIN_JOB_CUDA if device == "cuda" else MAIN_JOB
            size_defaults = {spec.name: job.sizes.get(spec.name, str(spec.native_size)) for spec in arches}
            ratios_text, default_repeats, default_warmup = MAIN_RATIOS, job.repeats, 0
        arch_sizes = parse_sizes(a.sizes, names, size_defaults)
        sizes = list(dict.fromkeys(size for name in names for size in arch_sizes[name]))
        if a.images and len(sizes) > 1:
            raise ValueError(f"--images makes one grid at one size, got --sizes {a.sizes}")
        ratios = _csv(a.ratios or ratios_text, _ratio, "ratio")
        repeats = a.repeats if a.repeats is not None else default_repeats
        warmup = a.warmup if a.warmup is not None else default_warmup
        if a.compile is not None:
            # Untimed: the call that compiles, and under CUDA graphs the one that records the graph.
            warmup = max(warmup, 2 if a.compile in compiled.CUDAGRAPH_MODES else 1)
        if repeats < 1:
            raise ValueError(f"--repeats must be at least 1, got {repeats}")
        variants_text = a.variants or (",".join(VARIANTS) if comparison else ",".join(MAIN_VARIANTS))
        variants = [v.strip() for v in variants_text.split(",") if v.strip()]
        bad = [v for v in variants if v not in VARIANTS]
        if bad:
            raise ValueError(f"--variants: unknown {', '.join(map(repr, bad))}; choose from {', '.join(VARIANTS)}")
        variants = [v for v in VARIANTS if v in variants or v == "baseline"]
        ours_fields = parse_sets(a.sets)
        extra_ours = [parse_extra_ours(item, ours_fields) for item in a.extra_ours]
        presets = parse_presets(a.presets or (None if comparison else "all"))
        default_latents = "noise,natural" if a.steps else "noise" if comparison else MAIN_LATENTS
        latents = _names(a.latents or default_latents, LATENT_KINDS, "--latents")
        estimate_sizes: dict[str, list[int]] = {}
        if a.gpu_estimate:
            # The grid, or the square sizes asked for: the estimate traces square images.
            for name in names:
                asked = arch_sizes[name] if a.sizes is not None else []
                if any(h != w for h, w in asked):
                    raise ValueError(f"--gpu-estimate takes square sizes (W, not WxH), got {a.sizes!r}")
                estimate_sizes[name] = [h for h, _ in asked] or gpu_table.estimate_sizes([name], arch_sizes)[name]
        elif main_job:
            estimate_sizes = gpu_table.estimate_sizes(names, arch_sizes)
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
        if device == "cuda" and not torch.cuda.is_available():
            raise ValueError("--device cuda: torch.cuda.is_available() is False")
        if a.clock == "cpu" and device == "cuda":
            raise ValueError("--clock cpu times the CPU only; on cuda the GPU's work is not CPU time: use --clock wall")
        strength = parse_strength(a.strength, a.steps)
    except (ValueError, TypeError, argparse.ArgumentTypeError) as exc:
        parser.error(str(exc))
    dtype_name = a.dtype or ("fp16" if device == "cuda" else "fp32")
    return Options(
        device=torch.device(device),
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
        arch_sizes=arch_sizes,
        main_job=main_job,
        estimate_sizes=estimate_sizes,
        gpu=a.gpu,
        estimate_only=a.gpu_estimate,
        device_note=device_note,
        images=a.images,
        prompt=IMAGE_PROMPT if a.prompt is None else a.prompt,
    )


def _images_defaults(a: argparse.Namespace) -> tuple[str, int, str]:
    """--images: (arch, steps, presets) with their defaults, after checking what it needs and what it does not take."""
    given = {
        "--ratios": a.ratios is not None,
        "--variants": a.variants is not None,
        "--set": bool(a.sets),
        "--ours": bool(a.extra_ours),
        "--peers": a.peers is not None,
        "--strength": a.strength is not None,
        "--compile": a.compile is not None,
        "--latents": a.latents is not None,
    }
    refused = [name for name in NOT_WITH_IMAGES if given[name]]
    if refused:
        raise ValueError(f"--images runs the unpatched model and the presets; it does not take {', '.join(refused)}")
    if not a.checkpoint:
        raise ValueError("--images needs --checkpoint FILE: your single-file SD1.5 or SDXL .safetensors")
    if not os.path.isfile(a.checkpoint) or not a.checkpoint.endswith(".safetensors"):
        raise ValueError(f"--checkpoint must be a .safetensors file, got {a.checkpoint!r}")
    arch = a.arch or archs.checkpoint_arch(a.checkpoint)
    return arch, IMAGE_STEPS if a.steps is None else a.steps, a.presets or "all"


# ---------------------------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line and run the per-call benchmark (the main job by default), the whole-generation one
    with --steps, or only the GPU estimate with --gpu-estimate."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--gpu-job" in argv:
        from tome_bench import gpu_job

        return gpu_job.main([a for a in argv if a != "--gpu-job"])
    if "--fidelity" in argv:
        from tome_bench import fidelity

        return fidelity.main([a for a in argv if a != "--fidelity"])
    opts = parse_options(argv)
    if opts.images:
        from tome_bench import images

        return images.main(opts, argv)
    if opts.steps is not None:
        from tome_bench import generate  # imports diffusers' pipelines (and transformers) only when needed

        return generate.main(opts, argv)
    if opts.estimate_only:
        return main_estimate(opts)
    return main_call(opts, argv)


def _load_tomesd(opts: Options, notes: list[str]) -> tuple[Any | None, str | None]:
    """(tomesd, its version) when the run has a tomesd variant and it is installed; else (None, None) and a note."""
    if "tomesd" not in opts.variants:
        return None, None
    tomesd, msg = run.load_tomesd()
    if tomesd is None:
        print(msg, file=sys.stderr)
        notes.append(msg)
        return None, None
    return tomesd, msg


def _idle_tomesd(opts: Options, unet: torch.nn.Module, tomesd: Any | None) -> str | None:
    """The label of the tomesd variant the main job and the estimate leave out on `unet` (it merges nothing)."""
    if tomesd is None or not (opts.main_job or opts.estimate_only) or not run.tomesd_merges_nothing(opts, unet):
        return None
    return ", ".join(f"tomesd r={r:g}" for r in opts.ratios)


def _idle_note(arch: str, opts: Options) -> str:
    return (
        f"{arch}: tomesd at max_downsample={opts.tomesd_max_downsample} merges nothing on this architecture (no"
        " attention block at that level; SDXL has none at full resolution): its output would be the baseline's, so"
        " it is not timed or estimated (--tomesd-max-downsample auto runs it at the first level with attention)"
    )


def _run_estimate(opts: Options, tomesd: Any | None) -> tuple[list[gpu_estimate.EstimateRow], list[str]]:
    """The estimate rows of every architecture and size of `opts.estimate_sizes`, and the variants in order."""
    rows: list[gpu_estimate.EstimateRow] = []
    order: list[str] = []
    label = gpu_estimate.GPUS[opts.gpu].name
    for name, sizes in opts.estimate_sizes.items():
        for size in sizes:
            with task(f"GPU estimate: {name} {size} px on the {label}, traced on the meta device"):
                size_rows, names = gpu_table.estimate(opts, name, size, tomesd)
            rows += size_rows
            order += names
    return rows, list(dict.fromkeys(order))


def _idle_map(opts: Options, tomesd: Any | None, names: Sequence[str]) -> dict[str, str]:
    idle: dict[str, str] = {}
    for name in names:
        label = _idle_tomesd(opts, gpu_estimate.meta_unet(name), tomesd)
        if label is not None:
            idle[name] = label
    return idle


def main_estimate(opts: Options) -> int:
    """--gpu-estimate: the estimate's table alone, printed; nothing built or timed, no file written."""
    notes: list[str] = []
    tomesd, _ = _load_tomesd(opts, notes)
    rows, order = _run_estimate(opts, tomesd)
    idle = _idle_map(opts, tomesd, list(opts.estimate_sizes))
    print(f"## What to expect on a GPU (estimated, not measured: {gpu_estimate.GPUS[opts.gpu].name}, fp16)")
    print()
    print(gpu_table.format_table(rows, order, idle=idle))
    print()
    print(gpu_table.explanation(opts.gpu))
    for arch in idle:
        print(f"note: {_idle_note(arch, opts)}")
    for note in notes:
        print(f"note: {note}")
    return 0


def main_job_header(opts: Options, tomesd: Any | None) -> str:
    """What the main job is about to do, where, and where it writes."""
    where = f"{opts.device.type} in {opts.dtype_name}"
    if opts.device.type == "cuda":
        where += f" on the {torch.cuda.get_device_name(opts.device)}"
    else:
        threads = torch.get_num_threads()
        where += f", {threads} torch thread{'s' if threads > 1 else ''}"
    sizes = "; ".join(
        f"{spec.label} at {', '.join(run.size_label(s) for s in opts.sizes_of(spec.name))} px" for spec in opts.arches
    )
    presets = ", ".join(gpu_table.display_name(run.preset_variant_name(n)) for n in opts.presets) or "no preset"
    peers_text = f" and tomesd {', '.join(f'r={r:g}' for r in opts.ratios)} at its defaults" if tomesd else ""
    extra = [k for k in opts.latents[1:]]
    rounds = (
        f"an untimed round on the {' and '.join(extra)} start latent, then {opts.repeats} timed on {opts.latents[0]}"
        if run.extra_latents_first(opts)
        else f"{opts.repeats} timed rounds"
    )
    lines = [
        f"The main job: {sizes}; the unpatched UNet, the presets {presets}{peers_text}; one UNet call (batch 2) per"
        f" variant and round: {rounds}; then the GPU estimate. On {where}. Output: {opts.out}/",
    ]
    if opts.device_note:
        lines.append(opts.device_note)
    return "\n".join(lines)


def main_call(opts: Options, argv: Sequence[str]) -> int:
    """The per-call mode: one UNet step per variant; writes bench.md, bench.json and bench.png (and in the main job
    the GPU estimate beside them)."""
    started = time.perf_counter()
    if opts.threads is not None:
        torch.set_num_threads(opts.threads)
    notes: list[str] = []
    tomesd, tomesd_version = _load_tomesd(opts, notes)
    info = report.machine_info(opts, tomesd_version)
    if opts.main_job:
        print(main_job_header(opts, tomesd), flush=True)
    # The plan of UNet calls per architecture and size, each weighed by its unpatched call's FLOPs for the bar.
    plan: dict[str, tuple[int, float]] = {}
    idle: dict[str, str] = {}
    for spec in opts.arches:
        meta = gpu_estimate.meta_unet(spec.name)
        variants = len(run.run_variants(opts, meta, tomesd))
        label = _idle_tomesd(opts, meta, tomesd)
        if label is not None:
            idle[spec.name] = label
            notes.append(_idle_note(spec.name, opts))
        if not opts.main_job:
            calls = 1 + 2 * len(run.make_variants(opts, meta, tomesd)[1:])
            plan[f"ops {spec.name}"] = (calls, call_flops(meta, spec.name, _ops_size(opts, spec.name)[1]))
        for size in opts.sizes_of(spec.name):
            plan[f"{spec.name} {size}"] = (run.calls_per_size(opts, variants), call_flops(meta, spec.name, size))
    progress = CallBar(plan)
    tqdm_write(f"{progress.calls} UNet calls planned")

    rows: list[Row] = []
    overhead: list[OverheadRow] = []
    checks: list[tuple[bool, str]] = []
    for spec in opts.arches:
        weights = f"{opts.checkpoint}" if opts.checkpoint else "random weights"
        with task(f"{spec.name}: building the UNet ({weights}, {opts.dtype_name})"):
            unet = archs.build_unet(spec, opts.dtype, opts.device, opts.seed)
            if opts.checkpoint:
                archs.load_checkpoint(unet, opts.checkpoint, spec)
        processors = {type(p).__name__ for p in unet.attn_processors.values()}
        if processors != {"AttnProcessor2_0"}:
            notes.append(f"{spec.name}: attention processors are {sorted(processors)}, not AttnProcessor2_0")
        block_ops: dict[str, dict[str, float]] = {}
        ops_size, ops_at = _ops_size(opts, spec.name)
        if not opts.main_job:
            # Operations per merged block, once per architecture: they depend on which blocks merge, not on the
            # size. The main job leaves them out: the GPU estimate's operations added per call say more, and the
            # count costs calls.
            progress.group(f"ops {spec.name}")
            progress.set_postfix_str(f"{spec.name} {run.size_label(ops_at)}px counting operations per merged block")
            block_ops = run.bench_ops(opts, unet, spec, ops_at, tomesd)
            progress.update(plan[f"ops {spec.name}"][0])
            if ops_at != ops_size:
                notes.append(
                    f"{spec.name}: operations per merged block counted at {run.size_label(ops_at)} px (calls at the"
                    " largest sizes cost minutes on a CPU), shown with the smallest size's rows"
                )
        for size in opts.sizes_of(spec.name):
            label = run.size_label(size)
            with task(f"{spec.name} {label}px merge overhead per block"):
                overhead += run.bench_overhead(opts, unet, spec, size, tomesd)
            progress.group(f"{spec.name} {size}")
            size_rows = run.bench_size(opts, unet, spec, size, tomesd, checks, progress)
            if size == ops_size:
                for r in size_rows:
                    r.ops_per_block = block_ops.get(r.variant if r.ratio is None else f"{r.variant} r={r.ratio:g}")
            rows += size_rows
        del unet
        gc.collect()
        if opts.device.type == "cuda":
            torch.cuda.empty_cache()
    progress.close()
    estimate_rows, estimate_order = _run_estimate(opts, tomesd) if opts.estimate_sizes else ([], [])

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
    gpu_section: list[str] = []
    if estimate_rows:
        measured_on = f"{opts.device.type} {opts.dtype_name}"
        table = gpu_table.format_table(estimate_rows, estimate_order, measured=rows, measured_on=measured_on, idle=idle)
        gpu_section = [
            f"## What to expect on a GPU (estimated, not measured: {gpu_estimate.GPUS[opts.gpu].name}, fp16)",
            "",
            f"Speed-up per UNet call: measured here ({measured_on}) beside the estimate for a GPU.",
            "",
            table,
            "",
            gpu_table.explanation(opts.gpu),
        ]
    stand_in: list[Any] = []
    if opts.main_job:
        from tome_bench import fidelity

        with task("change of the image on the stand-ins (one call each)"):
            stand_in = fidelity.main_job_rows([spec.name for spec in opts.arches], opts)
        gpu_section += ["", *fidelity.main_job_section(stand_in)]
    wall = time.perf_counter() - started
    table = report.format_table(rows, opts.device, opts.latents)
    warning = report.spread_line(rows)
    opts.out.mkdir(parents=True, exist_ok=True)
    markdown = report.write_report(opts, argv, rows, checks, notes, info, wall, overhead, sections=gpu_section)
    paths = [opts.out / "bench.md", opts.out / "bench.json", opts.plot or opts.out / "bench.png"]
    paths[0].write_text(markdown)
    extra: dict[str, Any] = {"merge_overhead": [r.__dict__ for r in overhead]}
    if estimate_rows:
        extra["gpu_estimate"] = gpu_table.payload(estimate_rows, opts.gpu)
    if stand_in:
        extra["stand_in_change"] = [row.__dict__ for row in stand_in]
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
    if gpu_section:
        print()
        print("\n".join(gpu_section))
    print()
    report.print_checks_and_notes(checks, notes)
    wall = time.perf_counter() - started
    if opts.main_job:
        print(
            f"\nThe main job took {wall / 60:.1f} min ({wall:.0f} s). Its report, data and plot are in {opts.out}/:"
            f" {', '.join(p.name if p.parent == opts.out else str(p) for p in paths)}"
        )
    else:
        print(f"\nwrote {', '.join(map(str, paths))} ({wall:.1f} s)")
    return 0 if all(ok for ok, _ in checks) else 1


def _ops_size(opts: Options, arch: str) -> tuple[tuple[int, int], tuple[int, int]]:
    """(the smallest size of `arch`, the size its operations per merged block are counted at): the smaller of it
    and OPS_SIZE px, as calls at 1024 px cost minutes on a CPU."""
    smallest = min(opts.sizes_of(arch), key=lambda s: s[0] * s[1])
    return smallest, min(smallest, (OPS_SIZE, OPS_SIZE), key=lambda s: s[0] * s[1])


# ---------------------------------------------------------------------------------------------- progress


def call_flops(meta_unet: torch.nn.Module, arch: str, size: tuple[int, int]) -> float:
    """FLOPs of one unpatched call (batch 2) of the meta-device UNet `meta_unet` of `arch` at `size` (height,
    width), counted by `torch.utils.flop_counter.FlopCounterMode`: no weights, nothing computed, a second."""
    from torch.utils.flop_counter import FlopCounterMode

    args, kwargs = archs.make_inputs(arch, *size, dtype=torch.float16, device="meta")
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        meta_unet(*args, **kwargs)
    return float(counter.get_total_flops())


class CallBar:
    """The per-call mode's progress: a tqdm bar over the planned UNet calls, each weighing its group's FLOPs (group:
    an architecture and size, `call_flops`), so that the rate and the time left count one SDXL call as the several
    SD1.5 calls it costs. `run.bench_size` names each call (`set_postfix_str`) and counts it (`update`); work that is
    no call is a line of its own (`task`)."""

    def __init__(self, plan: Mapping[str, tuple[int, float]], file: Any = None) -> None:
        from tqdm import tqdm

        self.plan = dict(plan)
        self.calls = sum(calls for calls, _ in self.plan.values())
        self.done = 0
        self.key: str | None = None
        total = sum(calls * flops for calls, flops in self.plan.values())
        self.bar = tqdm(total=total, unit="FLOP", unit_scale=True, file=file or sys.stderr, smoothing=0.1)

    def group(self, key: str) -> None:
        """The calls that follow are of the group `key` of the plan."""
        self.key = key

    def set_postfix_str(self, text: str) -> None:
        self.bar.set_postfix_str(f"call {self.done + 1}/{self.calls} {text}")

    def update(self, n: int = 1) -> None:
        """`n` calls of the current group have finished (n > 1: calls skipped after their variant failed)."""
        if self.key is None:
            raise RuntimeError("CallBar.update before group(): which calls finished is unknown")
        self.done += n
        self.bar.update(n * self.plan[self.key][1])

    def close(self) -> None:
        self.bar.close()


def tqdm_write(text: str) -> None:
    """A line past the bar (on stderr, with the bar's lines)."""
    from tqdm import tqdm

    tqdm.write(text, file=sys.stderr)


@contextmanager
def task(text: str) -> Iterator[None]:
    """Work that is no UNet call (building a UNet, the overhead rows, the GPU estimate): a line as it starts and one
    with its seconds as it ends."""
    tqdm_write(f"{text} ...")
    start = time.perf_counter()
    yield
    tqdm_write(f"{text}: {time.perf_counter() - start:.1f} s")
