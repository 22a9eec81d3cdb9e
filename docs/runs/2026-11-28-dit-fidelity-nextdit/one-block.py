"""One call, seed 0: keys/values subsampled 2x2 in one block (the 1st, 4th, 7th, 10th of twelve) of a family's model.

PYTHONPATH=. python docs/runs/2026-11-28-dit-fidelity-nextdit/one-block.py zimage random  (one-block.log)
"""

import sys

import torch

import tome_core
from tome_bench.dit_standin import FAMILIES, VARIANTS, build, change, one_call

torch.set_num_threads(1)
name, kind = sys.argv[1], sys.argv[2]
family = FAMILIES[name]
model = build(family, VARIANTS[kind])
base = one_call(model, family, 0)
found = []
for i in range(0, 12, 3):
    tome_core.apply_patch(model, mode="kv", sx=2, sy=2, block_start=i / 12, block_end=(i + 1) / 12)
    found.append((i, round(change(one_call(model, family, 0), base), 4), tome_core.stats(model).applied))
    tome_core.remove_patch(model)
print(name, kind, found)
