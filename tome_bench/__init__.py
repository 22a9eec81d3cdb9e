"""The benchmark of tome_core: one UNet step, or whole generations, unpatched vs. ours vs. the alternatives,
interleaved in one process.

    python -m tome_bench          # the main job (make bench): every preset on SD1.5 and SDXL, tomesd, the GPU
                                  # estimate; ~20 min on 2 cores, on the GPU in fp16 where CUDA is available
    python -m tome_bench --gpu-estimate   # only what each preset is expected to gain on a GPU (no timing)
    python -m tome_bench --compare        # ours at ratio 0.5 beside tomesd, SD1.5 at 512 and 1024 px
    python -m tome_bench --full   # ratios 0.3/0.5/0.7, 3 timed runs after a warm-up round (default on cuda)
    python -m tome_bench --quick  # smoke test: 256 px, ratio 0.5, 1 timed run
    python -m tome_bench --device cuda --dtype fp16 --arch sd15,sdxl --sizes 1024,2048 --ours kv:mode=kv
    python -m tome_bench --steps 10 --peers all --presets all     # whole generations beside every peer
    python -m tome_bench --steps 10 --strength 0.5 --sizes 1024   # a hires-style pass: the last 5 of 10 steps
    python -m tome_bench --checkpoint FILE --images   # your checkpoint, unpatched and at each preset: a labelled grid
    python -m tome_bench --gpu-job                    # the GPU session's job (profiles, wall clocks, compiled modes)

For every architecture and size the per-call mode times one UNet call with batch 2 (cond + uncond, as a sampler
does) for the unpatched baseline and, at each ratio, `tome_core.apply_patch` with the config under test and
`tomesd.apply_patch(unet, ratio=r)` with tomesd's defaults (the main job: at each preset of
`tome_core.presets()`); `--steps N` times whole generations of a diffusers pipeline instead. The variants run
round-robin within each repetition (so clock or thermal drift affects all of them alike) after a warm-up round
(--compare: one untimed baseline call instead; the main job: an untimed round on the natural latent); a patch is removed right
after its variant ran and the baseline output is checked to be bitwise identical afterwards. Reported: the
median time (`--clock wall` or `cpu`), speed-up over baseline, peak memory and the output deviation
||out - base|| / ||base||. Writes a markdown report, a JSON file and a plot of speed-up against deviation to --out.

Weights are random (see `tome_bench.archs`) unless --checkpoint names a real .safetensors file; inputs are
seeded random latents and text states. tomesd and the other peers are optional: one that is not installed gets a
note or a row saying why.

Modules: `cli` (options and `main`), `options` (the parsed options and result rows every module shares), `run`
(variants, timing of one call, the merge overhead on the product's path), `generate` (whole generations), `images`
(a checkpoint's decoded images in a grid), `peers`, `report` (tables, plot, reports, JSON), `timing` (the timed call,
the clocks, the timing lock), `gpu_estimate` (the meta-device trace and GPU cost model), `gpu_table` (its table
beside the CPU figures) and `calibrate` (its fit to GPU profiles), `gpu_job` (the GPU job), `ops` (the aten op
counter the core's tests use too) and `archs` (the SD1.5/SDXL UNet configs, random weights, checkpoint loading,
inputs). Progress is tqdm's; FLOPs are `torch.utils.flop_counter`'s, repeated small timings `torch.utils.benchmark`'s.

This package is not part of the library: `import tome_core` never loads it, nor does the extension. Importing
`tome_bench` itself loads nothing but this file, so that `tome_bench.ops` and `tome_bench.archs` come without
the command line, the reports and the peers.
"""

from __future__ import annotations

from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark with `argv` (default: the command line); the exit status, 0 when every check passed."""
    from tome_bench.cli import main as cli_main

    return cli_main(argv)
