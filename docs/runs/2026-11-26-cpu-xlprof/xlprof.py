"""Where compiled SDXL loses the patch's saving on a CPU: reduced-depth SDXL (level-4 stacks of 2), batch 2.

Run (what ran, from the repository root, on one vCPU): `TORCHINDUCTOR_COMPILE_THREADS=1 taskset -c 0
.venv/bin/python docs/runs/2026-11-26-cpu-xlprof/xlprof.py 768 plain,quality,fast` (stopped during "fast").
"""

import dataclasses
import statistics
import sys
import time

import torch
import torch._dynamo
from torch.profiler import ProfilerActivity, profile

import tome_core
from tome_bench import archs


def cpu() -> float:
    return time.process_time()


def timed(fn, n=2):
    out = []
    for _ in range(n):
        start = cpu()
        fn()
        out.append(cpu() - start)
    return statistics.median(out), out


def prof(fn, label):
    with profile(activities=[ProfilerActivity.CPU]) as p:
        fn()
    events = p.key_averages()
    rows = sorted(events, key=lambda e: -e.self_cpu_time_total)[:18]
    total = sum(e.self_cpu_time_total for e in events)
    print(f"--- {label}: self CPU total {total / 1e6:.2f} s")
    for e in rows:
        print(f"  {e.key[:70]:70s} {e.self_cpu_time_total / 1e6:8.3f} s  x{e.count}")


def main() -> None:
    torch.set_num_threads(1)
    torch._dynamo.config.recompile_limit = 64
    size = int(sys.argv[1]) if len(sys.argv) > 1 else 768
    variants = sys.argv[2].split(",") if len(sys.argv) > 2 else ["plain", "quality"]
    spec = archs.get_arch("sdxl")
    spec = dataclasses.replace(spec, config={**spec.config, "transformer_layers_per_block": (1, 2, 2)})
    unet = archs.build_unet(spec)
    args, kwargs = archs.make_inputs(spec, size)
    compiled = torch.compile(unet, fullgraph=True, dynamic=False)
    res = {}
    with torch.inference_mode():
        for v in variants:
            if v != "plain":
                tome_core.apply_patch(unet, preset=v)
            e = timed(lambda: unet(*args, **kwargs))
            start = cpu()
            compiled(*args, **kwargs)
            first = cpu() - start
            c = timed(lambda: compiled(*args, **kwargs))
            res[v] = (e, c, first)
            print(f"{v}: eager {e[1]} compiled {c[1]} (first {first:.1f} s)", flush=True)
            prof(lambda: unet(*args, **kwargs), f"{v} eager")
            prof(lambda: compiled(*args, **kwargs), f"{v} compiled")
            sys.stdout.flush()
            if v != "plain":
                tome_core.remove_patch(unet)
    base = res["plain"]
    for v, (e, c, _) in res.items():
        print(
            f"{v}: eager {e[0]:.2f} s ({base[0][0] / e[0]:.2f}x), compiled {c[0]:.2f} s ({base[1][0] / c[0]:.2f}x"
            f" over compiled, {base[0][0] / c[0]:.2f}x over eager)"
        )


if __name__ == "__main__":
    main()
