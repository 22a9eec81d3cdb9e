"""docs/dit.md's "GPU work saved" table from `python -m tome_bench estimate --dit --write`'s printed rows
(estimate-write.log here): per family and size, each preset's estimated speed-up with its launching ops added, and
Fastest's call's host time for its launches beside its GPU time (the fewest GPU work, the most launches) (the host's launches hide behind the GPU where
the first is under 0.8x the second: `tome_bench.gpu_estimate.HIDDEN`).

    python docs/runs/2026-12-06-dit-launches/table.py docs/runs/2026-12-06-dit-launches/estimate-write*.log
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

MODELS = {
    "flux": "Flux.1-dev",
    "chroma": "Chroma1-HD",
    "flux2": "Flux.2-dev",
    "qwen": "Qwen-Image",
    "zimage": "Z-Image-Turbo",
    "lumina2": "Lumina-Image-2.0",
    "sd3": "SD3.5 Large",
    "wan": "Wan 2.1 14B",
    "wan22-5b": "Wan 2.2 TI2V 5B",
    "hunyuanvideo": "HunyuanVideo 13B",
    "ltx": "LTX-Video 2B",
    "ltx2": "LTX-2 19B",
}
PRESETS = ("quality", "balanced", "fast", "fastest")


def size_text(size: str) -> str:
    parts = size.split("x")
    return f"{parts[0]}×{parts[1]}" + (f", {parts[2]} frames" if len(parts) > 2 else "")


def main(paths: list[str]) -> None:
    rows: dict[tuple[str, str], dict[str, list[str]]] = {}
    batches = {}
    for line in (line for path in paths for line in Path(path).read_text(encoding="utf-8").splitlines()):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 8 or cells[0] not in MODELS:
            continue
        family, size, batch, preset, speedup, ops, host, _peak = cells
        batches[family] = batch
        rows.setdefault((family, size), {})[preset] = [speedup, ops, host]
    print("| model | size | batch | Quality | Balanced | Fast | Fastest | host / GPU ms, Fastest |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    order = list(MODELS)
    tokens = lambda key: (order.index(key[0]), math.prod(int(n) for n in key[1].split("x")))
    for (family, size), found in sorted(rows.items(), key=lambda item: tokens(item[0])):
        cells = [f"{float(found[p][0]):.2f}× ({found[p][1]})" for p in PRESETS]
        print(
            f"| {MODELS[family]} | {size_text(size)} | {batches[family]} | {' | '.join(cells)} | {found['fastest'][2]} |"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
