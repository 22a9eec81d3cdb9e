"""GPU diagnosis, one process: where the time of one UNet call goes, unpatched and per preset (eager), and what
CUDA graphs do when one compiled graph is called again and again (as in a sampling) against round-robin.

python3 .gpu/tome_gpu_profile.py OUTDIR [eager|ro|all] [LOCKFILE] [--smoke]

Ran from .gpu/ (parents[1] is the repository root there); committed here reformatted by ruff, unchanged otherwise.
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
from tome_bench.timing import TimingLock
from tome_core import apply_patch, remove_patch, stats

OUT = Path(sys.argv[1])
PART = sys.argv[2] if len(sys.argv) > 2 else "all"
SMOKE = "--smoke" in sys.argv
DEV = torch.device("cpu" if SMOKE else "cuda")
DT = torch.float32 if SMOKE else torch.float16
OUT.mkdir(parents=True, exist_ok=True)
LOCK = TimingLock(Path(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[3] != "--smoke" else None)
LOG = open(OUT / f"profile-{PART}.txt", "a")  # noqa: SIM115


def say(*a: object) -> None:
    line = " ".join(str(x) for x in a)
    print(line, flush=True)
    LOG.write(line + "\n")
    LOG.flush()


def sync() -> None:
    if DEV.type == "cuda":
        torch.cuda.synchronize()


# Extra configurations: what pays on a GPU with the fewest extra kernels.
EXTRA = {
    "sd15": {
        "kv2-l1": {"mode": "kv", "max_downsample": 1},
        "kv4-l1": {"mode": "kv", "max_downsample": 1, "sx": 4, "sy": 4},
        "kv4-l4": {"mode": "kv", "max_downsample": 4, "sx": 4, "sy": 4},
        "tome.5-l1": {"ratio": 0.5, "max_downsample": 1},
    },
    "sdxl": {
        "kv4": {"mode": "kv", "sx": 4, "sy": 4},
        "mlp.9-l4-nocross": {"mode": "kv", "merge_mlp": True, "mlp_min_downsample": 4, "mlp_ratio": 0.9},
    },
}
PRESETS = ["quality", "balanced", "fast", "fastest"]
TOME_OPS = (
    "index_add",
    "scatter",
    "sort",
    "gather",
    "index_select",
    "avg_pool",
    "index_fill",
    "max",
    "bmm",
    "cat",
    "norm",
    "clamp",
    "div",
    "repeat",
    "remainder",
    "index_copy",
    "zeros",
    "reciprocal",
)


def timed(fn, n: int) -> dict:
    ev = []
    walls = []
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
    return {
        "ms_median": statistics.median(src),
        "ms_min": min(src),
        "ms_max": max(src),
        "wall_median": statistics.median(walls),
        "n": n,
    }


def profile(fn, calls: int = 2) -> dict:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof_

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEV.type == "cuda" else [])
    sync()
    with prof_(activities=acts) as p:
        for _ in range(calls):
            fn()
        sync()
    kernels = [e for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy = sum(e.time_range.elapsed_us() for e in kernels) / 1e3
    ops = []
    for k in p.key_averages():
        if not k.key.startswith("aten::"):
            continue
        dev_t = getattr(k, "self_device_time_total", getattr(k, "self_cuda_time_total", 0.0))
        ops.append((k.key, k.count / calls, dev_t / 1e3 / calls, k.self_cpu_time_total / 1e3 / calls))
    ops.sort(key=lambda o: -o[2] if DEV.type == "cuda" else -o[3])
    tome_ms = sum(o[2] for o in ops if any(t in o[0] for t in TOME_OPS))
    cats = defaultdict(float)
    for o in ops:
        name = o[0]
        cat = (
            "attention"
            if "attention" in name or "flash" in name or "efficient" in name
            else "conv"
            if "conv" in name
            else "gemm"
            if name in ("aten::addmm", "aten::mm", "aten::linear")
            else "bmm"
            if "bmm" in name
            else "norm"
            if "norm" in name
            else "tome-ish"
            if any(t in name for t in TOME_OPS)
            else "other"
        )
        cats[cat] += o[2]
    return {
        "kernels_per_call": len(kernels) / calls,
        "gpu_busy_ms": busy / calls,
        "aten_calls_per_call": sum(o[1] for o in ops),
        "tome_ish_dev_ms": tome_ms,
        "by_category_dev_ms": dict(cats),
        "top": ops[:22],
    }


def part_eager() -> None:
    LOCK.hold()  # the whole eager part is timed: other processes compile meanwhile, and time after it
    results = []
    combos = [("tiny", 256)] if SMOKE else [("sd15", 1024), ("sdxl", 1024), ("sd15", 2048), ("sdxl", 2048)]
    unets = {}
    for arch, size in combos:
        key = "sd15" if arch in ("sd15", "tiny") else "sdxl"
        if arch not in unets:
            unets.clear()
            torch.cuda.empty_cache() if DEV.type == "cuda" else None
            unets[arch] = archs.build_unet(arch, DT, DEV)
        unet = unets[arch]
        args, kwargs = archs.make_inputs(arch, size, dtype=DT, device=DEV)
        variants = [("baseline", None)] + [(p, {"preset": p}) for p in PRESETS]
        variants += [(n, f) for n, f in EXTRA[key].items()]
        base_out = None
        n = 3 if SMOKE else (20 if size == 1024 else 8)
        for name, fields in variants:
            if fields is not None:
                apply_patch(unet, **fields)
            try:
                with torch.inference_mode():

                    def call(unet=unet, args=args, kwargs=kwargs):
                        return unet(*args, **kwargs).sample

                    for _ in range(3):
                        out = call()
                    sync()
                    t = timed(call, n)
                    pr = profile(call)
                    st = stats(unet)
                    merged = None if st is None else str(st)[:300]
                    dev = 0.0 if base_out is None else float((out.float() - base_out).norm() / base_out.norm())
                    if base_out is None:
                        base_out = out.float()
            finally:
                if fields is not None:
                    remove_patch(unet)
            r = {"arch": arch, "size": size, "variant": name, **t, **pr, "deviation": dev, "stats": merged}
            results.append(r)
            say(
                f"{arch} {size} {name:18s} event {t['ms_median']:8.2f} ms (min {t['ms_min']:.2f} max {t['ms_max']:.2f})"
                f" wall {t['wall_median']:8.2f} | busy {pr['gpu_busy_ms']:8.2f} ms, {pr['kernels_per_call']:.0f} kernels,"
                f" {pr['aten_calls_per_call']:.0f} aten calls, tome-ish {pr['tome_ish_dev_ms']:.2f} ms | dev {dev:.4f}"
            )
            say("   cats " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(pr["by_category_dev_ms"].items())))
            for o in pr["top"][:14]:
                say(f"     {o[0]:40s} x{o[1]:6.0f}  dev {o[2]:8.3f} ms  cpu {o[3]:8.3f} ms")
            (OUT / "profile-eager.json").write_text(json.dumps(results, indent=1))
    LOCK.release()


def part_ro() -> None:
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.config.recompile_limit = 64
    arch, size = ("tiny", 256) if SMOKE else ("sd15", 1024)
    mode = None if SMOKE else "reduce-overhead"
    unet = archs.build_unet(arch, DT, DEV)
    args, kwargs = archs.make_inputs(arch, size, dtype=DT, device=DEV)
    comp = torch.compile(unet, mode=mode, fullgraph=True, dynamic=False)
    results = []

    def call():
        return comp(*args, **kwargs).sample

    def skips():
        return int(counters["inductor"]["cudagraph_skips"])

    with torch.inference_mode():
        for name in ["baseline", "balanced", "fastest"]:
            if name != "baseline":
                apply_patch(unet, preset=name)
            t0 = time.perf_counter()
            s0 = skips()
            for _ in range(3):
                call()
            sync()
            warm = time.perf_counter() - t0
            LOCK.hold()
            t = timed(call, 3 if SMOKE else 30)
            LOCK.release()
            r = {"variant": name, "mode": "sequential", "warm_s": warm, "skips": skips() - s0, **t}
            results.append(r)
            say(
                f"RO sequential {name:10s} {t['ms_median']:.2f} ms (min {t['ms_min']:.2f}, max {t['ms_max']:.2f})"
                f" warm {warm:.1f} s cudagraph skips {skips() - s0}"
            )
            if name != "baseline":
                remove_patch(unet)
        # Round-robin as the benchmark does: apply, call, keep the output alive, remove, next variant.
        kept = {}
        LOCK.hold()
        times = defaultdict(list)
        for _ in range(1 if SMOKE else 6):
            for name in ["baseline", "balanced", "fastest"]:
                if name != "baseline":
                    apply_patch(unet, preset=name)
                sync()
                t0 = time.perf_counter()
                kept[name] = call()
                sync()
                times[name].append((time.perf_counter() - t0) * 1e3)
                if name != "baseline":
                    remove_patch(unet)
        for name, ts in times.items():
            say(f"RO round-robin {name:10s} median {statistics.median(ts):.2f} ms all {[round(x, 1) for x in ts]}")
            results.append({"variant": name, "mode": "round-robin", "times": ts})
        # The same round-robin with each output cloned and the original dropped at once.
        times = defaultdict(list)
        for _ in range(1 if SMOKE else 6):
            for name in ["baseline", "balanced", "fastest"]:
                if name != "baseline":
                    apply_patch(unet, preset=name)
                sync()
                t0 = time.perf_counter()
                kept[name] = call().clone()
                sync()
                times[name].append((time.perf_counter() - t0) * 1e3)
                if name != "baseline":
                    remove_patch(unet)
        for name, ts in times.items():
            say(
                f"RO round-robin+clone {name:10s} median {statistics.median(ts):.2f} ms all {[round(x, 1) for x in ts]}"
            )
            results.append({"variant": name, "mode": "round-robin-clone", "times": ts})
    LOCK.release()
    say("graphs", int(counters["stats"]["unique_graphs"]), "skips", skips())
    (OUT / "profile-ro.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    if DEV.type == "cuda":
        say(torch.__version__, torch.cuda.get_device_name())
    if PART in ("eager", "all"):
        part_eager()
    if PART in ("ro", "all"):
        part_ro()
    say("done", PART)
