"""Fit `gpu_estimate.GpuSpec` to GPU kernel profiles and report the estimate's error against each.

A profile (JSON, a list of rows) gives per (arch, size, variant) the GPU busy time of one UNet call and the device
time per aten operation (`tome_gpu_profile.py` and `gpu_job.py` in docs/runs write them). The same call is traced on
the meta device here, priced per operation, and the parameters are fitted to the profile's per-operation times
(log error, so that small and large operations weigh alike). `python -m tome_bench.calibrate PROFILE.json ...`
prints the fit and the error table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from tome_bench.gpu_estimate import KIND, GpuSpec, TracedOp, meta_unet, trace_call

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


def load_points(paths: Sequence[Path], variants: Mapping[str, Callable[[torch.nn.Module], Any] | None]) -> list[Point]:
    rows = [row for path in paths for row in json.loads(Path(path).read_text())]
    points, unets = [], {}
    for row in rows:
        name = row["variant"]
        if name not in variants:
            continue
        arch = row["arch"]
        if arch not in unets:
            unets[arch] = meta_unet(arch)
        tr = trace_call(unets[arch], arch, row["size"], variants[name])
        if "ops" in row:  # gpu_job.py: [name, shapes, count, device ms, cpu ms] per (name, shapes)
            per_name: dict[str, float] = defaultdict(float)
            for op in row["ops"]:
                per_name[profile_kind(op[0])] += op[3]
        else:  # tome_gpu_profile.py: the top operations, [name, count, device ms, cpu ms]
            per_name = defaultdict(float)
            for op in row["top"]:
                per_name[profile_kind(op[0])] += op[2]
        points.append(Point(f"{arch} {row['size']} {name}", row["gpu_busy_ms"], dict(per_name), _aggregate(tr.ops)))
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


def fit(start: GpuSpec, points: Sequence[Point], rounds: int = 6) -> GpuSpec:
    """Coordinate descent in log space, each parameter over a shrinking grid of factors."""
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
                trial = best.with_params({name: best.params()[name] * math.exp(step * span)})
                value = loss(trial, points)
                if value < best_loss:
                    best, best_loss = trial, value
    return best


def error_table(gpu: GpuSpec, points: Sequence[Point]) -> list[tuple[str, float, float]]:
    """(label, measured busy ms, estimated ms) per point."""
    return [(p.label, p.busy_ms, sum(gpu.op_ms(op) for op in p.ops.values())) for p in points]


def main(argv: Sequence[str] | None = None) -> None:
    from tome_bench.gpu_estimate import GPUS
    from tome_core import apply_patch

    ap = argparse.ArgumentParser(prog="python -m tome_bench.calibrate", description=__doc__)
    ap.add_argument("profiles", nargs="+", type=Path)
    ap.add_argument("--gpu", default="h200", choices=sorted(GPUS))
    ap.add_argument("--fit", action="store_true", help="fit the parameters (else report the error of today's)")
    ap.add_argument(
        "--exclude", default="", help="comma-separated calls left out of the fit ('sd15 2048 kv4-l4'): disturbed runs"
    )
    args = ap.parse_args(argv)

    variants: dict[str, Callable[[torch.nn.Module], Any] | None] = {"baseline": None}
    for p in ("quality", "balanced", "fast", "fastest"):
        variants[p] = lambda unet, p=p: apply_patch(unet, preset=p)
    extra = {
        "kv2-l1": {"mode": "kv", "max_downsample": 1},
        "kv4-l1": {"mode": "kv", "max_downsample": 1, "sx": 4, "sy": 4},
        "kv4-l4": {"mode": "kv", "max_downsample": 4, "sx": 4, "sy": 4},
        "tome.5-l1": {"ratio": 0.5, "max_downsample": 1},
        "kv4": {"mode": "kv", "sx": 4, "sy": 4},
        "mlp.9-l4-nocross": {"mode": "kv", "merge_mlp": True, "mlp_min_downsample": 4, "mlp_ratio": 0.9},
    }
    for name, fields in extra.items():
        variants[name] = lambda unet, f=fields: apply_patch(unet, **f)
    points = load_points(args.profiles, variants)
    gpu = GPUS[args.gpu]
    excluded = {e.strip() for e in args.exclude.split(",") if e.strip()}
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
    print(f"median |error| {100 * errs[len(errs) // 2]:.1f}%, max {100 * errs[-1]:.1f}%")


if __name__ == "__main__":
    main()
