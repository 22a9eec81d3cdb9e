"""Per-step GPU-work speed-up (H200 estimate, meta trace of the full-size model at 1024x1024) of keys/values
subsampled sx x sy from block_start on, for Flux.2 and Z-Image: speeds.json.

    PYTHONPATH=. .venv/bin/python docs/runs/2026-11-28-dit-step-window/speeds.py flux2,zimage
"""

import itertools
import json
import sys
from pathlib import Path

import tome_core
from tome_bench.dit_archs import DIT_ARCHS, TABLE_ARCH, trace_call
from tome_bench.gpu_estimate import GPUS, estimate

HERE = Path(__file__).resolve().parent
out = {}
for fam in sys.argv[1].split(","):
    arch = DIT_ARCHS[TABLE_ARCH[fam]]
    model = arch.build()
    size = (1024, 1024, 1)
    base = estimate(trace_call(arch, model, size), GPUS["h200"]).gpu_ms
    for bs, s in itertools.product((0.0, 0.1, 0.2, 0.35, 0.5), (2, 3, 4)):
        fields = {"mode": "kv", "sx": s, "sy": s, "block_start": bs}
        patched = trace_call(arch, model, size, lambda m, f=fields: tome_core.apply_patch(m, **f))
        out[f"{fam}|{bs}|{s}"] = base / estimate(patched, GPUS["h200"]).gpu_ms
        print(fam, bs, s, round(out[f"{fam}|{bs}|{s}"], 4), flush=True)
(HERE / "speeds.json").write_text(json.dumps(out, indent=1))
