"""`python -m tome_bench compare`: ours at --ratios (its fields set with --set, more configurations with --ours)
beside tomesd and the unpatched UNet, and any preset (--presets), one UNet call (batch 2) per variant and round,
as the main job times them (`bench.run_calls`). By default SD1.5 at 512 and 1024 px, ratio 0.5, three timed runs
after one untimed baseline call (about 8 minutes on 2 cores); --quick is a smoke test (256 px, one timed run after
a warm-up round). Writes OUT/bench.md, bench.json and bench.png.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from tome_bench import bench, options
from tome_bench.options import Defaults, Options

COMPARE = Defaults("512,1024", 3)
QUICK = Defaults("256", 1, warmup=1)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tome_bench compare", description=__doc__.split("\n\n")[0])
    keys = ("arch", "sizes", "ratios", "variants", "set", "ours", "presets", "tomesd-max-downsample", "repeats")
    keys += ("warmup", "latents", "quick", "device", "dtype", "threads", "clock", "out", "plot", "seed", "checkpoint")
    defaults = {
        "arch": "sd15",
        "sizes": "512,1024 (--quick 256)",
        "repeats": "3 (--quick 1)",
        "warmup": "0 (--quick 1)",
    }
    return options.add(p, *keys, defaults=defaults | {"latents": "noise", "out": "bench-out"})


def parse_options(argv: Sequence[str]) -> Options:
    return options.parse(build_parser(), argv, lambda a: options.build("compare", a, QUICK if a.quick else COMPARE))


def main(argv: Sequence[str]) -> int:
    return bench.run_calls(parse_options(argv), ["compare", *argv])
