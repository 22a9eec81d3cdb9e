"""Experiment (issue 57's open clause): each query's nearby keys exact, the far ones by their cells' kept keys.

The kept keys' attention (keys/values subsampled in cells, each kept key weighing as its cell) beside a window of
exact keys around each query: a key in the query's window counts as itself; a cell's kept key outside it weighs as
the cell's tokens that lie outside the window. Explicit masked attention (slow, an experiment only: a monkeypatch
of tome_core.dit.AttentionHook.attend); the question is only whether exact near keys bring the change of a
generation within the step saving.

    PYTHONPATH=. .venv/bin/python docs/runs/2026-12-06-local-exact/local.py [flux|wan] [threads]
"""

import sys

import torch

import tome_core
from tome_bench import trained_fidelity as tf
from tome_core import dit

which = sys.argv[1] if len(sys.argv) > 1 else "flux"
torch.set_num_threads(int(sys.argv[2]) if len(sys.argv) > 2 else 2)
WINDOW = {"kind": "own", "r": 0}  # set per run below
_cache: dict = {}


def window_mask(grid, kind, r, rt, device):
    """[n, n] bool: key j lies in query i's window."""
    t, h, w = grid
    i = torch.arange(t * h * w, device=device)
    ti, yi, xi = i // (h * w), (i // w) % h, i % w
    dt = (ti[:, None] - ti[None, :]).abs()
    if kind in ("nbr", "own"):  # Chebyshev distance <= r in the frame, <= rt frames
        return ((yi[:, None] - yi[None, :]).abs() <= r) & ((xi[:, None] - xi[None, :]).abs() <= r) & (dt <= rt)
    if kind == "tile":  # the same r x r tile (and rt-frame slab)
        same = ((yi // r)[:, None] == (yi // r)[None, :]) & ((xi // r)[:, None] == (xi // r)[None, :])
        return same & ((ti // max(rt, 1))[:, None] == (ti // max(rt, 1))[None, :])
    if kind == "band":  # the same band of r rows, whole width (tokens contiguous in the sequence)
        return ((yi // r)[:, None] == (yi // r)[None, :]) & ((ti // max(rt, 1))[:, None] == (ti // max(rt, 1))[None, :])
    raise ValueError(kind)


def log_weights(tokens, after, plan, kept, device):
    """[L, L] float: log of the weight each key carries for each query (-inf: not attended)."""
    before, grid = tokens.before, tokens.grid
    t, h, w = grid
    n = t * h * w
    L = before + n + after
    i = torch.arange(n, device=device)
    ti, yi, xi = i // (h * w), (i // w) % h, i % w
    cell = ((ti // plan.st) * (-(-h // plan.sy)) + yi // plan.sy) * (-(-w // plan.sx)) + xi // plan.sx  # [n]
    win = window_mask(grid, WINDOW["kind"], WINDOW["r"], WINDOW.get("rt", 0), device)  # [n, n]
    reps = kept[(kept >= before) & (kept < before + n)] - before  # grid indices of kept keys
    # outside[i, c]: tokens of cell c outside query i's window
    onehot = torch.nn.functional.one_hot(cell, int(cell.max()) + 1).float()  # [n, C]
    outside = (~win).float() @ onehot  # [n, C]
    lw = torch.full((L, L), float("-inf"), device=device)
    lw[:, :before] = 0.0
    lw[:, before + n :] = 0.0
    g = lw[before : before + n, before : before + n]
    g[win] = 0.0
    rep_w = outside[:, cell[reps]]  # [n, K]
    g[:, reps] = torch.where(win[:, reps], torch.zeros_like(rep_w), rep_w.log())
    # queries outside the grid: every cell by its kept key
    full = onehot.sum(0)[cell[reps]].log()
    lw[:before, before + reps] = full
    lw[before + n :, before + reps] = full
    lw[:before, before : before + n][:, ~torch.isin(i, reps)] = float("-inf")
    return lw


def attend(self, state, query, key, value, mask, scale, kernel=None):
    tokens = state.tokens
    if tokens is None:
        return None
    L = int(key.shape[-2])
    after = tokens.after_in(L)
    if after is None or mask is not None:
        return None
    self.reached = self.applied = True
    kept = dit._index(state, tokens, after, self.plan, key.device)
    ck = (tuple(kept.tolist()), tokens.before, tokens.grid, after, WINDOW["kind"], WINDOW["r"], WINDOW.get("rt", 0))
    lw = _cache.get(ck)
    if lw is None:
        lw = _cache[ck] = log_weights(tokens, after, self.plan, kept, key.device)
    scale = scale if scale is not None else query.shape[-1] ** -0.5
    s = (query.float() @ key.float().transpose(-1, -2)) * scale + lw
    return (s.softmax(-1) @ value.float()).to(query.dtype)


dit.AttentionHook.attend = attend

spec = tf.MODELS[which]
model = tf._load(which)
g = torch.Generator().manual_seed(0)
samples = 4
noise = torch.randn(samples, *spec.latent, generator=g)
labels = torch.arange(samples) % model.null
steps = 12
base = tf.generate(model, noise, labels, steps)
drops = {k: tf.change(tf.generate(model, noise, labels, k), base) for k in range(8, steps)}
print("dropped to k steps:", {k: round(v, 4) for k, v in drops.items()}, flush=True)
video = which == "wan"
column = len(sys.argv) > 3 and sys.argv[3] == "column"
windows = [("own", 0, 0), ("nbr", 1, 0), ("nbr", 2, 0), ("tile", 4, 1), ("tile", 8, 1), ("band", 2, 1), ("band", 4, 1)]
if video:
    windows += [("nbr", 1, 1), ("nbr", 2, 1)]
settings = [
    {"mode": "kv", "sx": 2, "sy": 2, "step_start": 0.5},
    {"mode": "kv", "sx": 2, "sy": 2, "step_start": 0.0},
    {"mode": "kv", "sx": 4, "sy": 4, "step_start": 0.5},
]
if column:  # the query's own position in the neighbouring frames, or in every frame: a temporal column
    windows = [("own", 0, 0), ("nbr", 0, 1), ("nbr", 0, 99), ("nbr", 1, 1)]
    settings = [dict(p.families["wan"]) for p in tome_core.presets()]
for fields in settings:
    for kind, r, rt in windows:
        WINDOW.update(kind=kind, r=r, rt=rt)
        _cache.clear()
        found = tf._measure(model, noise, labels, steps, base, dict(fields), own_key=True)
        print(f"{which} {steps} steps {fields} window {kind} r={r} rt={rt}: change {found:.4f}", flush=True)
