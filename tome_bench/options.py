"""What the benchmark's modules share: the parsed options, the result rows and the timing-spread rule.

`cli` builds an `Options`; `run` (one UNet call), `generate` (whole generations) and `report` read it and the
rows. Keeping these here, in a module that imports none of the others, is what keeps the package free of
import cycles.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tome_bench.archs import Arch

#: Above this spread ((max - min) / median of a variant's timed runs) the report warns that the machine was too
#: busy to trust the speed-ups: a quiet machine keeps it within a few percent.
SPREAD_LIMIT = 0.10
#: Start latents the benchmark knows: white noise (what a sampler starts from) and a field with a natural
#: image's power spectrum (see `archs.natural_latent`).
LATENT_KINDS = ("noise", "natural")
#: Samplers of the whole-generation mode: Euler (the WebUI's default) and DPM++ 2M.
SCHEDULERS = ("euler", "dpm++2m")
#: Clocks of --clock (see `timing.CLOCKS`): wall time, or the process's CPU time.
CLOCK_NAMES = ("wall", "cpu")
#: Variant name of ours at a preset of `tome_core.presets()`: PRESET_PREFIX + the preset's name.
PRESET_PREFIX = "ours:preset="


@dataclass
class Options:
    """The parsed command line (see `cli.build_parser`)."""

    device: torch.device
    dtype: torch.dtype
    dtype_name: str
    arches: list[Arch]
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
    #: Start latents, the first one timed, each further one run once more per variant for its deviation.
    latents: list[str] = field(default_factory=lambda: ["noise"])
    #: Preset names of `tome_core.presets()` to run as variants "ours:preset=NAME".
    presets: list[str] = field(default_factory=list)
    #: Whole-generation mode: sampler steps per generation; None = one UNet call (the per-call mode).
    steps: int | None = None
    scheduler: str = "euler"
    guidance: float = 7.0
    #: Peers of the whole-generation mode (`tome_bench.peers.PEER_NAMES`), each at its default and a faster setting.
    peers: list[str] = field(default_factory=list)
    #: What times a call: "wall" (time.perf_counter) or "cpu" (time.process_time), see `timing`.
    clock: str = "wall"
    #: Whole-generation mode: the fraction of --steps that runs, img2img-style from a noised start latent
    #: (1: txt2img from noise, every step).
    strength: float = 1.0
    #: Where the plot goes; None: next to the JSON (bench.png, gen.png).
    plot: Path | None = None
    #: --compile: torch.compile's mode for the compiled twin of every variant (`compiled.COMPILE_MODES`); None: eager
    #: only.
    compile_mode: str | None = None
    #: --lock: a file whose exclusive lock each size holds from its first timed run to its end (`timing.TimingLock`).
    lock: Path | None = None
    #: --lock-after: processes sharing --lock that finish their warm-ups before any of them times.
    lock_after: int = 0
    #: Sizes per architecture name (`--sizes sdxl:640`, the main job's SD1.5 512 px and SDXL 640 px): what
    #: `sizes_of` gives; an architecture not in it gets `sizes`.
    arch_sizes: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    #: The main job (`python -m tome_bench` with no option that picks variants or a matrix, `cli.MAIN_JOB`): the
    #: presets and tomesd beside the unpatched UNet with the GPU estimate in the report; its untimed rounds on the
    #: further start latents run first, in place of the priming call; it counts no operations per merged block
    #: (the estimate's operations added per call say more) and skips a tomesd whose max_downsample reaches no
    #: attention block (its output would be the baseline's).
    main_job: bool = False
    #: The GPU estimate (`tome_bench.gpu_table`): architecture name -> square sizes traced; empty: none.
    estimate_sizes: dict[str, list[int]] = field(default_factory=dict)
    #: The GPU the estimate prices the calls on (a key of `tome_bench.gpu_estimate.GPUS`).
    gpu: str = "h200"
    #: --gpu-estimate: only the estimate's table, nothing built or timed.
    estimate_only: bool = False
    #: Why the device is what it is when no --device was given (the main job on a machine with CUDA); None else.
    device_note: str | None = None
    #: --images: the checkpoint's decoded images, unpatched and at each preset, in a labelled grid (`images`).
    images: bool = False
    #: --images: the prompt (encoded by the checkpoint's text encoders where a tokenizer is on the machine).
    prompt: str = ""

    @property
    def mode(self) -> str:
        return "call" if self.steps is None else "generate"

    def sizes_of(self, arch: str) -> list[tuple[int, int]]:
        """The sizes (height, width) measured for one architecture."""
        return self.arch_sizes.get(arch, self.sizes)

    @property
    def steps_run(self) -> int | None:
        """Sampler steps one generation runs: int(steps * strength) as diffusers' img2img counts them."""
        return None if self.steps is None else steps_at_strength(self.steps, self.strength)


@dataclass
class Row:
    """One variant at one architecture and size: the JSON row and a line of the table.

    `deviation` is ||out - base|| / ||base|| on the first start latent (`latents[0]`); `deviations` and `psnr_db`
    hold it, and the PSNR, for every start latent. `spread` = (max - min) / median of `times_s`.
    """

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
    #: Per-call mode: (aten ops of the patched call - ops of the unpatched call) / blocks that merged.
    ops_per_block: dict[str, float] | None = None
    #: --compile: a compiled twin (its `speedup` is over the compiled baseline), its speed-up over the eager
    #: baseline, first run less median, graphs compiled in the warm-up and during the timed runs.
    compiled: bool = False
    speedup_vs_eager: float | None = None
    compile_s: float | None = None
    graphs: int | None = None
    recompiles: int | None = None
    #: --compile with CUDA graphs: graphs inductor ran without them (`compiled.cudagraph_skips`).
    cudagraph_skips: int | None = None


@dataclass
class OverheadRow:
    """What one preset adds per block at one level (`run.bench_overhead`): merging or pooling keys/values."""

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


def steps_at_strength(steps: int, strength: float) -> int:
    """The last steps of an N-step schedule that a pass at `strength` runs: min(int(N * strength), N), the count
    of diffusers' img2img pipelines (`get_timesteps`)."""
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
    label = worst.variant + ("" if worst.ratio is None else f" r={worst.ratio:g}")
    times = ", ".join(f"{t:.3g}" for t in worst.times_s)
    return (
        f"warning: the machine was too busy to trust these timings: {len(spread_rows)} variant(s) spread by more"
        f" than {limit:.0%} over their timed runs (worst: {worst.arch} {worst.size}px {label}, {worst.spread:.0%}:"
        f" {times} s); compare speed-ups only from a run on a quiet machine"
    )
