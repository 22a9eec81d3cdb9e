"""Reporting: the markdown tables, machine information, the plot and bench.md."""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import os
import platform
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from tome_core.bench.run import OverheadRow, Row, rss_bytes
from tome_core.config import TomeConfig

if TYPE_CHECKING:
    from tome_core.bench.cli import Options


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
        f"- repeats: {opts.repeats} timed runs per variant after "
        + (f"{opts.warmup} warm-up round(s)" if opts.warmup else "one untimed baseline call (no warm-up round)")
        + ", variants interleaved round-robin",
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
