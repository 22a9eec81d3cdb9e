"""Where a DiT's image queries attend, measured as the papers on trained DiTs measure it (issue 57): per joint attention
block and noise level, the mean over image queries (and heads, samples) of the attention on the query's own token, on
its 8 neighbours (Chebyshev distance 1 on the token grid; 26 on a video's), within distance 2 and 4 (own token
included), and on the text; the largest single key's weight (mean over queries of the row's maximum); the key that
receives the most (mean over queries of its weight: a sink when far above 1/N) and where it is; the entropy of a
row over log N; the spread over heads of the share within distance 4 (local heads against global ones). On a video
(more than one frame) a row also holds the temporal shares: on the query's own position in the other frames, on it
in the adjacent frames, and the mean weight per key by frame distance at the same position (`frame_rings`) and by
spatial distance in the query's frame (`space_rings`).

It runs on the trained Flux.1-class model (tome_bench.trained_dit, its committed evaluation crops, noise seed 0), on
the trained Wan-class video model (`--models trained-wan`: tome_bench.trained_video, its committed evaluation clips),
and on every stand-in family (tome_bench.dit_standin: the natural-spectrum latent noised to each sigma, as `one_call`
does at 0.5), per stand-in variant (`--variants`: the tied "stand-in", the "refit" one of tome_bench.refit, rows
"flux" and "flux refit"); then, per stand-in row, the factor by which each figure differs from the trained model's
at the same sigma (`factors`; the Wan rows against the trained video model's where it was profiled). Attention is
captured on `F.scaled_dot_product_attention` with a TorchFunctionMode.

    python -m tome_bench attention-profile --out docs/runs/2026-12-06-refit-standins/profile.json
    python -m tome_bench attention-profile --models trained,flux --variants refit --sigmas 0.5
    python -m tome_bench attention-profile --models trained-wan,wan --variants stand-in,refit
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

#: High, middle and low noise.
SIGMAS = (0.9, 0.5, 0.1)
#: The figures of a row, in the table's order.
FIELDS = ("own", "ring1", "within2", "within4", "text", "max_key", "sink_share", "entropy")
#: Rings whose mean weight per key the profile keeps (the fall-off with distance).
RINGS = 9
#: The trained models `--models` names, and their modules.
TRAINED = {"trained": "trained_dit", "trained-wan": "trained_video"}
#: The temporal figures of a video's row, in the table's order.
TEMPORAL = ("own_other_frames", "own_adjacent_frames")
#: The figures `factors` compares with the trained model's; the first four are the locality the refit aims at.
COMPARED = ("own", "ring1", "within2", "within4", "text", "entropy")


@dataclass(frozen=True)
class Layout:
    """Where the generated grid sits in a joint attention's sequence: `before` tokens ahead of it, `grid` (frames,
    rows, columns) of tokens, `text` tokens in the joint sequence besides it."""

    before: int
    grid: tuple[int, int, int]
    text: int

    @property
    def tokens(self) -> int:
        return math.prod(self.grid)

    def distance(self) -> torch.Tensor:
        """[n, n] Chebyshev distance between the grid's tokens (over frames, rows and columns)."""
        f, h, w = self.grid
        pos = torch.stack(torch.meshgrid(torch.arange(f), torch.arange(h), torch.arange(w), indexing="ij"), -1)
        pos = pos.reshape(-1, 3)
        return (pos[:, None] - pos[None]).abs().amax(-1)

    def where(self, key: int) -> str:
        """A key position as a reader finds it: "text i" or "image (frame,) row, column"."""
        if not self.before <= key < self.before + self.tokens:
            return f"text {key - self.before - self.tokens if key >= self.before else key}"
        f, r, c = torch.unravel_index(torch.tensor(key - self.before), self.grid)
        return f"image ({int(r)}, {int(c)})" if self.grid[0] == 1 else f"image ({int(f)}, {int(r)}, {int(c)})"


