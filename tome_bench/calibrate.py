"""Fit `gpu_estimate.GpuSpec` to GPU kernel profiles and report the estimate's error against each.

A profile gives per (arch, size, variant) the GPU busy time of one UNet call and the device time per aten
operation: `python -m tome_bench gpu-job` writes OUT/gpu.json ({"device", "rows"}; each eager row carries the
TomeConfig it ran as `fields`, so any variant, candidates included, is rebuilt with `apply_patch(unet, **fields)`),
and the older runs in docs/runs hold lists of rows without fields (their variants are named: `LEGACY_VARIANTS`).
The same call is traced on the meta device here, priced per operation, and the parameters are fitted to the
profile's per-operation times (log error, so that small and large operations weigh alike); a profile that another
process disturbed (`gpu_job.disturbed`) is left out of the fit. `python -m tome_bench.calibrate PROFILE.json ...`
prints the fit and the error table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from tome_bench.gpu_estimate import KIND, GpuSpec, TracedOp, meta_unet, trace_call

#: What patches a UNet (or undoes that).
Patch = Callable[[torch.nn.Module], Any]

#: The aten names a CUDA profile shows, mapped to the names the meta trace records.
CUDA_NAMES: Mapping[str, str] = {
    "aten::_cudnn_attention_forward": "attention",
    "aten::_flash_attention_forward": "attention",
    "aten::_efficient_attention_forward": "attention",
    "aten::_scaled_dot_product_cudnn_attention": "attention",
    "aten::cudnn_convolution": "convolution",
    "aten::copy_": "clone",
    "aten::index_add_": "index_add",
    "aten::add_": "add",
    "aten::mul_": "mul",
    "aten::scatter_": "scatter",
    "aten::index_fill_": "index_fill",
    "aten::index_copy_": "index_copy",
    "aten::zero_": "zero",
    "aten::fill_": "fill",
}


def profile_name(aten: str) -> str:
    if aten in CUDA_NAMES:
        return CUDA_NAMES[aten]
    name = aten.removeprefix("aten::")
    return name[:-1] if name.endswith("_") and not name.startswith("_") else name


def profile_kind(aten: str) -> str:
    """The cost model's kind of a CUDA profile's operation (index_select and gather alike, fills as memory)."""
    return KIND.get(profile_name(aten), "memory")


def _aggregate(ops: Sequence[TracedOp]) -> dict[tuple[str, str], TracedOp]:
    """The operations summed per kind: the cost model is linear in bytes, FLOPs and kernels."""
    sums: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for op in ops:
        acc = sums[op.kind, op.kind]
        acc[0] += op.flops
        acc[1] += op.bytes
        acc[2] += op.kernels
    return {key: TracedOp(key[0], key[1], f, b, int(k)) for key, (f, b, k) in sums.items()}


def _grouped_ms(ops: Mapping[tuple[str, str], TracedOp], gpu: GpuSpec) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for (name, _), op in ops.items():
        out[name] += gpu.op_ms(op)
    return out


@dataclasses.dataclass
class Point:
    """One profiled call: what the GPU measured and the meta trace of the same call."""

    label: str
    busy_ms: float
    per_name_ms: dict[str, float]
    ops: dict[tuple[str, str], TracedOp]  # summed per (profile name, kind)
    #: Its untouched operations ran slower than the baseline's (`gpu_job.disturbed`): left out of the fit.
    disturbed: bool = False


#: The variants of the profiles that carry no fields (docs/runs before `--gpu-job`), by name: the extras with fixed
#: settings. Their preset rows are left out: the presets were chosen again since, and a name would price today's
#: preset against another one's measurement.
LEGACY_VARIANTS: Mapping[str, Mapping[str, Any] | None] = {
    "baseline": None,
    "kv2-l1": {"mode": "kv", "max_downsample": 1},
    "kv4-l1": {"mode": "kv", "max_downsample": 1, "sx": 4, "sy": 4},
    "kv4-l4": {"mode": "kv", "max_downsample": 4, "sx": 4, "sy": 4},
    "tome.5-l1": {"ratio": 0.5, "max_downsample": 1},
    "kv4": {"mode": "kv", "sx": 4, "sy": 4},
    "mlp.9-l4-nocross": {"mode": "kv", "merge_mlp": True, "mlp_min_downsample": 4, "mlp_ratio": 0.9},
}
_UNKNOWN = object()


def profile_rows(path: Path) -> list[dict[str, Any]]:
    """The profiled eager calls of a profile file: gpu.json's rows of the eager part, or an older file's list."""
    data = json.loads(Path(path).read_text())
    rows = data["rows"] if isinstance(data, dict) else data
    return [r for r in rows if "gpu_busy_ms" in r and r.get("part", "eager") == "eager"]


def patcher(row: Mapping[str, Any]) -> tuple[Patch | None, Patch | None] | object:
    """(apply, remove) of the variant a row measured (None, None for the unpatched UNet), from its `fields` or, in an
    older profile, its name; `_UNKNOWN` when neither says (a variant of an older run that no name here describes)."""
    from tome_core import apply_patch

    fields = row["fields"] if "fields" in row else LEGACY_VARIANTS.get(row["variant"], _UNKNOWN)
    if fields is _UNKNOWN:
        return _UNKNOWN
    if fields is None:
        return None, None
    if fields == "tomesd":
        try:
            import tomesd
        except ImportError:
            return _UNKNOWN
        return (lambda unet: tomesd.apply_patch(unet, ratio=0.5)), tomesd.remove_patch
    return (lambda unet, f=dict(fields): apply_patch(unet, **f)), None


def load_points(paths: Sequence[Path]) -> list[Point]:
    """A point per profiled call whose variant can be rebuilt (`patcher`), its ops summed per cost-model kind."""
    from tome_bench.gpu_job import disturbed

    # A row is disturbed or not beside the baseline of its own run.
    rows = [(row, i) for i, path in enumerate(paths) for row in profile_rows(path)]
    bases = {(i, r["arch"], r["size"]): r for r, i in rows if r["variant"] == "baseline"}
    points, unets = [], {}
    for row, run in rows:
        found = patcher(row)
        if found is _UNKNOWN:
            continue
        apply, remove = found  # type: ignore[misc]
        arch = row["arch"]
        if arch not in unets:
            unets[arch] = meta_unet(arch)
        label = f"{arch} {row['size']} {row['variant']}"
        try:
            tr = trace_call(unets[arch], arch, row["size"], apply, remove=remove)
        except ValueError as exc:  # an older run's settings that today's TomeConfig refuses: that call is left out
            print(f"{label}: left out, {exc}", file=sys.stderr)
            continue
        per_name: dict[str, float] = defaultdict(float)
        if "ops" in row:  # gpu_job: [name, shapes, count, device ms, cpu ms] per (name, shapes)
            for op in row["ops"]:
                per_name[profile_kind(op[0])] += op[3]
        else:  # tome_gpu_profile.py: the top operations, [name, count, device ms, cpu ms]
            for op in row["top"]:
                per_name[profile_kind(op[0])] += op[2]
        noisy = row.get("busy_reliable") is False or (
            "ops" in row and disturbed(row, bases.get((run, arch, row["size"])))
        )
        points.append(Point(label, row["gpu_busy_ms"], dict(per_name), _aggregate(tr.ops), noisy))
    return points


def loss(gpu: GpuSpec, points: Sequence[Point]) -> float:
    total = 0.0
    for p in points:
        pred = _grouped_ms(p.ops, gpu)
        for name, ms in p.per_name_ms.items():
            if ms > 0.05 and pred.get(name, 0.0) > 0:
                total += math.log(pred[name] / ms) ** 2 * min(ms, 5.0)
        total += 4 * math.log(sum(pred.values()) / p.busy_ms) ** 2 * 5.0
    return total


#: No fitted rate goes below these: a small kernel's time is its floor (`kernel_us`), and letting a bandwidth
#: explain it instead would price the same operation absurdly on a large tensor (sorts and scatters of global
#: matching at a few GB/s).
MIN_GBS = 100.0
MIN_TFLOPS = 20.0


def fit(start: GpuSpec, points: Sequence[Point], rounds: int = 6) -> GpuSpec:
    """Coordinate descent in log space, each parameter over a shrinking grid of factors, within physical floors."""
    best, best_loss = start, loss(start, points)
    # Only what the profiles constrain: a kind with almost no measured time keeps its starting values.
    measured: dict[str, float] = defaultdict(float)
    for p in points:
        for kind, ms in p.per_name_ms.items():
            measured[kind] += ms
    names = [n for n in best.params() if n == "kernel_us" or measured.get(n.split(".", 1)[1], 0.0) >= 0.5]
    for r in range(rounds):
        span = 2.0 / (r + 1)
        for name in names:
            for step in (-1.0, -0.5, -0.25, 0.25, 0.5, 1.0):
                value_of = best.params()[name] * math.exp(step * span)
                floor = MIN_GBS if name.startswith("gbs.") else MIN_TFLOPS if name.startswith("tflops.") else 0.0
                if value_of < floor:
                    continue
                trial = best.with_params({name: value_of})
                value = loss(trial, points)
                if value < best_loss:
                    best, best_loss = trial, value
    return best


def error_table(gpu: GpuSpec, points: Sequence[Point]) -> list[tuple[str, float, float]]:
    """(label, measured busy ms, estimated ms) per point."""
    return [(p.label, p.busy_ms, sum(gpu.op_ms(op) for op in p.ops.values())) for p in points]


def main(argv: Sequence[str] | None = None) -> int:
    from tome_bench.gpu_estimate import GPUS

    ap = argparse.ArgumentParser(prog="python -m tome_bench calibrate", description=__doc__.split("\n\n")[0])
    ap.add_argument("profiles", nargs="+", type=Path, help="gpu.json of gpu-job, or an older profile in docs/runs")
    ap.add_argument("--gpu", default="h200", choices=sorted(GPUS))
    ap.add_argument("--fit", action="store_true", help="fit the parameters (else report the error of today's)")
    ap.add_argument(
        "--exclude", default="", help="comma-separated calls left out of the fit ('sd15 2048 kv4-l4'): disturbed runs"
    )
    args = ap.parse_args(argv)

    # A CPU dry run (gpu-job --dry-run) profiles no kernels: nothing to fit to.
    points = [p for p in load_points(args.profiles) if p.busy_ms > 0]
    gpu = GPUS[args.gpu]
    excluded = {e.strip() for e in args.exclude.split(",") if e.strip()} | {p.label for p in points if p.disturbed}
    if args.fit:
        gpu = fit(gpu, [p for p in points if p.label not in excluded])
        print(gpu)
    print(f"{'call':32s} {'measured':>9s} {'estimate':>9s} {'error':>7s}")
    errs = []
    for label, busy, est in error_table(gpu, points):
        if label not in excluded:
            errs.append(abs(est / busy - 1))
        note = "  (left out: disturbed)" if label in excluded else ""
        print(f"{label:32s} {busy:9.2f} {est:9.2f} {100 * (est / busy - 1):+6.1f}%{note}")
    errs.sort()
    print(
        f"median |error| {100 * errs[len(errs) // 2]:.1f}%, max {100 * errs[-1]:.1f}%" if errs else "no call to compare"
    )
    return 0


if __name__ == "__main__":  # `python -m tome_bench.calibrate`, as before the jobs
    sys.exit(main())
