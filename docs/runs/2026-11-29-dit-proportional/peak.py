"""Peak memory of each preset against the unpatched call (the meta trace's live tensors, `Trace.peak_bytes`), at each
family's first table size, H200 estimate beside it.

    PYTHONPATH=. .venv/bin/python docs/runs/2026-11-29-dit-proportional/peak.py flux,wan,zimage
"""

from __future__ import annotations

import sys

import tome_core
from tome_bench import dit_archs

if __name__ == "__main__":
    for name in sys.argv[1].split(","):
        arch = dit_archs.DIT_ARCHS[dit_archs.TABLE_ARCH[name]]
        for r in dit_archs.estimate_rows(arch, [p.name for p in tome_core.presets()], sizes=[arch.sizes[0]]):
            peak = f"peak {r.peak_ratio:.4f} ({r.peak_bytes / 2**30:.3f} vs {r.base_peak_bytes / 2**30:.3f} GiB)"
            print(name, r.variant, f"{r.speedup:.3f}", f"{r.ops_added:+.1%}", peak, flush=True)
