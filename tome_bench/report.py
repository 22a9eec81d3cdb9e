"""Reporting: the markdown tables, machine information, the plot, bench.md and gen.md, the JSON payload and the
console summary of both modes."""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import os
import platform
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tome_bench import compiled, run
from tome_bench.options import PRESET_PREFIX, Options, OverheadRow, Row, spread_warning
from tome_bench.timing import CLOCKS, rss_bytes
from tome_core import TomeConfig

#: How the report names the samplers of the whole-generation mode.
SCHEDULER_LABELS = {"euler": "Euler", "dpm++2m": "DPM++ 2M"}
#: The command that runs the benchmark, as the reports and the JSON write it.
COMMAND = ("python", "-m", "tome_bench")


def format_overhead(rows: Sequence[OverheadRow]) -> str:
    """Per preset and level: the plan and the merge + unmerge of a block merged whole beside tomesd's same merge, or
    the pooling of keys/values; '-' where nothing merges at this size (no whole cell) or tomesd is not installed."""
    header = ["arch", "size", "preset", "does", "level", "tokens x channels", "cells", "ratio"]
    header += ["plan ms", "merge + unmerge ms", "pool ms", "tomesd ms (same merge)", "ours / tomesd"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * 7 + "---:|" * 6]
    for r in rows:
        ours = r.ms["plan"] + r.ms["merge"] if "plan" in r.ms and "merge" in r.ms else None
        ref = r.ms.get("tomesd")
        cells = [r.arch, r.size, r.preset, r.what, f"1/{r.level}", f"{r.tokens} x {r.channels}", f"{r.sx}x{r.sy}"]
        cells += ["-" if r.ratio is None else f"{r.ratio:g}"]
        cells += [_fmt(r.ms.get(k), ".2f") for k in ("plan", "merge", "pool")]
        cells += [_fmt(ref, ".2f"), f"{ours / ref:.2f}" if ours is not None and ref else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- reporting


def mem_header(device: torch.device) -> str:
    if device.type == "cuda":
        return "peak mem MiB (CUDA max_memory_allocated growth)"
    if rss_bytes() is None:
        return "peak mem (n/a on this OS)"
    return "peak mem MiB (RSS growth, sampled, warm-up run)"


def _fmt(value: float | None, spec: str, none: str = "-") -> str:
    return none if value is None else format(value, spec)


def format_table(
    rows: Sequence[Row], device: torch.device, kinds: Sequence[str] = ("noise",), *, generation: bool = False
) -> str:
    """The results as a markdown table: one row per variant, a deviation column per start latent.

    spread: (max - min) / median of the variant's timed runs. In the whole-generation mode also the peer's
    setting and the PSNR of the final latent per start latent ('inf': identical).
    """
    several = len(kinds) > 1
    devs = [f"deviation ({k})" if several else "deviation" for k in kinds]
    psnrs = [f"PSNR dB ({k})" if several else "PSNR dB" for k in kinds] if generation else []
    header = ["arch", "size", "variant", "ratio"] + (["setting"] if generation else [])
    header += ["median s", "speed-up", "spread", mem_header(device), *devs, *psnrs]
    left = 5 if generation else 4
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] * left + ["---:"] * (len(header) - left)) + "|"]
    for r in rows:
        ratio = "-" if r.ratio is None else f"{r.ratio:g}"
        first = [r.arch, r.size, r.variant, ratio] + ([(r.setting or "-").replace("|", "/")] if generation else [])
        if r.error is not None or r.median_s is None:
            rest = ["error", "-", "-", "-", (r.error or "no result").replace("|", "/")]
            rest += ["-"] * (len(header) - len(first) - len(rest))
        else:
            deviations = r.deviations or ({kinds[0]: r.deviation} if r.deviation is not None else {})
            rest = [
                f"{r.median_s:.3f}",
                f"{r.speedup:.2f}x",
                _fmt(r.spread, ".0%"),
                "n/a" if r.peak_mem_mib is None else f"{r.peak_mem_mib:.0f}",
                *[_fmt(deviations.get(k), ".4f") for k in kinds],
            ]
            if generation:
                rest += [
                    ("inf" if r.psnr_db.get(k) is None else f"{r.psnr_db[k]:.1f}") if k in r.psnr_db else "-"
                    for k in kinds
                ]
        lines.append("| " + " | ".join(first + rest) + " |")
    return "\n".join(lines)


