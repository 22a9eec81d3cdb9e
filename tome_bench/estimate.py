"""`python -m tome_bench estimate`: what each preset (and tomesd) is expected to gain per UNet call on a GPU,
without a GPU: each call traced on the meta device and priced by `tome_bench.gpu_estimate`'s cost model fitted to
kernel profiles (about a minute). The main job puts the same table beside its timings.

Estimated: the GPU work of one call (the sum of its kernels' times, fp16, SDPA, batch 2) unpatched over patched,
what a call gains where the GPU is the bottleneck; and the kernel-launching operations a patch adds per call, what
it costs where the host is (eager calls below about 2048 px on a fast GPU).

`--write` writes the speed table the library reads, `tome_core/speed_table.json`: one row per family, preset and
size (`archs.Arch.table_sizes`), the estimated speed-up; rows that `gpu-job --write` measured stay measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

import tome_core
from tome_bench import archs, gpu_estimate, options, run
from tome_bench.gpu_estimate import GPUS, EstimateRow, meta_unet
from tome_bench.options import PRESET_PREFIX, Options, Row

#: The main job's grid: the sizes people generate at with each family on a GPU.
GRID: Mapping[str, tuple[int, ...]] = {"sd15": (512, 768, 1024), "sdxl": (1024,)}
SPEED_TABLE = Path(__file__).resolve().parents[1] / "tome_core" / "speed_table.json"
#: What a row of the speed table is, per source.
ESTIMATED = "GPU time of one model call, fp16, SDPA, batch {batch}: meta-device trace priced by the cost model fitted to the {gpu} profiles of {date}"
MEASURED = "GPU busy time of one model call (the sum of its kernels' durations, torch.profiler), fp16, batch {batch}, median of {n} profiled calls: `python -m tome_bench gpu-job` on {date}"
#: Patches by variant name: (apply, remove), remove None for `tome_core.remove_patch`.
Patches = Mapping[str, tuple[Callable[[torch.nn.Module], Any], Callable[[torch.nn.Module], Any] | None]]


def patches(
    presets: Sequence[str], tomesd: Any | None, ratios: Sequence[float], tomesd_md: str, unet: torch.nn.Module
) -> Patches:
    """The presets, then tomesd at each ratio where it merges anything on `unet` (a meta-device one will do)."""
    out: dict[str, Any] = {
        run.preset_variant_name(n): (lambda u, n=n: tome_core.apply_patch(u, preset=n), None) for n in presets
    }
    if tomesd is not None and not run.tomesd_merges_nothing(tomesd_md, unet):
        md = run.tomesd_max_downsample(tomesd_md, unet)
        out |= {f"tomesd r={r:g}": run.tomesd_patch(tomesd, r, md, 0, torch.device("cpu")) for r in ratios}
    return out


def rows(arch: str, sizes: Iterable[int], variants: Patches, gpu: str = "h200") -> list[EstimateRow]:
    applies = {name: apply for name, (apply, _) in variants.items()}
    removes = {name: remove for name, (_, remove) in variants.items() if remove is not None}
    return gpu_estimate.estimate_rows(arch, sizes, applies, gpus=(gpu,), remove=removes)


def display_name(variant: str) -> str:
    """'ours:preset=fast' -> 'Fast'; anything else as the results table names it."""
    name = variant.removeprefix(PRESET_PREFIX)
    return next((p.label for p in tome_core.presets() if p.name == name), variant)


def idle_note(arch: str, tomesd_md: str) -> str:
    return (
        f"{arch}: tomesd at max_downsample={tomesd_md} merges nothing on this architecture (no attention block at that"
        " level; SDXL has none at full resolution): its output would be the baseline's, so it is not timed or"
        " estimated (--tomesd-max-downsample auto runs it at the first level with attention)"
    )


def _percent_range(values: Sequence[float]) -> str:
    low, high = min(values), max(values)
    return f"{low:+.0%}" if round(low * 100) == round(high * 100) else f"{low:+.0%} to {high:+.0%}"


def format_table(
    est: Sequence[EstimateRow], idle: Mapping[str, str], measured: Sequence[Row] = (), measured_on: str = ""
) -> str:
    """A row per variant (the presets first), a column per (architecture, size) timed here (`measured`: the measured
    speed-up), one per (architecture, size) estimated and one per architecture for the operations added. `idle`:
    architecture -> variant that merges nothing there (tomesd's default on SDXL)."""
    gpu = GPUS[est[0].gpu].name.removeprefix("NVIDIA ") if est else "GPU"
    label = lambda a: archs.get_arch(a).label
    timed = list(dict.fromkeys((r.arch, r.size) for r in measured))
    cols = list(dict.fromkeys((r.arch, r.size) for r in est))
    arches = list(dict.fromkeys(r.arch for r in est))
    header = ["variant", *(f"{label(a)} {s} px, {measured_on} (measured)" for a, s in timed)]
    header += [f"{label(a)} {s} px, {gpu} (est.)" for a, s in cols] + [f"ops added, {label(a)}" for a in arches]
    base = {(r.arch, r.size): r for r in est}
    lines = [["unpatched: GPU work per call / kernel-launching ops", *["1.00x" for _ in timed]]]
    lines[0] += [f"{base[k].base_gpu_ms:.1f} ms" for k in cols] + [
        f"{next(r.base_launching for r in est if r.arch == a)} ops" for a in arches
    ]
    by_est = {(r.arch, r.size, r.variant): r for r in est}
    by_row = {(r.arch, r.size, r.label): r for r in measured}
    names = list(
        dict.fromkeys(
            [*(r.variant for r in est), *(r.label for r in measured if r.variant != "baseline"), *idle.values()]
        )
    )
    for name in sorted(names, key=lambda n: not n.startswith(PRESET_PREFIX)):
        cells = [display_name(name)]
        for arch, size in timed:
            r = by_row.get((arch, size, name))
            cells.append(
                ("merges nothing" if idle.get(arch) == name else "-") if r is None else _fmt_x(r.speedup, "error")
            )
        for arch, size in cols:
            e = by_est.get((arch, size, name))
            cells.append(("merges nothing" if idle.get(arch) == name else "-") if e is None else _fmt_x(e.speedup))
        added = [[r.ops_added for r in est if r.arch == a and r.variant == name] for a in arches]
        lines.append(cells + [_percent_range(v) if v else "-" for v in added])
    from tome_bench.report import markdown_table

    return markdown_table(header, lines)


def _fmt_x(value: float | None, none: str = "-") -> str:
    return none if value is None else f"{value:.2f}x"


def explanation(gpu: str) -> str:
    spec = GPUS[gpu]
    return (
        "Estimated on this machine, not measured on a GPU: each UNet call (batch 2, fp16, SDPA attention) is traced on"
        " PyTorch's meta device (no weights, nothing computed) and every kernel it would launch is priced by a cost"
        f" model of the {spec.name} (a roofline per kind of operation plus a minimum time per kernel) fitted to kernel"
        f" profiles: {spec.source}. (est.): the estimated GPU work of the unpatched call over the patched one, what a"
        " call gains where the GPU is the bottleneck (large images, CUDA graphs, a slower card). ops added:"
        " kernel-launching operations the patch adds per call; in eager mode below about 2048 px a fast GPU waits for"
        " the host to launch its kernels, so there the wall clock gains less than the estimated GPU work, or loses."
    )


def payload(est: Sequence[EstimateRow], gpu: str) -> dict[str, Any]:
    """The estimate in the JSON: the GPU, the model's source, and every row with its speed-up and ops added."""
    extra = lambda r: {"speedup": r.speedup, "ops_added": r.ops_added, "flops_saved": r.flops_saved}
    return {"gpu": GPUS[gpu].name, "source": GPUS[gpu].source, "rows": [dataclasses.asdict(r) | extra(r) for r in est]}


def run_estimate(
    names: Sequence[str],
    sizes: Mapping[str, Sequence[int]],
    presets: Sequence[str],
    tomesd: Any | None,
    ratios: Sequence[float],
    tomesd_md: str,
    gpu: str,
) -> tuple[list[EstimateRow], dict[str, str]]:
    """The estimate rows of every architecture and size, and architecture -> the tomesd variant idle there."""
    est: list[EstimateRow] = []
    idle: dict[str, str] = {}
    for name in names:
        unet = meta_unet(name)
        if tomesd is not None and run.tomesd_merges_nothing(tomesd_md, unet):
            idle[name] = ", ".join(f"tomesd r={r:g}" for r in ratios)
        with run.task(
            f"GPU estimate: {name} {', '.join(map(str, sizes[name]))} px on the {GPUS[gpu].name}, traced on the meta device"
        ):
            est += rows(name, sizes[name], patches(presets, tomesd, ratios, tomesd_md, unet), gpu)
    return est, idle


def section(opts: Options, tomesd: Any | None, measured: Sequence[Row]) -> tuple[list[str], dict[str, Any]]:
    """The main job's section: the estimate at `GRID` (a test UNet: its square timed sizes) beside the timings."""
    names = [s.name for s in opts.arches]
    sizes = {n: GRID.get(n) or [h for h, w in opts.sizes_of(n) if h == w] for n in names}
    est, idle = run_estimate(names, sizes, opts.presets, tomesd, opts.ratios, opts.tomesd_max_downsample, opts.gpu)
    on = f"{opts.device.type} {opts.dtype_name}"
    lines = [f"## What to expect on a GPU (estimated, not measured: {GPUS[opts.gpu].name}, fp16)", ""]
    lines += [f"Speed-up per UNet call: measured here ({on}) beside the estimate for a GPU.", ""]
    lines += [format_table(est, idle, measured, on), "", explanation(opts.gpu)]
    return lines, payload(est, opts.gpu)


# ---------------------------------------------------------------------------------------------- the speed table


def table_rows(
    families: Iterable[archs.Arch] | None = None, gpu: str = "h200"
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(sources, rows) of the speed table: every preset at every `table_sizes` size of each architecture that has
    them, estimated; speedup = unpatched GPU time over patched, rounded to 3 decimals."""
    spec, out = GPUS[gpu], []
    key = f"{gpu}-estimate-{spec.fitted}"
    presets = options.preset_names()
    for arch in families or [a for a in archs.ARCHS.values() if a.table_sizes]:
        variants = {n: (lambda u, n=n: tome_core.apply_patch(u, preset=n), None) for n in presets}
        with run.task(f"speed table: {arch.name} at {', '.join(map(str, arch.table_sizes))} px"):
            for r in rows(arch.name, arch.table_sizes, variants, gpu):
                row = {"family": arch.family, "preset": r.variant, "width": r.size, "height": r.size, "frames": 1}
                out.append(row | {"speedup": round(r.speedup, 3), "source": key})
    what = ESTIMATED.format(batch=2, gpu=spec.name.removeprefix("NVIDIA "), date=spec.fitted)
    return {key: {"device": spec.name, "measured": False, "what": what}}, out


def write_table(sources: Mapping[str, Any], rows: Sequence[Mapping[str, Any]], path: Path = SPEED_TABLE) -> None:
    """The speed table, deterministic: rows sorted by family, preset order and size, one row a line. The file's rows
    stay unless `rows` replace them; an estimated row never replaces a measured one; unused sources are dropped."""
    sources, keyed = dict(sources), {}
    old = json.loads(path.read_text()) if path.exists() else {"sources": {}, "rows": []}
    for row in old["rows"]:
        keyed[_key(row)] = row
        sources.setdefault(row["source"], old["sources"][row["source"]])
    for row in rows:
        there = keyed.get(_key(row))
        if there is None or sources[row["source"]]["measured"] or not sources[there["source"]]["measured"]:
            keyed[_key(row)] = row
    order = {name: i for i, name in enumerate(options.preset_names())}
    ordered = sorted(keyed.values(), key=lambda r: (r["family"], order.get(r["preset"], len(order)), *_key(r)[2:]))
    used = {r["source"] for r in ordered}
    about = (
        "written by `python -m tome_bench estimate --write` (and `gpu-job ... --write` for measured rows); do not edit"
    )
    head = {"about": about, "sources": {k: v for k, v in sorted(sources.items()) if k in used}}
    text = json.dumps(head, indent=1)[:-2] + ',\n "rows": [\n' + ",\n".join("  " + json.dumps(r) for r in ordered)
    path.write_text(text + "\n ]\n}\n")


def _key(row: Mapping[str, Any]) -> tuple[Any, ...]:
    return row["family"], row["preset"], row["width"], row["height"], row["frames"]


def measured_rows(data: Mapping[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(sources, rows) measured by a GPU job (its gpu.json): each preset's reliable GPU busy time against its
    reliable baseline's at a size of its architecture's speed table."""
    device, n = data["device"], data.get("profiles", 0)
    key = f"{re.sub(r'[^a-z0-9]+', '-', device.lower()).strip('-')}-measured-{data['date'][:10]}"
    what = MEASURED.format(batch=2, n=n, date=data["date"][:10])
    out = []
    busy = {(r["arch"], r["size"], r["variant"]): r for r in data["rows"] if r.get("busy_reliable")}
    for (arch, size, variant), r in busy.items():
        base, spec = busy.get((arch, size, "baseline")), archs.ARCHS.get(arch)
        if variant in options.preset_names() and base is not None and spec is not None and size in spec.table_sizes:
            row = {"family": spec.family, "preset": variant, "width": size, "height": size, "frames": 1}
            out.append(row | {"speedup": round(base["gpu_busy_ms"] / r["gpu_busy_ms"], 3), "source": key})
    return {key: {"device": device, "measured": True, "what": what}}, out


# ---------------------------------------------------------------------------------------------- the command


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tome_bench estimate", description=__doc__.split("\n\n")[0])
    p.add_argument("--write", action="store_true", help="write the speed table tome_core/speed_table.json instead")
    p.add_argument(
        "--dit",
        action="store_true",
        help="the diffusion transformers' full-size configs instead (tome_bench.dit_archs; about 20 minutes on 2 cores;"
        " --arch FAMILY,...: those families alone)",
    )
    sizes = ", ".join(f"{archs.get_arch(a).label} {'/'.join(map(str, s))}" for a, s in GRID.items())
    defaults = {"arch": "sd15,sdxl", "sizes": sizes, "presets": "all"}
    return options.add(p, "arch", "sizes", "presets", "gpu", "tomesd-max-downsample", defaults=defaults)


def main(argv: Sequence[str]) -> int:
    def make(a: argparse.Namespace) -> tuple[argparse.Namespace, list[str], dict[str, list[int]]]:
        names = [n.strip() for n in (a.arch or "sd15,sdxl").split(",") if n.strip()]
        asked = options.parse_sizes(a.sizes, names, {n: ",".join(map(str, GRID.get(n, (128,)))) for n in names})
        if any(h != w for sizes in asked.values() for h, w in sizes):
            raise ValueError(f"estimate takes square sizes (W, not WxH), got {a.sizes!r}")
        if a.gpu not in GPUS:
            raise ValueError(f"--gpu: one of {', '.join(GPUS)}, got {a.gpu!r}")
        return a, names, {n: [h for h, _ in sizes] for n, sizes in asked.items()}

    def make_dit(a: argparse.Namespace) -> list[str]:
        from tome_bench.dit_archs import TABLE_ARCH

        return options.names(a.arch, list(TABLE_ARCH), "--arch (families with --dit)") if a.arch else []

    if "--dit" in argv:
        a = build_parser().parse_args(argv)
        return dit_estimate(a.write, a.gpu, options.parse(build_parser(), argv, make_dit))
    a, names, sizes = options.parse(build_parser(), argv, make)
    if a.write:
        write_table(*table_rows([archs.get_arch(n) for n in names] if a.arch else None, a.gpu))
        print(f"wrote {SPEED_TABLE}")
        return 0
    presets = options.names(a.presets, options.preset_names(), "--presets") if a.presets else options.preset_names()
    tomesd, why = run.load_tomesd()
    est, idle = run_estimate(names, sizes, presets, tomesd, [0.5], a.tomesd_max_downsample, a.gpu)
    print(f"## What to expect on a GPU (estimated, not measured: {GPUS[a.gpu].name}, fp16)\n")
    print(format_table(est, idle) + "\n\n" + explanation(a.gpu))
    print("\n".join(f"note: {idle_note(arch, a.tomesd_max_downsample)}" for arch in idle))
    print(f"note: {why}" if tomesd is None else "", end="")
    return 0


def dit_estimate(write: bool, gpu: str = "h200", families: Sequence[str] = ()) -> int:
    """Every preset on each diffusion transformer family's full-size config (`dit_archs.TABLE_ARCH`; `families`:
    those alone) at its table sizes: printed, or written into the speed table (batch as the family samples)."""
    from tome_bench import dit_archs

    spec, rows, sources = GPUS[gpu], [], {}
    head = "| family | size | batch | preset | less GPU time | launching ops added | host / GPU time (ms) |"
    print(head + " peak memory (the call's tensors) |\n|---|---|---:|---|---:|---:|---:|---:|")
    for family, name in dit_archs.TABLE_ARCH.items():
        if families and family not in families:
            continue
        arch = dit_archs.DIT_ARCHS[name]
        key = f"{gpu}-estimate-{spec.fitted}-batch{arch.batch}"
        what = ESTIMATED.format(batch=arch.batch, gpu=spec.name.removeprefix("NVIDIA "), date=spec.fitted)
        sources[key] = {"device": spec.name, "measured": False, "what": what}
        for size in arch.sizes:
            for r in dit_archs.estimate_rows(arch, options.preset_names(), gpu, [size]):
                size_text = f"{size[0]}x{size[1]}" + (f"x{size[2]}" if size[2] > 1 else "")
                peak = f"{r.peak_ratio:.3f}x ({r.peak_bytes / 2**30:.2f} GiB)"
                host = f"{r.host_ms:.1f} / {r.gpu_ms:.1f}{'' if r.hidden else ' host-bound'}"
                print(
                    f"| {family} | {size_text} | {arch.batch} | {r.variant} | {r.speedup:.3f} | {r.ops_added:+.1%}"
                    f" | {host} | {peak} |"
                )
                row = {"family": family, "preset": r.variant, "width": size[0], "height": size[1], "frames": size[2]}
                rows.append(row | {"speedup": round(r.speedup, 3), "source": key})
    if write:
        write_table(sources, rows)
        print(f"wrote {SPEED_TABLE}")
    return 0
