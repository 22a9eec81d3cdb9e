"""LTX-Video's and LTX-2's heads' bands (refit.ROPES: each head's pairs), the sink pair, and each head's fitted kernel
of depth 1 at distance 0-5 along every axis at once (refit.Design.logit).

    PYTHONPATH=. python docs/runs/2026-12-06-refit-video/bands.py
"""

from __future__ import annotations

import math

from tome_bench import refit

for name in ("ltx", "ltx2"):
    rope = refit.ROPES[name]
    for head in range(len(rope.bands)):
        pairs = rope.pairs(head)
        turns = [abs(math.remainder(w, 2 * math.pi)) for _, w in pairs]
        design = refit.Design.of(rope, head)
        kernel = ", ".join(f"{design.logit(1.0, k):.2f}" for k in range(6))
        print(
            f"{name} head {head}: angle a token {min(w for _, w in pairs):.3f}-{max(w for _, w in pairs):.1f} rad"
            f" (folded {min(turns):.3f}-{max(turns):.2f}); sink pair {rope.sink_of(head)}; kernel at 0-5: {kernel}"
        )
