"""Reporting: the markdown tables, machine information, the plot and bench.md."""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import os
import platform
import shlex
from collections.abc import Sequence
from pathlib import Path

import torch

from tome_core.bench.options import Options, OverheadRow, Row, spread_warning
from tome_core.bench.run import rss_bytes
from tome_core.config import TomeConfig

#: How the report names the samplers of the whole-generation mode.
SCHEDULER_LABELS = {"euler": "Euler", "dpm++2m": "DPM++ 2M"}


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


#: Plot colours and markers of the fixed variants; every other variant (ours:NAME, presets, peers) gets the next.
_STYLES = {"baseline": ("black", "x"), "ours": ("tab:blue", "o"), "tomesd": ("tab:orange", "s")}
_MORE_STYLES = (
    ("tab:green", "^"),
    ("tab:purple", "v"),
    ("tab:red", "D"),
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
    """(colour, marker) per variant name: fixed for baseline, ours and tomesd, the next free one for the rest."""
    styles = {k: v for k, v in _STYLES.items() if k in variants}
    extra = iter(_MORE_STYLES)
    for name in dict.fromkeys(variants):
        if name not in styles:
            styles[name] = next(extra, ("tab:gray", "*"))
    return styles


def write_plot(rows: Sequence[Row], path: Path, what: str = "one UNet step, batch 2") -> None:
    """Speed-up against deviation, one panel per (arch, size), one labelled marker per variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[tuple[str, str], list[Row]] = {}
    for r in rows:
        groups.setdefault((r.arch, r.size), []).append(r)
    fig, axes = plt.subplots(1, max(len(groups), 1), figsize=(6.5 * max(len(groups), 1), 5), squeeze=False)
    styles = plot_styles([r.variant for r in rows])
    for ax, ((arch, size), group) in zip(axes[0], groups.items()):
        for kind, (color, marker) in styles.items():
            pts = [r for r in group if r.variant == kind and r.median_s is not None and r.deviation is not None]
            if not pts:
                continue
            ax.scatter([r.deviation for r in pts], [r.speedup for r in pts], c=color, marker=marker, s=50, label=kind)
            for r in pts:
                if kind == "baseline":
                    continue
                ax.annotate(
                    kind if r.ratio is None else f"{kind} r={r.ratio:g}",
                    (r.deviation, r.speedup),
                    textcoords="offset points",
                    xytext=(5, 4),
                    fontsize=8,
                    color=color,
                )
        ax.axhline(1.0, color="grey", lw=0.6, ls=":")
        ax.set_title(f"{arch} {size}px: {what}")
        ax.set_xlabel("output deviation ||out - base|| / ||base||")
        ax.set_ylabel("speed-up over baseline (x)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="best")
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
    if opts.presets:
        lines.append(
            f"- presets: `tome_core.apply_patch({target}, preset=NAME)` for {', '.join(opts.presets)}"
            " (variants ours:preset=NAME; a preset fixes its own ratio, --ratios and --set do not apply)"
        )
    return lines


def _latent_line(opts: Options) -> str:
    timed = f"{opts.latents[0]} (timed)"
    more = [f"{k} (one more untimed run per variant)" for k in opts.latents[1:]]
    return (
        "- start latents: "
        + ", ".join([timed, *more])
        + "; noise = white noise, natural = power falling as 1/f^2 like real latents (archs.natural_latent)"
    )


def _results(rows: Sequence[Row], opts: Options, generation: bool) -> list[str]:
    lines = [format_table(rows, opts.device, opts.latents, generation=generation)]
    warning = spread_line(rows)
    if warning:
        lines.append("")
        lines.append(f"**{warning}**")
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
) -> str:
    """bench.md of the per-call mode."""
    command = "python -m tome_core.bench" + ("" if not argv else " " + shlex.join(argv))
    lines = [
        "# ToMe benchmark: one UNet step",
        "",
        f"Command: `{command}`",
        "",
        *[f"- {k}: {v}" for k, v in info.items()],
        f"- weights: {opts.checkpoint or f'random (seed {opts.seed})'}; inputs: seeded random (seed {opts.seed}),"
        f" batch 2 (cond + uncond), timestep {opts.timestep}",
        _latent_line(opts),
        f"- repeats: {opts.repeats} timed runs per variant after "
        + (f"{opts.warmup} warm-up round(s)" if opts.warmup else "one untimed baseline call (no warm-up round)")
        + ", variants interleaved round-robin",
        *_ours_lines(opts, "unet"),
        f"- tomesd: `tomesd.apply_patch(unet, ratio=r, max_downsample={opts.tomesd_max_downsample})`, other arguments"
        " at tomesd's defaults (sx=sy=2, use_rand=True, merge_attn only)",
        f"- total wall time: {wall:.1f} s; load average (1 min) at the end: {_loadavg()}",
        "",
        "## Results",
        "",
        *_results(rows, opts, generation=False),
        "",
        "median s: median wall time of one UNet call. speed-up: baseline median / median. spread: (max - min) /"
        " median of the timed runs. deviation: relative L2 distance of the output from the baseline output on the"
        " same input (first run).",
    ]
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
    command = "python -m tome_core.bench" + ("" if not argv else " " + shlex.join(argv))
    sampler = SCHEDULER_LABELS[opts.scheduler]
    lines = [
        f"# ToMe benchmark: whole generations, {opts.steps} {sampler} steps",
        "",
        f"Command: `{command}`",
        "",
        *[f"- {k}: {v}" for k, v in info.items()],
        f"- weights: {opts.checkpoint or f'random (seed {opts.seed})'}; a diffusers pipeline without VAE or text"
        f" encoders: seeded random prompt embeddings (seed {opts.seed}), classifier-free guidance {opts.guidance:g}"
        f" (batch 2 per UNet call), {opts.steps} {sampler} steps, output_type='latent'",
        _latent_line(opts),
        f"- repeats: {opts.repeats} timed generations per variant after "
        + (
            f"{opts.warmup} warm-up round(s)"
            if opts.warmup
            else "one untimed 1-step baseline generation (no warm-up round)"
        )
        + ", variants interleaved round-robin, the same global RNG seed for each",
        *_ours_lines(opts, "pipe"),
        "- peers: each from its PyPI package at its documented default and one faster setting (the setting column"
        " gives its arguments); see tome_core/bench/peers.py",
        f"- total wall time: {wall:.1f} s; load average (1 min) at the end: {_loadavg()}",
        "",
        "## Results",
        "",
        *_results(rows, opts, generation=True),
        "",
        "median s: median wall time of one generation. speed-up: baseline median / median. spread: (max - min) /"
        " median of the timed generations. deviation: relative L2 distance of the final latent from the baseline's"
        " (same start latent, same seed), after every step's error has propagated. PSNR: of the final latent, peak ="
        " the baseline latent's range.",
        "",
        "## Sanity checks",
        "",
        *[f"- {'PASS' if ok else 'FAIL'}: {text}" for ok, text in checks],
    ]
    if notes:
        lines += ["", "## Notes", "", *[f"- {n}" for n in notes]]
    return "\n".join(lines) + "\n"
