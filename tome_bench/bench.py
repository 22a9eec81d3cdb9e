"""The main job, `python -m tome_bench` (`python -m tome_bench main`, `make bench`): every preset of
`tome_core.presets()` on SD1.5 and SDXL with random weights, beside the unpatched UNet and tomesd at its defaults, one
UNet call (batch 2) per variant and round: an untimed round on the natural start latent (its deviation, and every
variant's first call), then the timed rounds on white noise; beside the results the merge overhead per block, the
GPU estimate (`estimate`) and how much each preset changes the image on the stand-ins (`fidelity`).

On a CPU: SD1.5 at 512 px and SDXL at 640 px, four timed rounds, about 20 minutes on 2 cores; where CUDA is available
on the GPU in fp16 (SD1.5 at 512 and 1024 px, SDXL at 1024 px, twenty timed rounds). `compare` runs the same calls
for other variants (`compare.py`). Writes OUT/bench.md, bench.json and bench.png.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections.abc import Sequence
from typing import Any

import torch

from tome_bench import archs, estimate, options, report, run
from tome_bench.options import Defaults, Options, Row

#: The main job on a CPU (a quiet round took 33 s and 77 s on 2 cores: docs/benchmarks.md), and on CUDA: the sizes
#: people generate at on a GPU, and more rounds, as a GPU call takes milliseconds and varies more.
_MAIN = {"latents": "noise,natural", "variants": "baseline,tomesd", "presets": "all", "arches": "sd15,sdxl"}
MAIN = Defaults({"sd15": "512", "sdxl": "640"}, 4, **_MAIN)
MAIN_CUDA = Defaults({"sd15": "512,1024", "sdxl": "1024"}, 20, **_MAIN)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tome_bench [main]", description=__doc__.split("\n\n")[0])
    defaults = {
        "arch": MAIN.arches,
        "sizes": "sd15:512,sdxl:640 (cuda: sd15:512,sd15:1024,sdxl:1024)",
        "presets": "all",
    }
    defaults |= {"repeats": "4 (cuda: 20)", "latents": MAIN.latents, "device": "cuda where available", "out": MAIN.out}
    keys = ("arch", "sizes", "presets", "repeats", "latents", "device", "dtype", "threads", "clock", "out", "plot")
    return options.add(p, *keys, "seed", "checkpoint", "gpu", defaults=defaults)


def parse_options(argv: Sequence[str]) -> Options:
    def make(a: argparse.Namespace) -> Options:
        cuda = a.device is None and a.clock != "cpu" and torch.cuda.is_available()
        opts = options.build("main", a, MAIN_CUDA if cuda else MAIN, "cuda" if cuda else None)
        if cuda:
            opts.device_note = (
                "CUDA is available: the main job runs on the GPU in fp16 (--device cpu times the CPU instead)"
            )
        return opts

    return options.parse(build_parser(), argv, make)


def header(opts: Options, tomesd: Any | None) -> str:
    """What the main job is about to do, where, and where it writes."""
    where = f"{opts.device.type} in {opts.dtype_name}"
    threads = torch.get_num_threads()
    where += (
        f" on the {torch.cuda.get_device_name(opts.device)}"
        if opts.device.type == "cuda"
        else f", {threads} torch thread(s)"
    )
    sizes = "; ".join(f"{s.label} at {', '.join(map(run.size_label, opts.sizes_of(s.name)))} px" for s in opts.arches)
    presets = ", ".join(estimate.display_name(run.preset_variant_name(n)) for n in opts.presets) or "no preset"
    tomesd_text = f" and tomesd {', '.join(f'r={r:g}' for r in opts.ratios)} at its defaults" if tomesd else ""
    rounds = f"{opts.repeats} timed rounds"
    if run.extra_latents_first(opts):
        rounds = (
            f"an untimed round on the {' and '.join(opts.latents[1:])} start latent, then {rounds} on {opts.latents[0]}"
        )
    lines = [
        f"The main job: {sizes}; the unpatched UNet, the presets {presets}{tomesd_text}; one UNet call (batch 2) per"
        f" variant and round: {rounds}; then the GPU estimate. On {where}. Output: {opts.out}/"
    ]
    return "\n".join(lines + ([opts.device_note] if opts.device_note else []))


def run_calls(opts: Options, argv: Sequence[str]) -> int:
    """The main job and `compare`: one UNet call per variant and round at every architecture and size; the main job
    adds the GPU estimate and the stand-ins' change of the image."""
    started = time.perf_counter()
    if opts.threads is not None:
        torch.set_num_threads(opts.threads)
    notes: list[str] = []
    tomesd, tomesd_version = run.load_tomesd() if "tomesd" in opts.variants else (None, None)
    if tomesd is None and tomesd_version:
        print(tomesd_version, file=sys.stderr)
        notes.append(tomesd_version)
        tomesd_version = None
    info = report.machine_info(opts, tomesd_version)
    if opts.main_job:
        print(header(opts, tomesd), flush=True)
    plan: dict[str, tuple[int, float]] = {}
    for spec in opts.arches:
        meta = estimate.meta_unet(spec.name)
        if opts.main_job and tomesd is not None and run.tomesd_merges_nothing(opts.tomesd_max_downsample, meta):
            notes.append(estimate.idle_note(spec.name, opts.tomesd_max_downsample))
        calls = run.calls_per_size(opts, len(run.make_variants(opts, meta, tomesd)))
        plan |= {
            f"{spec.name} {size}": (calls, run.call_flops(meta, spec.name, size)) for size in opts.sizes_of(spec.name)
        }
    progress = run.CallBar(plan)
    run.say(f"{progress.calls} UNet calls planned")
    rows: list[Row] = []
    overhead: list[run.OverheadRow] = []
    checks: list[tuple[bool, str]] = []
    for spec in opts.arches:
        with run.task(f"{spec.name}: building the UNet ({opts.checkpoint or 'random weights'}, {opts.dtype_name})"):
            unet = archs.build_unet(spec, opts.dtype, opts.device, opts.seed)
            if opts.checkpoint:
                archs.load_checkpoint(unet, opts.checkpoint, spec)
        for size in opts.sizes_of(spec.name):
            with run.task(f"{spec.name} {run.size_label(size)}px merge overhead per block"):
                overhead += run.bench_overhead(opts, unet, spec, size, tomesd)
            progress.group(f"{spec.name} {size}")
            rows += run.bench_size(opts, unet, spec, size, tomesd, checks, progress)
        del unet
        gc.collect()
        if opts.device.type == "cuda":
            torch.cuda.empty_cache()
    progress.close()
    sections = [
        "## Merge overhead per block", "", "What each preset adds per block on the product's path (`tome_bench.run.bench_overhead`), at the first level"
        " where it merges and the first where it pools keys/values: plan = the step's random partition, band_match and"
        " band_merge (once per call and stack with one plan per stack); merge + unmerge = merge_with_residual and"
        " unmerge_add of a block merged whole; pool = kv_downsample; tomesd = its bipartite_soft_matching_random2d"
        " merging the same share of the same tokens in the same cells. Median of torch.utils.benchmark.Timer.",
        "", report.format_overhead(overhead),
    ]  # fmt: skip
    extra: dict[str, Any] = {"merge_overhead": [r.__dict__ for r in overhead]}
    if opts.main_job:
        from tome_bench import fidelity

        table, extra["gpu_estimate"] = estimate.section(opts, tomesd, rows)
        with run.task("change of the image on the stand-ins (one call each)"):
            stand_in = fidelity.main_job_rows([spec.name for spec in opts.arches], opts)
        extra["stand_in_change"] = [row.__dict__ for row in stand_in]
        sections += ["", *table, "", *fidelity.main_job_section(stand_in)]
    return report.finish(opts, argv, rows, checks, notes, info, started, extra=extra, sections=sections)


def main(argv: Sequence[str]) -> int:
    return run_calls(parse_options(argv), ["main", *argv])
