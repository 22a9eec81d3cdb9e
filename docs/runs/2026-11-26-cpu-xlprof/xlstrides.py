"""Input strides and times of each extern conv/addmm/mm/SDPA call: eager vs compiled, plain vs Quality.

Reduced-depth SDXL (level-4 stacks of 2), batch 2, one thread. Run (what ran, from the repository root):
`TORCHINDUCTOR_COMPILE_THREADS=1 taskset -c 0 .venv/bin/python docs/runs/2026-11-26-cpu-xlprof/xlstrides.py 512`;
the summary (xlstrides-512-summary.txt) was made from the pickle it writes.
"""

import collections
import dataclasses
import json
import pickle
import sys
from pathlib import Path

import torch
import torch._dynamo
from torch.profiler import ProfilerActivity, profile

import tome_core
from tome_bench import archs

OPS = (
    "aten::mkldnn_convolution",
    "aten::addmm",
    "aten::mm",
    "aten::_slow_conv2d_forward",
    "aten::bmm",
    "aten::_scaled_dot_product_flash_attention_for_cpu",
)


def trace(fn, path):
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as p:
        fn()
    p.export_chrome_trace(path)
    events = json.loads(Path(path).read_text())["traceEvents"]
    out = collections.defaultdict(list)
    for e in events:
        if e.get("name") in OPS:
            a = e.get("args", {})
            out[e["name"]].append((str(a.get("Input Dims"))[:80], str(a.get("Input Strides"))[:120], e["dur"]))
    return out


def main() -> None:
    torch.set_num_threads(1)
    torch._dynamo.config.recompile_limit = 64
    size = int(sys.argv[1])
    spec = archs.get_arch("sdxl")
    spec = dataclasses.replace(spec, config={**spec.config, "transformer_layers_per_block": (1, 2, 2)})
    unet = archs.build_unet(spec)
    args, kwargs = archs.make_inputs(spec, size)
    compiled = torch.compile(unet, fullgraph=True, dynamic=False)
    res = {}
    with torch.inference_mode():
        for v in ("plain", "quality"):
            if v != "plain":
                tome_core.apply_patch(unet, preset=v)
            unet(*args, **kwargs)
            compiled(*args, **kwargs)
            for mode, fn in (("eager", unet), ("compiled", compiled), ("eager2", unet), ("compiled2", compiled)):
                res[(v, mode)] = trace(lambda fn=fn: fn(*args, **kwargs), f"/tmp/tr-{v}-{mode}.json")
                totals = {k: round(sum(d for *_, d in xs) / 1e6, 3) for k, xs in res[(v, mode)].items()}
                print(v, mode, totals, flush=True)
            if v != "plain":
                tome_core.remove_patch(unet)
    with Path("/tmp/xlstrides.pkl").open("wb") as f:
        pickle.dump(dict(res), f)


if __name__ == "__main__":
    main()
