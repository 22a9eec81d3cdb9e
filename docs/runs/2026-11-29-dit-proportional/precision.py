"""The own key's kernels in 16 bits: each stand-in's one call under CPU autocast (bf16, fp16), its distance from the
same call in float32, patched (Balanced) beside unpatched; the blocks that kept each query's own key beside those that
subsampled keys/values.

    PYTHONPATH=. .venv/bin/python docs/runs/2026-11-29-dit-proportional/precision.py flux,zimage,wan
"""

from __future__ import annotations

import sys

import torch

import tome_core
from tome_bench.dit_standin import FAMILIES, VARIANTS, build, change, one_call

if __name__ == "__main__":
    torch.set_num_threads(2)
    for name in sys.argv[1].split(","):
        family = FAMILIES[name]
        model = build(family, VARIANTS["stand-in"])
        reference = one_call(model, family, 0)
        tome_core.apply_patch(model, preset="balanced")
        patched = one_call(model, family, 0)
        tome_core.remove_patch(model)
        for dtype in (torch.bfloat16, torch.float16):
            with torch.autocast("cpu", dtype=dtype):
                base = one_call(model, family, 0).float()
                tome_core.apply_patch(model, preset="balanced")
                got = one_call(model, family, 0).float()
                kinds = dict(tome_core.stats(model).modules)
                tome_core.remove_patch(model)
            print(
                name,
                dtype,
                kinds,
                f"unpatched {change(base, reference):.4f}",
                f"patched {change(got, patched):.4f}",
                f"(the patch's change {change(patched, reference):.4f})",
                flush=True,
            )
