"""Reporting the jobs that time variants side by side: the results table, machine information, the speed-up /
deviation plot, the markdown report, the JSON and the console summary (`finish` writes and prints them all)."""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import json
import os
import platform
import shlex
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tome_bench import run
from tome_bench.options import PRESET_PREFIX, Options, Row, spread_warning
from tome_bench.timing import CLOCKS, rss_bytes
from tome_core import TomeConfig

SCHEDULER_LABELS = {"euler": "Euler", "dpm++2m": "DPM++ 2M"}
#: The command that runs the lab, as the reports and the JSON write it (the job's name follows).
COMMAND = ("python", "-m", "tome_bench")


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1) -> str:
    """A markdown table, the first `left` columns left-aligned and the rest right-aligned."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * left + "---:|" * (len(header) - left)]
    return "\n".join(lines + ["| " + " | ".join(str(c).replace("|", "/") for c in row) + " |" for row in rows])


def format_table(
    rows: Sequence[Row], device: torch.device, kinds: Sequence[str] = ("noise",), *, generation: bool = False
) -> str:
    """One row per variant, a deviation column per start latent; whole generations add the peer's setting and the
    PSNR of the final latent per start latent ('inf': identical)."""
    several = len(kinds) > 1
    if device.type == "cuda":
        mem = "peak mem MiB (CUDA max_memory_allocated growth)"
    else:
        mem = (
            "peak mem MiB (RSS growth, sampled, first run)" if rss_bytes() is not None else "peak mem (n/a on this OS)"
        )
    header = ["arch", "size", "variant", "ratio", *(["setting"] if generation else [])]
    header += ["median s", "speed-up", "spread", mem, *[f"deviation ({k})" if several else "deviation" for k in kinds]]
    header += [f"PSNR dB ({k})" if several else "PSNR dB" for k in kinds] if generation else []
    lines = []
    for r in rows:
        cells = [r.arch, r.size, r.variant, _fmt(r.ratio, "g"), *([r.setting or "-"] if generation else [])]
        if r.error is not None or r.median_s is None:
            cells += ["error", "-", "-", "-", r.error or "no result"]
        else:
            cells += [f"{r.median_s:.3f}", f"{r.speedup:.2f}x", _fmt(r.spread, ".0%"), _fmt(r.peak_mem_mib, ".0f")]
            cells += [_fmt(r.deviations.get(k), ".4f") for k in kinds]
            if generation:
                cells += [
                    ("inf" if r.psnr_db[k] is None else f"{r.psnr_db[k]:.1f}") if k in r.psnr_db else "-" for k in kinds
                ]
        lines.append(cells + ["-"] * (len(header) - len(cells)))
    return markdown_table(header, lines, left=5 if generation else 4)


def format_overhead(rows: Sequence[run.OverheadRow]) -> str:
    """Per preset and level: the plan and the merge + unmerge of a block merged whole beside tomesd's same merge, or
    the pooling of keys/values; '-' where nothing merges at this size or tomesd is not installed."""
    header = ["arch", "size", "preset", "does", "level", "tokens x channels", "cells", "ratio", "plan ms"]
    header += ["merge + unmerge ms", "pool ms", "tomesd ms (same merge)", "ours / tomesd"]
    lines = []
    for r in rows:
        ours = r.ms["plan"] + r.ms["merge"] if "plan" in r.ms and "merge" in r.ms else None
        ref = r.ms.get("tomesd")
        cells = [r.arch, r.size, r.preset, r.what, f"1/{r.level}", f"{r.tokens} x {r.channels}", f"{r.sx}x{r.sy}"]
        cells += [_fmt(r.ratio, "g"), *[_fmt(r.ms.get(k), ".2f") for k in ("plan", "merge", "pool")], _fmt(ref, ".2f")]
        lines.append([*cells, f"{ours / ref:.2f}" if ours is not None and ref else "-"])
    return markdown_table(header, lines, left=7)


def spread_line(rows: Sequence[Row]) -> str | None:
    """The one warning line under the table when the machine was too busy (`options.spread_warning`)."""
    warning = spread_warning(rows)
    return None if warning is None else warning + f" (load average now {_loadavg()})"


def machine_info(opts: Options, tomesd_version: str | None) -> dict[str, str]:
    cpu = platform.processor() or platform.machine()
    if os.path.exists("/proc/cpuinfo"):
        text = Path("/proc/cpuinfo").read_text()
        cpu = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), cpu)
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
    return f"{os.getloadavg()[0]:.2f}" if hasattr(os, "getloadavg") else "n/a"


def version(name: str) -> str:
    """Installed version of a distribution, or 'not installed'."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


