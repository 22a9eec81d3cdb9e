"""Benchmark one UNet step: baseline vs. ours (tome_core) vs. tomesd, interleaved in one process.

    python -m tome_core.bench          # CPU: SD1.5 at 512 and 1024 px, ratio 0.5, 3 timed runs (~8 min on 2 cores)
    python -m tome_core.bench --full   # ratios 0.3/0.5/0.7, 3 timed runs after a warm-up round (default on cuda)
    python -m tome_core.bench --quick  # smoke test: 256 px, ratio 0.5, 1 timed run
    python -m tome_core.bench --device cuda --dtype fp16 --arch sd15,sdxl --sizes 1024,2048 --ours kv:mode=kv

For every architecture and size it times one UNet call with batch 2 (cond + uncond, as a sampler does) for
the unpatched baseline and, at each ratio, `tome_core.apply_patch` with the config under test and
`tomesd.apply_patch(unet, ratio=r)` with tomesd's defaults. The variants run round-robin within each
repetition (so clock or thermal drift affects all of them alike) after a warm-up round (the CPU default: one
untimed baseline call instead); a patch is removed right after its variant ran and the baseline output is
checked to be bitwise identical afterwards. Reported: the median time, speed-up over baseline, peak memory and
the output deviation ||out - base|| / ||base||.
Writes a markdown table to stdout and bench.md, bench.json and bench.png (speed-up vs. deviation) to --out.

Weights are random (see `tome_core.bench.archs`) unless --checkpoint names a real .safetensors file; inputs
are seeded random latents and text states. tomesd is optional: without it that variant is skipped with a note.

Modules: `cli` (options and `main`), `run` (variants and timing), `report` (tables, plot, bench.md) and
`archs` (the SD1.5/SDXL UNet configs, random weights, checkpoint loading, inputs). `import tome_core` does
not import this package.
"""

from tome_core.bench.cli import main

__all__ = ["main"]
