"""One UNet call's deviation per candidate config (fp32, CPU): python deviation.py ARCH SIZE CANDIDATES.json [noise,natural]

CANDIDATES.json maps a name to apply_patch keywords. Run with PYTHONPATH=<an old checkout> to measure an older core.
"""

import json
import os
import sys
import time
from pathlib import Path

import torch

import tome_core
from tome_bench import archs
from tome_core import apply_patch, remove_patch


def main() -> None:
    torch.set_num_threads(int(os.environ.get("THREADS", "1")))
    arch, size = sys.argv[1], int(sys.argv[2])
    cands = json.loads(Path(sys.argv[3]).read_text())
    kinds = sys.argv[4].split(",") if len(sys.argv) > 4 else ["noise", "natural"]
    print("core:", tome_core.__file__, flush=True)
    unet = archs.build_unet(arch, torch.float32, "cpu")
    res: dict[str, dict[str, float]] = {}
    for kind in kinds:
        args, kwargs = archs.make_inputs(arch, size, latent_kind=kind)
        with torch.no_grad():
            base = unet(*args, **kwargs).sample
            for name, fields in cands.items():
                apply_patch(unet, **fields)
                start = time.time()
                try:
                    out = unet(*args, **kwargs).sample
                finally:
                    remove_patch(unet)
                dev = float((out - base).norm() / base.norm())
                res.setdefault(name, {})[kind] = dev
                print(f"{arch} {size} {kind:8s} {name:28s} dev {dev:.4f}  ({time.time() - start:.1f}s)", flush=True)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
