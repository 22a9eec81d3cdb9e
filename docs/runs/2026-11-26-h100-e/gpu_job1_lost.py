"""GPU job 1 (2026-11-26, fifth session): eager profile of one UNet call per preset, before the issue-34 rewrite.

python3 .gpu/job1.py OUTDIR [--smoke]
Per (arch, size): baseline, every preset, tomesd and a few existing configs; event and wall time, GPU busy time
(sum of kernel durations), kernels, aten ops, peak memory over the call, and per (aten op, input shapes) the
device time: the calibration data of the GPU estimate. One JSON per (arch, size).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tome_bench import archs
from tome_core import apply_patch, remove_patch, stats

OUT = Path(sys.argv[1])
SMOKE = "--smoke" in sys.argv
DEV = torch.device("cpu" if SMOKE else "cuda")
DT = torch.float32 if SMOKE else torch.float16
OUT.mkdir(parents=True, exist_ok=True)
PRESETS = ["quality", "balanced", "fast", "fastest"]
EXTRA = {
    "sd15": {
        "kv2-l1": {"mode": "kv", "max_downsample": 1},
        "kv4-l1": {"mode": "kv", "max_downsample": 1, "sx": 4, "sy": 4},
        "kv4-l4": {"mode": "kv", "max_downsample": 4, "sx": 4, "sy": 4},
        "tome.5-l1": {"ratio": 0.5, "max_downsample": 1},
        "tomesd": None,
    },
    "sdxl": {
        "kv4": {"mode": "kv", "sx": 4, "sy": 4},
        "mlp.9-l4-nocross": {"mode": "kv", "merge_mlp": True, "mlp_min_downsample": 4, "mlp_ratio": 0.9},
        "tome.5-l4-stack": {"ratio": 0.5, "merge_crossattn": True, "merge_mlp": True, "share_plan": True},
    },
}


def sync() -> None:
    if DEV.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, n: int) -> dict:
    ev, walls = [], []
    for _ in range(n):
        if DEV.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
        t0 = time.perf_counter()
        fn()
        if DEV.type == "cuda":
            b.record()
        sync()
        walls.append((time.perf_counter() - t0) * 1e3)
        if DEV.type == "cuda":
            ev.append(a.elapsed_time(b))
    src = ev or walls
    return {"ms_median": statistics.median(src), "ms_min": min(src), "wall_median": statistics.median(walls), "n": n}


def profile(fn, calls: int = 2) -> dict:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof_

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEV.type == "cuda" else [])
    sync()
    with prof_(activities=acts, record_shapes=True) as p:
        for _ in range(calls):
            fn()
        sync()
    kernels = [e for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy = sum(e.time_range.elapsed_us() for e in kernels) / 1e3
    knames = defaultdict(lambda: [0, 0.0])
    for e in kernels:
        k = knames[e.name[:90]]
        k[0] += 1
        k[1] += e.time_range.elapsed_us() / 1e3
    ops = []
    for k in p.key_averages(group_by_input_shape=True):
        if not k.key.startswith("aten::"):
            continue
        dev_t = getattr(k, "self_device_time_total", getattr(k, "self_cuda_time_total", 0.0))
        ops.append(
            [
                k.key,
                str(k.input_shapes)[:300],
                k.count / calls,
                dev_t / 1e3 / calls,
                k.self_cpu_time_total / 1e3 / calls,
            ]
        )
    ops.sort(key=lambda o: -o[3])
    return {
        "kernels_per_call": len(kernels) / calls,
        "gpu_busy_ms": busy / calls,
        "aten_calls_per_call": sum(o[2] for o in ops),
        "ops": ops,
        "kernel_names": sorted(([n, c / calls, t / calls] for n, (c, t) in knames.items()), key=lambda r: -r[2]),
    }


def main() -> None:
    combos = [("tiny", 256)] if SMOKE else [("sd15", 512), ("sd15", 768), ("sd15", 1024), ("sdxl", 1024)]
    unet, built = None, None
    for arch, size in combos:
        key = "sdxl" if arch == "sdxl" else "sd15"
        if built != arch:
            unet = None
            if DEV.type == "cuda":
                torch.cuda.empty_cache()
            unet = archs.build_unet(arch, DT, DEV)
            built = arch
        args, kwargs = archs.make_inputs(arch, size, dtype=DT, device=DEV, latent_kind="natural")
        variants = [("baseline", None), *((p, {"preset": p}) for p in PRESETS), *EXTRA[key].items()]
        results, base_out = [], None
        n = 3 if SMOKE else (25 if size <= 768 else 15)
        for name, fields in variants:
            try:
                if name == "tomesd":
                    import tomesd

                    tomesd.apply_patch(unet, ratio=0.5)
                elif fields is not None:
                    apply_patch(unet, **fields)
                with torch.inference_mode():

                    def call(unet=unet, args=args, kwargs=kwargs):
                        return unet(*args, **kwargs).sample

                    for _ in range(3):
                        out = call()
                    del out
                    sync()
                    if DEV.type == "cuda":
                        torch.cuda.reset_peak_memory_stats()
                        before = torch.cuda.memory_allocated()
                    out = call()
                    sync()
                    peak = (torch.cuda.max_memory_allocated() - before) / 2**20 if DEV.type == "cuda" else 0.0
                    t = timed(call, n)
                    pr = profile(call)
                    st = stats(unet)
                    dev = 0.0 if base_out is None else float((out.float() - base_out).norm() / base_out.norm())
                    if base_out is None:
                        base_out = out.float()
                    del out
            except Exception as exc:
                print(f"{arch} {size} {name} FAILED {type(exc).__name__}: {exc}", flush=True)
                continue
            finally:
                if name == "tomesd":
                    import tomesd

                    tomesd.remove_patch(unet)
                elif fields is not None:
                    remove_patch(unet)
            r = {
                "arch": arch,
                "size": size,
                "variant": name,
                **t,
                "peak_mib": peak,
                **pr,
                "deviation": dev,
                "stats": None if st is None else str(st)[:400],
            }
            results.append(r)
            print(
                f"{arch} {size} {name:16s} event {t['ms_median']:8.2f} ms wall {t['wall_median']:8.2f} | busy"
                f" {pr['gpu_busy_ms']:8.2f} ms {pr['kernels_per_call']:5.0f} kernels {pr['aten_calls_per_call']:5.0f}"
                f" aten | peak {peak:7.0f} MiB | dev {dev:.4f}",
                flush=True,
            )
            (OUT / f"{arch}-{size}.json").write_text(json.dumps(results))
    print("done", flush=True)


if __name__ == "__main__":
    if DEV.type == "cuda":
        print(torch.__version__, torch.cuda.get_device_name(), flush=True)
    main()