def _probabilities(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
    """[B, H, L, S] the attention weights of one `scaled_dot_product_attention` call (its mask, scale and grouped
    key heads as the kernel reads them)."""
    q = args[0] if args else kwargs["query"]
    k = args[1] if len(args) > 1 else kwargs["key"]
    mask = args[3] if len(args) > 3 else kwargs.get("attn_mask")
    if k.shape[1] != q.shape[1]:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    scale = kwargs.get("scale") or 1 / math.sqrt(q.shape[-1])
    scores = q.float() @ k.float().transpose(-1, -2) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else scores + mask.float()
    return torch.softmax(scores, -1)


class Profile(TorchFunctionMode):
    """Per joint attention over `layout` (query and key sequences both layout.before + tokens + text long): one row
    of figures (FIELDS, `rings`, `heads_within4`, `sink_at`), appended to `rows` in call order."""

    def __init__(self, layout: Layout) -> None:
        super().__init__()
        self.layout = layout
        self.distance = layout.distance()
        self.rows: list[dict[str, Any]] = []

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            q = args[0] if args else kwargs["query"]
            k = args[1] if len(args) > 1 else kwargs["key"]
            length = self.layout.tokens + self.layout.text
            if q.shape[-2] == length and k.shape[-2] == length:
                self.rows.append(self.row(_probabilities(args, kwargs)))
        return func(*args, **kwargs)

    def row(self, p: torch.Tensor) -> dict[str, Any]:
        """The figures of one attention p [B, H, L, L]."""
        lay, d = self.layout, self.distance
        image = slice(lay.before, lay.before + lay.tokens)
        rows = p[..., image, :]  # [B, H, n, L]: the image's queries
        on_image = rows[..., image]  # [B, H, n, n]

        def within(mask: torch.Tensor) -> torch.Tensor:  # [B, H]: mean over queries of the weight on `mask`'s keys
            return torch.einsum("bhqk,qk->bh", on_image, mask.to(p.dtype)) / lay.tokens

        received = rows.mean((0, 1, 2))  # [L]
        sink = int(received.argmax())
        counts = torch.stack([(d == j).sum(-1).float().mean() for j in range(RINGS)])
        rings = torch.stack([within(d == j).mean() for j in range(RINGS)])
        entropy = -(rows.clamp_min(1e-12).log() * rows).sum(-1).mean() / math.log(p.shape[-1])
        return {
            "own": within(d == 0).mean().item(),
            "ring1": within(d == 1).mean().item(),
            "within2": within(d <= 2).mean().item(),
            "within4": within(d <= 4).mean().item(),
            "text": (rows.sum(-1) - on_image.sum(-1)).mean().item(),
            "max_key": rows.amax(-1).mean().item(),
            "sink_share": received[sink].item(),
            "sink_at": lay.where(sink),
            "entropy": entropy.item(),
            "heads_within4": within(d <= 4).mean(0).tolist(),
            "rings": (rings / counts).tolist(),  # mean weight per key at distance 0 .. RINGS - 1
        } | (self.temporal(on_image) if lay.grid[0] > 1 else {})

    def temporal(self, on_image: torch.Tensor) -> dict[str, Any]:
        """A video's temporal figures from the image's attention on_image [B, H, n, n] (n = frames * rows * columns);
        shares as `row`'s (mean over queries of the weight on a region), rings as weight per key."""
        f, h, w = self.layout.grid
        n, hw = f * h * w, h * w
        p = on_image.reshape(*on_image.shape[:2], f, hw, f, hw)  # [B, H, F, s, F', s']
        # [F, F']: the weight each frame's queries put on their own positions in each frame, summed over positions
        at_own = torch.diagonal(p, dim1=3, dim2=5).mean((0, 1)).sum(-1)
        # [s, s']: the weight each position's queries put on each position of their own frame, summed over frames
        in_frame = torch.diagonal(p, dim1=2, dim2=4).mean((0, 1)).sum(-1)
        frame = torch.arange(f)
        apart = (frame[:, None] - frame[None]).abs()  # [F, F']
        space = Layout(0, (1, h, w), 0).distance()  # [s, s']

        def per_key(weights: torch.Tensor, mask: torch.Tensor, queries: int) -> float:
            # the mean over queries of the weight on mask's keys, over the mean count of such keys a query has
            return (weights[mask].sum() / n / (mask.sum() / queries)).item()

        return {
            "own_other_frames": (at_own[apart > 0].sum() / n).item(),
            "own_adjacent_frames": (at_own[apart == 1].sum() / n).item(),
            "frame_rings": [per_key(at_own, apart == j, f) for j in range(f)],
            "space_rings": [per_key(in_frame, space == j, hw) for j in range(RINGS)],
        }


def summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The mean of each figure over blocks; the strongest sink over blocks with its block; the heads' range."""
    out: dict[str, Any] = {f: sum(r[f] for r in rows) / len(rows) for f in FIELDS if f != "sink_share"}
    block = max(range(len(rows)), key=lambda i: rows[i]["sink_share"])
    out |= {"sink_share": rows[block]["sink_share"], "sink_at": rows[block]["sink_at"], "sink_block": block}
    heads = [h for r in rows for h in r["heads_within4"]]
    out |= {"heads_within4": [min(heads), max(heads)], "blocks": len(rows)}
    out["rings"] = [sum(r["rings"][j] for r in rows) / len(rows) for j in range(RINGS)]
    for f in TEMPORAL if TEMPORAL[0] in rows[0] else ():
        out[f] = sum(r[f] for r in rows) / len(rows)
    for f in ("frame_rings", "space_rings") if TEMPORAL[0] in rows[0] else ():
        out[f] = [sum(r[f][j] for r in rows) / len(rows) for j in range(len(rows[0][f]))]
    return out


@torch.no_grad()
def trained(sigmas: Sequence[float], name: str = "trained") -> dict[str, Any]:
    """A trained model's profile (TRAINED: "trained", the Flux.1-class DiT; "trained-wan", the Wan-class video model)
    per sigma on its committed evaluation crops or clips (noise seed 0, their labels)."""
    import importlib

    module = importlib.import_module(f"tome_bench.{TRAINED[name]}")
    model = module.load()
    x0, label = module.eval_set()
    side = x0.shape[-1] // 2
    if x0.dim() == 5:  # a video [N, C, F, H, W]: Wan's self-attention holds the video alone (text is cross-attended)
        layout = Layout(0, (x0.shape[2], x0.shape[-2] // 2, side), 0)
    else:
        layout = Layout(module.TEXT, (1, side, side), module.TEXT)
    noise = torch.randn(x0.shape, generator=torch.Generator().manual_seed(0))
    grid = side if x0.dim() == 4 else list(layout.grid)
    out: dict[str, Any] = {"parameters": module.parameters(model), "grid": grid, "crops": len(x0)}
    for sigma in sigmas:
        with Profile(layout) as profile:
            model((1 - sigma) * x0 + sigma * noise, torch.full((len(x0),), sigma), label)
        out[str(sigma)] = {"mean": summary(profile.rows), "blocks": profile.rows}
    return out


@torch.no_grad()
def standin(name: str, sigmas: Sequence[float], seed: int = 0, variant: str = "stand-in") -> dict[str, Any]:
    """A stand-in family's profile per sigma: its natural-spectrum latent noised to sigma, one call; `variant` of
    refit.VARIANTS (the tied "stand-in", the re-fitted "refit")."""
    from tome_bench.dit_standin import FAMILIES, build, call, sample_inputs
    from tome_bench.refit import VARIANTS

    family = FAMILIES[name]
    model = build(family, VARIANTS[variant], seed)
    # Where the family's self-attention holds its text (first, last, or none: cross-attended) and its patch.
    layout = Layout(*family.joint_layout())
    frames, grid = family.grid[0], family.grid
    noise, natural, states = sample_inputs(family, seed)
    out: dict[str, Any] = {"grid": grid[1] if frames == 1 else list(grid)}
    for sigma in sigmas:
        with Profile(layout) as profile:
            call(model, family, (1 - sigma) * natural + sigma * noise, sigma, states)
        out[str(sigma)] = {"mean": summary(profile.rows), "blocks": profile.rows}
    return out


def table(results: dict[str, Any]) -> str:
    """A Markdown table: one row per model and sigma, the figures' means over blocks."""
    head = "| model | sigma | own | 8 neighbours | within 2 | within 4 | text | max key | top key: share, where"
    lines = [head + " | entropy / log N | heads within 4 |", "|" + " --- |" * 11]
    for name, result in results.items():
        for sigma, per in result.items():
            if not isinstance(per, dict):
                continue
            m = per["mean"]
            cells = [f"{m[f]:.3f}" for f in FIELDS[:6]]
            cells.append(f"{m['sink_share']:.3f}, {m['sink_at']} (block {m['sink_block']})")
            cells.append(f"{m['entropy']:.3f}")
            cells.append("{:.2f}-{:.2f}".format(*m["heads_within4"]))
            lines.append(f"| {name} | {sigma} | " + " | ".join(cells) + " |")
    if any(TEMPORAL[0] in per["mean"] for r in results.values() for per in r.values() if isinstance(per, dict)):
        lines += ["", temporal_table(results)]
    return "\n".join(lines)


def temporal_table(results: dict[str, Any]) -> str:
    """A Markdown table of the video rows' temporal figures: the own position in other and adjacent frames, the mean
    weight per key by frame distance (same position) and by spatial distance in the query's frame (0-4)."""
    lines = ["| model | sigma | own, other frames | own, adjacent frames | per key by frame distance 0.. |"]
    lines[0] += " per key by distance in its frame 0-4 |"
    lines.append("|" + " --- |" * 6)
    for name, result in results.items():
        for sigma, per in result.items():
            if not isinstance(per, dict) or TEMPORAL[0] not in per["mean"]:
                continue
            m = per["mean"]
            cells = [f"{m[f]:.3f}" for f in TEMPORAL]
            cells.append(" / ".join(f"{v:.4f}" for v in m["frame_rings"]))
            cells.append(" / ".join(f"{v:.4f}" for v in m["space_rings"][:5]))
            lines.append(f"| {name} | {sigma} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def factor(value: float, reference: float) -> float | None:
    """How many times apart two shares are (>= 1); None where either is zero (Wan's self-attention has no text)."""
    if value <= 0 or reference <= 0:
        return None
    return max(value / reference, reference / value)


def factors(results: dict[str, Any], reference: str = "trained") -> str:
    """A Markdown table: per stand-in row and sigma, each COMPARED figure's factor from the reference model's at
    the same sigma, the worst of the locality figures (own to within 4) and the worst of all."""
    head = "| model | sigma | " + " | ".join(COMPARED) + " | worst (own..within 4) | worst (all) |"
    lines = [head, "|" + " --- |" * (len(COMPARED) + 4)]
    for name, result in results.items():
        if name in TRAINED:
            continue
        # The Wan stand-ins against the trained video model where it was profiled.
        against = "trained-wan" if name.split()[0] == "wan" and "trained-wan" in results else reference
        if against not in results:
            continue
        base = results[against]
        for sigma, per in result.items():
            if not isinstance(per, dict) or sigma not in base:
                continue
            found = {f: factor(per["mean"][f], base[sigma]["mean"][f]) for f in COMPARED}
            cells = ["-" if v is None else f"{v:.2f}" for v in found.values()]
            local = max(v for f, v in found.items() if f in COMPARED[:4] and v is not None)
            worst = max(v for v in found.values() if v is not None)
            lines.append(f"| {name} | {sigma} | " + " | ".join(cells) + f" | {local:.2f} | {worst:.2f} |")
    return "\n".join(lines)


def blocks_log(results: dict[str, Any]) -> str:
    """Per model, sigma and block: the row's figures, and the mean weight per key by distance."""
    lines = []
    for name, result in results.items():
        for sigma, per in result.items():
            if not isinstance(per, dict):
                continue
            for i, r in enumerate(per["blocks"]):
                figures = " ".join(f"{f} {r[f]:.3f}" for f in FIELDS)
                rings = " ".join(f"{v:.4f}" for v in r["rings"])
                line = f"{name} sigma {sigma} block {i}: {figures} sink at {r['sink_at']}; per key by ring {rings}"
                if TEMPORAL[0] in r:
                    line += " ; " + " ".join(f"{f} {r[f]:.3f}" for f in TEMPORAL)
                    line += "; per key by frame distance " + " ".join(f"{v:.4f}" for v in r["frame_rings"])
                lines.append(line)
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    from tome_bench.dit_standin import FAMILIES

    parser = argparse.ArgumentParser(
        prog="python -m tome_bench attention-profile", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--models", default="trained," + ",".join(FAMILIES), help="trained models (trained, trained-wan), stand-ins"
    )
    parser.add_argument(
        "--variants", default="stand-in,refit", help="stand-in variants (refit.VARIANTS; default stand-in,refit)"
    )
    parser.add_argument("--sigmas", default=",".join(map(str, SIGMAS)))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="the JSON of every figure (per block too)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    sigmas = [float(s) for s in args.sigmas.split(",")]
    results = {}
    for name in args.models.split(","):
        for variant in ["trained"] if name in TRAINED else args.variants.split(","):
            key = name if variant in ("trained", "stand-in") else f"{name} {variant}"
            results[key] = trained(sigmas, name) if name in TRAINED else standin(name, sigmas, variant=variant)
            print(f"{key}: done", flush=True)
    print(table(results))
    if "trained" in results or "trained-wan" in results:
        print()
        print(factors(results))
    print(blocks_log(results))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
