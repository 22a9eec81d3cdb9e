"""The lab of tome_core: `python -m tome_bench <job> [its options]`, each job a module with its own options
(`python -m tome_bench <job> --help`).

    python -m tome_bench              # main: every preset on SD1.5 and SDXL beside the unpatched UNet and tomesd,
                                      # the GPU estimate and the stand-ins' change (make bench; ~20 min on 2 cores,
                                      # on the GPU in fp16 where CUDA is available)
    python -m tome_bench compare      # ours at --ratios (--set, --ours) beside tomesd, one UNet call each
    python -m tome_bench peers --steps 10 --peers all --presets all   # whole generations beside every peer
    python -m tome_bench fidelity     # the presets beside tomesd's and ToDo's defaults on the stand-ins
    python -m tome_bench estimate     # what each preset is expected to gain on a GPU (--write: the speed table;
                                      # --dit: the diffusion transformers' full-size configs)
    python -m tome_bench dit-fidelity # the DiT presets beside the naive port and fewer steps on DiT stand-ins
    python -m tome_bench gpu-job      # on a GPU: busy time, wall clocks eager/compiled/CUDA graphs, memory
    python -m tome_bench calibrate OUT/gpu.json --fit    # the GPU estimate's cost model fitted to a GPU job
    python -m tome_bench images --checkpoint FILE         # your checkpoint, unpatched and at each preset: a grid
    python -m tome_bench attention-profile                # where image queries attend: the trained DiT (trained_dit)
                                                          # and the DiT stand-ins, per block and noise level
    python -m tome_bench trained-fidelity                 # the DiT presets on the trained DiT at 4, 8 and 12 steps

Shared once: `options` (the options, `Options`, result rows, the spread), `run` (variants, round-robin rounds,
one UNet call), `generate` (pipelines and whole generations), `timing` (the timed call and the clocks), `report`
(tables, plot, reports), `archs` (the SD1.5/SDXL configs, random weights, checkpoints, inputs), `dit_archs` (the
diffusion transformers' full-size configs and inputs), `ops` (the aten operation counter), `gpu_estimate` (the meta
trace and the cost model), `standin` and `dit_standin` (trained-like attention).
Weights are random unless a checkpoint is named; tomesd and the other peers are optional. The library never
imports this package, and importing it loads nothing but this file.

The spellings before the jobs (`--gpu-job`, `--fidelity`, `--gpu-estimate`, `--images`, `--steps N`, `--compare`
and the options that picked variants) still reach the same jobs.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

#: Job name -> its module.
JOBS = {
    "main": "bench",
    "compare": "compare",
    "peers": "peers",
    "fidelity": "fidelity",
    "dit-fidelity": "dit_fidelity",
    "estimate": "estimate",
    "gpu-job": "gpu_job",
    "calibrate": "calibrate",
    "images": "images",
    "attention-profile": "attention_profile",
    "trained-fidelity": "trained_fidelity",
}
#: The flags that chose a job before the jobs (dropped: they name it), and those that still pick one (kept).
_NAMED = {"--gpu-job": "gpu-job", "--fidelity": "fidelity", "--gpu-estimate": "estimate", "--images": "images"}
_PICKS = {"--steps": "peers", "--compare": "compare", "--quick": "compare", "--ratios": "compare"}
_PICKS |= {"--variants": "compare", "--set": "compare", "--ours": "compare"}


def main(argv: Sequence[str] | None = None) -> int:
    """Run a job with `argv` (default: the command line); its exit status, 0 when every check passed."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    job = args.pop(0) if args and args[0] in JOBS else None
    for flag, name in _NAMED.items():
        if job is None and flag in args:
            job = name
            args.remove(flag)
    job = job or next((_PICKS[a.split("=")[0]] for a in args if a.split("=")[0] in _PICKS), "main")
    args = [a for a in args if a != "--compare"]
    return importlib.import_module(f"tome_bench.{JOBS[job]}").main(args) or 0
