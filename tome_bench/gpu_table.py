"""What to expect on a GPU, beside the CPU figures: each variant of a run (the presets, tomesd) estimated per UNet
call on a GPU by `tome_bench.gpu_estimate` (a meta-device trace priced by a cost model fitted to kernel profiles),
without a GPU. The main job puts the table in its report; `--gpu-estimate` prints it alone.

Estimated: the GPU work of one call (the sum of its kernels' times, fp16, SDPA, batch 2) unpatched over patched,
what a call gains where the GPU is the bottleneck; and the kernel-launching operations a patch adds per call, what
it costs where the host is (eager calls below about 2048 px on a fast GPU).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from torch import nn

import tome_core
from tome_bench import archs, gpu_estimate, run
from tome_bench.gpu_estimate import EstimateRow
from tome_bench.options import PRESET_PREFIX, Options, Row

#: The estimate's grid when not told otherwise: the sizes people generate at with each family on a GPU.
ESTIMATE_SIZES: Mapping[str, tuple[int, ...]] = {"sd15": (512, 768, 1024), "sdxl": (1024,)}


def estimate_sizes(arches: Iterable[str], timed: Mapping[str, Sequence[tuple[int, int]]]) -> dict[str, list[int]]:
    """The grid per architecture: `ESTIMATE_SIZES`, or for another architecture (the tests' tiny ones) its square
    timed sizes."""
    return {name: list(ESTIMATE_SIZES.get(name) or [h for h, w in timed.get(name, ()) if h == w]) for name in arches}


def variants_of(opts: Options, unet: nn.Module, tomesd: Any | None) -> list[run.Variant]:
    """The run's variants but the baseline (the estimate's reference), as `run.make_variants` makes them: presets,
    ours at each ratio, tomesd (at --tomesd-max-downsample, its RNG seeded); `unet` can be a meta-device one."""
    return run.make_variants(opts, unet, tomesd)[1:]


def estimate(
    opts: Options, arch: str, size: int, tomesd: Any | None, *, batch: int = 2
) -> tuple[list[EstimateRow], list[str]]:
    """The estimate rows of every variant of `opts` for `arch` at `size` px on `opts.gpu`, and the variant names in
    the order of the run."""
    unet = gpu_estimate.meta_unet(arch)
    variants = variants_of(opts, unet, tomesd)
    applies: dict[str, Callable[[nn.Module], Any]] = {v.label: v.apply for v in variants}
    removes: dict[str, Callable[[nn.Module], Any]] = {v.label: v.remove for v in variants}
    rows = gpu_estimate.estimate_rows(arch, [size], applies, gpus=(opts.gpu,), batch=batch, remove=removes)
    return rows, list(applies)


def display_name(variant: str) -> str:
    """'ours:preset=fast' -> 'Fast'; anything else as the results table names it."""
    if variant.startswith(PRESET_PREFIX):
        name = variant[len(PRESET_PREFIX) :]
        return next((p.label for p in tome_core.presets() if p.name == name), name)
    return variant


def _arch_label(name: str) -> str:
    return archs.get_arch(name).label


def _percent_range(values: Sequence[float]) -> str:
    low, high = min(values), max(values)
    if round(low * 100) == round(high * 100):
        return f"{low:+.0%}"
    return f"{low:+.0%} to {high:+.0%}"


def format_table(
    rows: Sequence[EstimateRow],
    order: Sequence[str],
    *,
    measured: Sequence[Row] = (),
    measured_on: str = "",
    idle: Mapping[str, str] | None = None,
) -> str:
    """The estimate as a markdown table: a row per variant, a column per (architecture, size) estimated, one per
    architecture for the operations added; with `measured` (the run's rows) first a column per (architecture, size)
    timed here, the measured speed-up. `idle`: architecture -> variant that merges nothing there (tomesd's default
    on SDXL), shown as such."""
    idle = idle or {}
    gpu = gpu_estimate.GPUS[rows[0].gpu].name.removeprefix("NVIDIA ") if rows else "GPU"
    timed = list(dict.fromkeys((r.arch, r.size) for r in measured))
    est = list(dict.fromkeys((r.arch, r.size) for r in rows))
    arches = list(dict.fromkeys(r.arch for r in rows))
    header = ["variant"]
    header += [f"{_arch_label(a)} {s} px, {measured_on} (measured)" for a, s in timed]
    header += [f"{_arch_label(a)} {s} px, {gpu} (est.)" for a, s in est]
    header += [f"ops added, {_arch_label(a)}" for a in arches]
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    base = {(r.arch, r.size): r for r in rows}
    unpatched = ["unpatched: GPU work per call / kernel-launching ops"]
    unpatched += ["1.00x" for _ in timed]
    unpatched += [f"{base[k].base_gpu_ms:.1f} ms" for k in est]
    unpatched += [f"{next(r.base_launching for r in rows if r.arch == a)} ops" for a in arches]
    lines.append("| " + " | ".join(unpatched) + " |")
    by_key = {(r.arch, r.size, r.variant): r for r in rows}
    by_row = {(r.arch, r.size, r.variant if r.ratio is None else f"{r.variant} r={r.ratio:g}"): r for r in measured}
    # The presets first, from the most faithful to the fastest, then the rest (tomesd) in the run's order.
    names = list(dict.fromkeys([*order, *(r.variant for r in rows), *idle.values()]))
    names.sort(key=lambda n: not n.startswith(PRESET_PREFIX))
    for name in names:
        cells = [display_name(name)]
        for arch, size in timed:
            row = by_row.get((arch, size, name))
            if row is None:
                cells.append("merges nothing" if idle.get(arch) == name else "-")
            else:
                cells.append("error" if row.speedup is None else f"{row.speedup:.2f}x")
        for arch, size in est:
            r = by_key.get((arch, size, name))
            cells.append(("merges nothing" if idle.get(arch) == name else "-") if r is None else f"{r.speedup:.2f}x")
        for arch in arches:
            added = [r.ops_added for r in rows if r.arch == arch and r.variant == name]
            cells.append(_percent_range(added) if added else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def explanation(gpu_key: str) -> str:
    """What the estimate is, under its table: which GPU, that it is a model, what it was fitted to."""
    spec = gpu_estimate.GPUS[gpu_key]
    return (
        f"Estimated on this machine, not measured on a GPU: each UNet call (batch 2, fp16, SDPA attention) is traced"
        " on PyTorch's meta device (no weights, nothing computed) and every kernel it would launch is priced by a cost"
        f" model of the {spec.name} (a roofline per kind of operation plus a minimum time per kernel) fitted to kernel"
        f" profiles: {spec.source}. (est.): the estimated GPU work of the unpatched call over the patched one, what a"
        " call gains where the GPU is the bottleneck (large images, torch.compile with CUDA graphs, a slower card)."
        " ops added: kernel-launching operations the patch adds per call, as a share of the unpatched call's; in"
        " eager mode below about 2048 px a fast GPU waits for the host to launch its kernels, so there the wall clock"
        " gains less than the estimated GPU work, or loses."
    )


def payload(rows: Sequence[EstimateRow], gpu_key: str) -> dict[str, Any]:
    """The estimate in the JSON: the GPU, the model's source, and every row with its speed-up and ops added."""
    spec = gpu_estimate.GPUS[gpu_key]
    return {
        "gpu": spec.name,
        "source": spec.source,
        "rows": [
            {**dataclasses.asdict(r), "speedup": r.speedup, "ops_added": r.ops_added, "flops_saved": r.flops_saved}
            for r in rows
        ],
    }