def spread_line(rows: Sequence[Row]) -> str | None:
    """The one warning line under the table when the machine was too busy (see `options.spread_warning`)."""
    warning = spread_warning(rows)
    if warning is None:
        return None
    load = _loadavg()
    return warning + (f" (load average now {load})" if load != "n/a" else "")


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
        "diffusers": version("diffusers"),
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


def version(name: str) -> str:
    """Installed version of a distribution, or 'not installed'."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


#: Plot colours and markers of the fixed variants; every other variant (ours:NAME, peers) gets the next free one.
_STYLES = {"baseline": ("black", "x"), "ours": ("tab:blue", "o"), "tomesd": ("tab:orange", "s")}
#: The preset ladder's colour and marker.
_LADDER_STYLE = ("tab:red", "D")
#: The compiled presets' ladder (--compile), beside the eager one.
_COMPILED_LADDER_STYLE = ("darkorange", "s")
_MORE_STYLES = (
    ("tab:green", "^"),
    ("tab:purple", "v"),
    ("tab:brown", "P"),
    ("tab:pink", "X"),
    ("tab:olive", "<"),
    ("tab:cyan", ">"),
    ("tab:gray", "*"),
    ("darkblue", "h"),
    ("darkred", "p"),
    ("darkgreen", "d"),
)


def plot_styles(variants: Sequence[str]) -> dict[str, tuple[str, str]]:
    """(colour, marker) per variant name: fixed for baseline, ours, tomesd and the presets (one ladder), the next
    free one for the rest."""
    styles = {k: v for k, v in _STYLES.items() if k in variants}
    extra = iter(_MORE_STYLES)
    for name in dict.fromkeys(variants):
        if name.startswith(PRESET_PREFIX):
            styles[name] = _LADDER_STYLE
        elif name not in styles:
            styles[name] = next(extra, ("tab:gray", "*"))
    return styles


@dataclass
class PlotPoint:
    """One variant in a panel: speed-up (x) and deviation on the first start latent (y) and on the natural one."""

    label: str
    speedup: float
    deviation: float
    natural: float | None = None


@dataclass
class PlotSeries:
    """What one panel draws for one variant name: `line` connects the points (the preset ladder, a variant over
    --ratios), in order of speed-up."""

    name: str
    kind: str  # baseline | ladder | ours | peer
    points: list[PlotPoint] = field(default_factory=list)

    @property
    def line(self) -> bool:
        return self.kind in ("ladder", "ours") and len(self.points) > 1


def plot_series(rows: Sequence[Row], latents: Sequence[str] = ("noise",)) -> dict[tuple[str, str], list[PlotSeries]]:
    """The plot's content per (arch, size) panel: the baseline at (1, 0), the presets as one ladder, each ours
    configuration over its ratios, each peer setting on its own; rows with an error or no deviation are left out.

    `natural` is the deviation on the natural start latent when it was run and is not the first (plotted) one.
    """
    second = "natural" if "natural" in latents[1:] else None
    panels: dict[tuple[str, str], dict[str, PlotSeries]] = {}
    for r in rows:
        series = panels.setdefault((r.arch, r.size), {})
        if r.median_s is None or r.speedup is None or r.deviation is None:
            continue
        if r.variant == "baseline":
            name, kind, label = "baseline", "baseline", "baseline"
        elif r.variant.startswith(PRESET_PREFIX):
            # a compiled twin's speed-up is over the compiled baseline: its own ladder
            twin = compiled.is_twin(r.variant)
            name = "presets" + (compiled.SUFFIX if twin else "")
            kind, label = "ladder", compiled.eager_name(r.variant)[len(PRESET_PREFIX) :]
        else:
            name = r.variant
            kind = "ours" if r.variant == "ours" or r.variant.startswith("ours:") else "peer"
            label = r.variant if r.ratio is None else f"{r.variant} r={r.ratio:g}"
        natural = r.deviations.get(second) if second else None
        series.setdefault(name, PlotSeries(name, kind)).points.append(PlotPoint(label, r.speedup, r.deviation, natural))
    out: dict[tuple[str, str], list[PlotSeries]] = {}
    for key, series in panels.items():
        for s in series.values():
            if s.line:
                s.points.sort(key=lambda p: p.speedup)
        out[key] = list(series.values())
    return out


def write_plot(
    rows: Sequence[Row], path: Path, what: str = "one UNet step, batch 2", latents: Sequence[str] = ("noise",)
) -> None:
    """Speed-up (x) against deviation (y) as a PNG, one panel per (arch, size): the baseline at (1, 0), the
    presets as a labelled ladder line, each peer setting as its own labelled marker; filled markers on the first
    start latent, hollow ones on the natural latent when it was run as well. matplotlib is imported here only."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    panels = plot_series(rows, latents)
    styles = plot_styles([s.name for series in panels.values() for s in series])
    styles["presets"] = _LADDER_STYLE
    styles["presets" + compiled.SUFFIX] = _COMPILED_LADDER_STYLE
    count = max(len(panels), 1)
    fig, axes = plt.subplots(1, count, figsize=(6.5 * count, 5), squeeze=False)
    hollow = "natural" if "natural" in latents[1:] else None
    for ax, ((arch, size), series) in zip(axes[0], panels.items()):
        for s in series:
            color, marker = styles[s.name]
            xs = [p.speedup for p in s.points]
            ys = [p.deviation for p in s.points]
            legend = {"presets": "presets", "presets" + compiled.SUFFIX: "presets, compiled"}.get(s.name, s.name)
            ax.plot(xs, ys, ls="-" if s.line else "none", color=color, marker=marker, ms=7, label=legend)
            natural = [(p.speedup, p.natural) for p in s.points if p.natural is not None]
            if natural:
                ax.plot(
                    [x for x, _ in natural],
                    [y for _, y in natural],
                    ls="--" if s.line else "none",
                    color=color,
                    marker=marker,
                    ms=7,
                    mfc="none",
                )
            if s.kind == "baseline":
                continue
            for p in s.points:
                ax.annotate(
                    p.label,
                    (p.speedup, p.deviation),
                    textcoords="offset points",
                    xytext=(5, 4),
                    fontsize=8,
                    color=color,
                )
        ax.axvline(1.0, color="grey", lw=0.6, ls=":")
        ax.set_title(f"{arch} {size}px: {what}")
        ax.set_xlabel("speed-up over baseline (x)")
        ax.set_ylabel("deviation ||out - base|| / ||base||")
        ax.grid(alpha=0.3)
        handles, _ = ax.get_legend_handles_labels()
        if hollow:  # which marker is which start latent
            first = latents[0]
            handles += [
                Line2D([], [], ls="none", marker="o", color="grey", label=f"filled: {first} latent"),
                Line2D([], [], ls="none", marker="o", color="grey", mfc="none", label=f"hollow: {hollow} latent"),
            ]
        ax.legend(handles=handles, fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _ours_lines(opts: Options, target: str) -> list[str]:
    cfg = TomeConfig.from_dict(opts.ours_fields)
    changed = {k: v for k, v in cfg.to_dict().items() if k != "ratio" and k in opts.ours_fields}
    lines = [
        f"- ours: `tome_core.apply_patch({target}, TomeConfig(ratio=r"
        + "".join(f", {k}={v!r}" for k, v in changed.items())
        + "))`",
        "  full config: " + ", ".join(f"{k}={v!r}" for k, v in cfg.to_dict().items() if k != "ratio"),
    ]
    if opts.main_job and "ours" not in opts.variants and not opts.extra_ours:
        lines = []  # the main job runs ours at the presets only
    if opts.presets:
        lines.append(
            f"- presets: `tome_core.apply_patch({target}, preset=NAME)` for {', '.join(opts.presets)}"
            " (variants ours:preset=NAME; a preset fixes its own ratio, --ratios and --set do not apply)"
        )
    return lines


def _latent_line(opts: Options) -> str:
    timed = f"{opts.latents[0]} (timed)"
    when = "an untimed run per variant before the timed ones" if run.extra_latents_first(opts) else None
    more = [f"{k} ({when or 'one more untimed run per variant'})" for k in opts.latents[1:]]
    return (
        "- start latents: "
        + ", ".join([timed, *more])
        + "; noise = white noise, natural = power falling as 1/f^2 like real latents (archs.natural_latent)"
    )


def command_line(argv: Sequence[str]) -> str:
    """The command as one shell line: 'python -m tome_bench --arch tiny ...'."""
    return shlex.join([*COMMAND, *argv])


def generation_steps(opts: Options) -> str:
    """'10 Euler steps', or below strength 1 'the last 5 of 10 Euler steps (strength 0.5)'."""
    sampler = SCHEDULER_LABELS[opts.scheduler]
    if opts.strength >= 1.0:
        return f"{opts.steps} {sampler} steps"
    return f"the last {opts.steps_run} of {opts.steps} {sampler} steps (strength {opts.strength:g})"


def clock_notes(opts: Options) -> list[str]:
    """The note that CPU time adds up every thread's time, when --clock cpu ran on more than one thread."""
    threads = torch.get_num_threads()
    if opts.clock != "cpu" or threads == 1:
        return []
    return [
        f"--clock cpu with {threads} torch threads: CPU time adds up the time of every thread, so it is not the"
        " quiet wall time; run --clock cpu with --threads 1"
    ]


def _clock_line(opts: Options) -> str:
    return f"- clock: {opts.clock}, {CLOCKS[opts.clock][1]}"


def _time_word(opts: Options) -> str:
    return "wall time" if opts.clock == "wall" else "CPU time"


def _checks_and_notes(checks: Sequence[tuple[bool, str]], notes: Sequence[str]) -> list[str]:
    """The tail of both reports: the sanity checks and the notes."""
    lines = ["", "## Sanity checks", "", *[f"- {'PASS' if ok else 'FAIL'}: {text}" for ok, text in checks]]
    if notes:
        lines += ["", "## Notes", "", *[f"- {n}" for n in notes]]
    return lines


def print_checks_and_notes(checks: Sequence[tuple[bool, str]], notes: Sequence[str]) -> None:
    """The console's version of the same tail."""
    for ok, text in checks:
        print(f"{'PASS' if ok else 'FAIL'}: {text}")
    for n in notes:
        print(f"note: {n}")


def payload(
    opts: Options,
    argv: Sequence[str],
    info: dict[str, str],
    rows: Sequence[Row],
    checks: Sequence[tuple[bool, str]],
    notes: Sequence[str],
    warning: str | None,
    wall: float,
    *,
    mode_keys: dict[str, Any],
    extra: dict[str, Any],
) -> dict[str, Any]:
    """The JSON of either mode: `mode_keys` right after the mode (the sampler's settings), `extra` after the rows
    (the per-call mode's merge overhead)."""
    return {
        "command": [*COMMAND, *argv],
        "mode": opts.mode,
        **mode_keys,
        "latents": opts.latents,
        "clock": opts.clock,
        "machine": info,
        "ours_config": TomeConfig.from_dict(opts.ours_fields).to_dict(),
        "rows": [r.__dict__ for r in rows],
        **extra,
        "checks": [{"ok": ok, "text": text} for ok, text in checks],
        "notes": list(notes),
        "spread_warning": warning,
        "wall_s": wall,
    }


def _results(rows: Sequence[Row], opts: Options, generation: bool) -> list[str]:
    lines = [format_table(rows, opts.device, opts.latents, generation=generation)]
    warning = spread_line(rows)
    if warning:
        lines.append("")
        lines.append(f"**{warning}**")
    if any(r.compiled for r in rows):
        lines += [
            "",
            f"### With torch.compile (mode {opts.compile_mode}, inductor, fullgraph=True)",
            "",
            compiled.format_table(rows, opts.compile_mode),
            "",
            "A variant's compiled twin applies the same patch and runs through one `torch.compile(unet)` wrapper."
            " eager speed-up: eager baseline / eager variant. compiled speed-up: compiled baseline / compiled"
            " variant. compiled vs eager baseline: eager baseline / compiled variant. compile s: the first (warm-up)"
            " run less the median (with --clock cpu this process's CPU time only: inductor also compiles in worker"
            " processes). graphs: graphs dynamo compiled in the warm-up; recompiles: in the timed runs."
            + (
                " cudagraph skips: graphs inductor ran without CUDA graphs (TORCH_LOGS=cudagraphs says why)."
                if opts.compile_mode in compiled.CUDAGRAPH_MODES
                else ""
            ),
        ]
    return lines


def write_report(
    opts: Options,
    argv: Sequence[str],
    rows: Sequence[Row],
    checks: Sequence[tuple[bool, str]],
    notes: Sequence[str],
    info: dict[str, str],
    wall: float,
    overhead: Sequence[OverheadRow] = (),
    sections: Sequence[str] = (),
) -> str:
    """bench.md of the per-call mode; `sections`: lines after the results (the main job's GPU estimate)."""
    lines = [
        "# ToMe benchmark: one UNet step" + (", the main job" if opts.main_job else ""),
        "",
        f"Command: `{command_line(argv)}`"
        + (
            " (the main job: every preset and tomesd at its defaults beside the unpatched UNet, the GPU estimate"
            " beside them)"
            if opts.main_job
            else ""
        ),
        "",
        *[f"- {k}: {v}" for k, v in info.items()],
        f"- weights: {opts.checkpoint or f'random (seed {opts.seed})'}; inputs: seeded random (seed {opts.seed}),"
        f" batch 2 (cond + uncond), timestep {opts.timestep}",
        _latent_line(opts),
        f"- repeats: {opts.repeats} timed runs per variant after " + _warm_text(opts) + ", variants interleaved"
        " round-robin",
        "- sizes: "
        + "; ".join(f"{s.name} {', '.join(run.size_label(z) for z in opts.sizes_of(s.name))} px" for s in opts.arches),
        _clock_line(opts),
        *_ours_lines(opts, "unet"),
        f"- tomesd: `tomesd.apply_patch(unet, ratio=r, max_downsample={opts.tomesd_max_downsample})`, other arguments"
        " at tomesd's defaults (sx=sy=2, use_rand=True, merge_attn only)",
        f"- total wall time: {wall:.1f} s; load average (1 min) at the end: {_loadavg()}",
        "",
        "## Results",
        "",
        *_results(rows, opts, generation=False),
        "",
        f"median s: median {_time_word(opts)} of one UNet call. speed-up: baseline median / median. spread: (max - min) /"
        " median of the timed runs. deviation: relative L2 distance of the output from the baseline output on the"
        " same input (first run), on random weights: they attend uniformly, so this shows that a patch ran, not how"
        " much a trained model's image changes (that is the stand-in section).",
    ]
    if sections:
        lines += ["", *sections]
    if any(r.ops_per_block for r in rows):
        lines += [
            "",
            "## Operations per merged block",
            "",
            "aten operations one UNet call dispatches with the patch minus without it, divided by the blocks that"
            " merged (ours: tome_core.stats(unet).applied; tomesd: the blocks at the levels its max_downsample"
            " reaches), counted once per architecture at the smallest size. On a GPU each kernel-launching"
            " operation costs several microseconds of CPU time and each host sync stalls the queue.",
            "",
            format_ops(rows),
        ]
    lines += [
        "",
        "## Merge overhead per block",
        "",
        "What each preset adds per block on the product's path (`tome_bench.run.bench_overhead`), at the first level"
        " where it merges and the first where it pools keys/values, on a random block input of that level's shape:"
        " plan = the step's random partition, band_match and band_merge (once per call and stack with one plan per"
        " stack); merge + unmerge = BandMerge.merge_with_residual and unmerge_add of a block merged whole; pool ="
        " kv_downsample; tomesd = its bipartite_soft_matching_random2d merging the same share of the same tokens in"
        " the same cells (plan, merge, unmerge). Median of torch.utils.benchmark.Timer.blocked_autorange; the"
        " attention itself is not included.",
        "",
        format_overhead(overhead),
        *_checks_and_notes(checks, notes),
    ]
    return "\n".join(lines) + "\n"


def _warm_text(opts: Options) -> str:
    """What runs untimed before the timed runs of the per-call mode."""
    if run.extra_latents_first(opts):
        return f"one untimed round of every variant on the {' and '.join(opts.latents[1:])} start latent"
    if opts.warmup:
        return f"{opts.warmup} warm-up round(s)"
    return "one untimed baseline call (no warm-up round)"


def format_ops(rows: Sequence[Row]) -> str:
    """Per variant: aten operations its patch adds per block that merged (ops.count_ops, patched - unpatched call,
    divided by the blocks that merged; '-' where none merged)."""
    header = ["arch", "size", "variant", "ratio", "blocks merged", "ops", "kernel-launching", "views", "host syncs"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * 4 + "---:|" * 5]
    for r in rows:
        if not r.ops_per_block:
            continue
        o = r.ops_per_block
        cells = [r.arch, r.size, r.variant, "-" if r.ratio is None else f"{r.ratio:g}", f"{o['blocks']:.0f}"]
        cells += [f"{o[k]:+.1f}" if k in o else "-" for k in ("total", "launching", "views", "syncs")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_gen_report(
    opts: Options,
    argv: Sequence[str],
    rows: Sequence[Row],
    checks: Sequence[tuple[bool, str]],
    notes: Sequence[str],
    info: dict[str, str],
    wall: float,
) -> str:
    """gen.md of the whole-generation mode."""
    steps = generation_steps(opts)
    start = (
        ""
        if opts.strength >= 1.0
        else f"; img2img-style like a hires pass: the start latent noised to the timestep where {opts.strength:g}"
        " of the schedule remains (the scheduler's add_noise), the same for every variant"
    )
    lines = [
        f"# ToMe benchmark: whole generations, {steps}",
        "",
        f"Command: `{command_line(argv)}`",
        "",
        *[f"- {k}: {v}" for k, v in info.items()],
        f"- weights: {opts.checkpoint or f'random (seed {opts.seed})'}; a diffusers pipeline without VAE or text"
        f" encoders: seeded random prompt embeddings (seed {opts.seed}), classifier-free guidance {opts.guidance:g}"
        f" (batch 2 per UNet call), {steps}, output_type='latent'{start}",
        _latent_line(opts),
        f"- repeats: {opts.repeats} timed generations per variant after "
        + (
            f"{opts.warmup} warm-up round(s)"
            if opts.warmup
            else "one untimed 1-step baseline generation (no warm-up round)"
        )
        + ", variants interleaved round-robin, the same global RNG seed for each",
        _clock_line(opts),
        *_ours_lines(opts, "pipe"),
        "- peers: each from its PyPI package at its documented default and one faster setting (the setting column"
        " gives its arguments); see tome_bench/peers.py",
        f"- total wall time: {wall:.1f} s; load average (1 min) at the end: {_loadavg()}",
        "",
        "## Results",
        "",
        *_results(rows, opts, generation=True),
        "",
        f"median s: median {_time_word(opts)} of one generation. speed-up: baseline median / median. spread: (max -"
        " min) / median of the timed generations. deviation: relative L2 distance of the final latent from the"
        " baseline's (same start latent, same seed), after every step's error has propagated. PSNR: of the final"
        " latent, peak = the baseline latent's range.",
        *_checks_and_notes(checks, notes),
    ]
    return "\n".join(lines) + "\n"