# ---------------------------------------------------------------------------------------------- the plot

#: Colours and markers: fixed for the baseline, ours, tomesd and the presets' ladder, the next free one for the rest.
_STYLES = {
    "baseline": ("black", "x"),
    "ours": ("tab:blue", "o"),
    "tomesd": ("tab:orange", "s"),
    "presets": ("tab:red", "D"),
}
_MORE_STYLES = [
    (c, m) for c, m in zip(("tab:green", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan"), "^vPX<>")
]


@dataclass
class PlotPoint:
    """One variant in a panel: speed-up (x), deviation on the first start latent (y) and on the natural one."""

    label: str
    speedup: float
    deviation: float
    natural: float | None = None


@dataclass
class PlotSeries:
    """What one panel draws for one variant name; `line` joins the points (the presets' ladder, ours over --ratios)."""

    name: str
    kind: str  # baseline | ladder | ours | peer
    points: list[PlotPoint] = field(default_factory=list)

    @property
    def line(self) -> bool:
        return self.kind in ("ladder", "ours") and len(self.points) > 1


def plot_series(rows: Sequence[Row], latents: Sequence[str] = ("noise",)) -> dict[tuple[str, str], list[PlotSeries]]:
    """Per (arch, size) panel: the baseline at (1, 0), the presets as one ladder, each configuration of ours over its
    ratios, each peer setting on its own; rows with an error or no deviation are left out. `natural`: the deviation
    on the natural start latent when it ran and is not the first (plotted) one."""
    second = "natural" if "natural" in latents[1:] else None
    panels: dict[tuple[str, str], dict[str, PlotSeries]] = {}
    for r in rows:
        series = panels.setdefault((r.arch, r.size), {})
        if r.speedup is None or r.deviation is None:
            continue
        if r.variant.startswith(PRESET_PREFIX):
            name, kind, label = "presets", "ladder", r.variant[len(PRESET_PREFIX) :]
        else:
            name, label = r.variant, r.label
            kind = "baseline" if name == "baseline" else "ours" if name.split(":")[0] == "ours" else "peer"
        natural = r.deviations.get(second) if second else None
        series.setdefault(name, PlotSeries(name, kind)).points.append(PlotPoint(label, r.speedup, r.deviation, natural))
    for s in (s for series in panels.values() for s in series.values() if s.line):
        s.points.sort(key=lambda p: p.speedup)
    return {key: list(series.values()) for key, series in panels.items()}


def write_plot(rows: Sequence[Row], path: Path, what: str, latents: Sequence[str] = ("noise",)) -> None:
    """Speed-up (x) against deviation (y) as a PNG, one panel per (arch, size): filled markers on the first start
    latent, hollow ones on the natural latent when it ran as well. matplotlib is imported here only."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = plot_series(rows, latents)
    styles, extra = dict(_STYLES), iter(_MORE_STYLES)
    fig, axes = plt.subplots(1, max(len(panels), 1), figsize=(6.5 * max(len(panels), 1), 5), squeeze=False)
    for ax, ((arch, size), series) in zip(axes[0], panels.items()):
        for s in series:
            color, marker = styles.setdefault(s.name, next(extra, ("tab:gray", "*")))
            xs, ys = [p.speedup for p in s.points], [p.deviation for p in s.points]
            ax.plot(xs, ys, ls="-" if s.line else "none", color=color, marker=marker, label=s.name)
            natural = [(p.speedup, p.natural) for p in s.points if p.natural is not None]
            if natural:
                ax.plot(*zip(*natural), ls="--" if s.line else "none", color=color, marker=marker, mfc="none")
            for p in s.points if s.kind != "baseline" else []:
                ax.annotate(p.label, (p.speedup, p.deviation), xytext=(5, 4), textcoords="offset points", fontsize=8)
        ax.axvline(1.0, color="grey", lw=0.6, ls=":")
        hollow = "; hollow: the natural latent" if "natural" in latents[1:] else ""
        ax.set(title=f"{arch} {size}px: {what}", xlabel=f"speed-up over baseline (x){hollow}", ylabel="deviation")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------- the report


def command_line(argv: Sequence[str]) -> str:
    """The command as one shell line: 'python -m tome_bench compare --arch tiny ...'."""
    return shlex.join([*COMMAND, *argv])


def generation_steps(opts: Options) -> str:
    """'10 Euler steps', or below strength 1 'the last 5 of 10 Euler steps (strength 0.5)'."""
    sampler = SCHEDULER_LABELS[opts.scheduler]
    if opts.strength >= 1.0:
        return f"{opts.steps} {sampler} steps"
    return f"the last {opts.steps_run} of {opts.steps} {sampler} steps (strength {opts.strength:g})"


def _setup_lines(opts: Options, target: str) -> list[str]:
    """What ran: start latents, rounds, clock, ours, the presets, tomesd."""
    when = (
        "an untimed run per variant before the timed ones"
        if run.extra_latents_first(opts)
        else "one more untimed run per variant"
    )
    latents = ", ".join([f"{opts.latents[0]} (timed)", *[f"{k} ({when})" for k in opts.latents[1:]]])
    unit = "generation" if opts.steps else "run"
    if run.extra_latents_first(opts):
        warm = f"one untimed round of every variant on the {' and '.join(opts.latents[1:])} start latent"
    elif opts.warmup:
        warm = f"{opts.warmup} warm-up round(s)"
    else:
        warm = f"one untimed baseline {'1-step generation' if opts.steps else 'call'} (no warm-up round)"
    lines = [
        f"- start latents: {latents}; noise = white noise, natural = power falling as 1/f^2 like real latents",
        f"- repeats: {opts.repeats} timed {unit}s per variant after {warm}, variants interleaved round-robin",
        f"- clock: {opts.clock}, {CLOCKS[opts.clock][1]}",
    ]
    if "ours" in opts.variants or opts.extra_ours:
        cfg = TomeConfig.from_dict(opts.ours_fields)
        changed = "".join(f", {k}={v!r}" for k, v in cfg.to_dict().items() if k != "ratio" and k in opts.ours_fields)
        lines.append(f"- ours: `tome_core.apply_patch({target}, TomeConfig(ratio=r{changed}))`")
    if opts.presets:
        lines.append(f"- presets: `tome_core.apply_patch({target}, preset=NAME)` for {', '.join(opts.presets)}")
    if "tomesd" in opts.variants:
        lines.append(
            f"- tomesd: `tomesd.apply_patch(unet, ratio=r, max_downsample={opts.tomesd_max_downsample})`, the rest at"
            " tomesd's defaults (sx=sy=2, use_rand=True, merge_attn only)"
        )
    return lines


def write_report(opts: Options, argv: Sequence[str], rows: Sequence[Row], checks: Sequence[tuple[bool, str]],
                 notes: Sequence[str], info: dict[str, str], wall: float, sections: Sequence[str] = ()) -> str:  # fmt: skip
    """bench.md (one UNet call) or gen.md (whole generations): setup, results, `sections`, checks, notes."""
    steps = generation_steps(opts) if opts.steps else None
    if steps:
        title = f"# ToMe benchmark: whole generations, {steps}"
        inputs = (
            f"a diffusers pipeline without VAE or text encoders: seeded random prompt embeddings, classifier-free guidance"
            f" {opts.guidance:g} (batch 2 per UNet call), {steps}, output_type='latent'"
        )
        if opts.strength < 1.0:
            inputs += f"; img2img like a hires pass: the start latent noised to the timestep where {opts.strength:g} of the schedule remains"
        what = (
            "one generation",
            "the final latent",
            "same start latent and seed, after every step's error has propagated",
        )
    else:
        title = "# ToMe benchmark: one UNet step" + (", the main job" if opts.main_job else "")
        inputs = f"seeded random inputs, batch 2 (cond + uncond), timestep {opts.timestep}"
        what = (
            "one UNet call",
            "the output",
            "same input; on random weights it attends uniformly, so this shows that a patch ran, not how much a trained model's image changes (the stand-in section does)",
        )
    sizes = "; ".join(f"{s.name} {', '.join(map(run.size_label, opts.sizes_of(s.name)))} px" for s in opts.arches)
    warning = spread_line(rows)
    clock = "wall" if opts.clock == "wall" else "CPU"
    lines = [
        title, "", f"Command: `{command_line(argv)}`", "", *[f"- {k}: {v}" for k, v in info.items()],
        f"- weights: {opts.checkpoint or f'random (seed {opts.seed})'}; {inputs}; sizes: {sizes}",
        *_setup_lines(opts, "pipe" if steps else "unet"),
        f"- total wall time: {wall:.1f} s; load average (1 min) at the end: {_loadavg()}", "", "## Results", "",
        format_table(rows, opts.device, opts.latents, generation=bool(steps)), *(["", f"**{warning}**"] if warning else []),
        "", f"median s: median {clock} time of {what[0]}. speed-up: baseline median / median. spread: (max - min) /"
        f" median of the timed runs. deviation: relative L2 distance of {what[1]} from the baseline's ({what[2]}).",
        *(["", *sections] if sections else []), "", "## Sanity checks", "",
        *[f"- {'PASS' if ok else 'FAIL'}: {text}" for ok, text in checks],
        *(["", "## Notes", "", *[f"- {n}" for n in notes]] if notes else []),
    ]  # fmt: skip
    return "\n".join(lines) + "\n"


def finish(opts: Options, argv: Sequence[str], rows: Sequence[Row], checks: Sequence[tuple[bool, str]], notes: list[str],
           info: dict[str, str], started: float, *, extra: dict[str, Any], sections: Sequence[str] = ()) -> int:  # fmt: skip
    """Write OUT/bench.* (OUT/gen.* for whole generations): the report, the JSON and the plot; print the table, the
    sections, the checks and the notes. 0 when every check passed."""
    if opts.clock == "cpu" and torch.get_num_threads() > 1:
        notes.append("--clock cpu with several torch threads adds up every thread's time: run it with --threads 1")
    for r in rows:
        if r.variant != "baseline" and r.error is None and r.deviation == 0.0:
            why = (
                " (tomesd's max_downsample=1 reaches no attention block here: --tomesd-max-downsample auto)"
                if r.variant == "tomesd"
                else ""
            )
            notes.append(f"{r.arch} {r.size}px {r.label}: output identical to the baseline's, nothing was merged{why}")
    notes[:] = list(dict.fromkeys(notes))
    wall = time.perf_counter() - started
    stem = "gen" if opts.steps else "bench"
    opts.out.mkdir(parents=True, exist_ok=True)
    paths = [opts.out / f"{stem}.md", opts.out / f"{stem}.json", opts.plot or opts.out / f"{stem}.png"]
    paths[0].write_text(write_report(opts, argv, rows, checks, notes, info, wall, sections))
    data = {
        "command": [*COMMAND, *argv],
        "mode": opts.mode,
        "latents": opts.latents,
        "clock": opts.clock,
        "machine": info,
    }
    data |= {"ours_config": TomeConfig.from_dict(opts.ours_fields).to_dict(), "rows": [r.__dict__ for r in rows]}
    data |= extra
    data |= {"checks": [{"ok": ok, "text": text} for ok, text in checks], "notes": notes}
    data |= {"spread_warning": spread_line(rows), "wall_s": wall}
    paths[1].write_text(json.dumps(data, indent=2))
    write_plot(rows, paths[2], generation_steps(opts) if opts.steps else "one UNet step, batch 2", opts.latents)
    print(format_table(rows, opts.device, opts.latents, generation=bool(opts.steps)))
    print("\n".join(["", *([spread_line(rows) or ""]), *sections, ""]))
    print("\n".join([f"{'PASS' if ok else 'FAIL'}: {text}" for ok, text in checks] + [f"note: {n}" for n in notes]))
    shown = ", ".join(p.name if p.parent == opts.out else str(p) for p in paths)
    print(
        f"\nThe {opts.job} job took {wall / 60:.1f} min ({wall:.0f} s). Its report, data and plot are in {opts.out}/: {shown}"
    )
    return 0 if all(ok for ok, _ in checks) else 1
