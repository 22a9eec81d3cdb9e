"""The rows for docs/dit.md from this run's JSON: the profile at sigma 0.5 with each figure's factor from the trained
DiT's ("Re-fitted stand-ins" table), and the panel's rows in the calibrated run's table (port, presets, fewer steps,
ratios to the port).

    PYTHONPATH=. python docs/runs/2026-12-06-refit-video/tables.py > docs/runs/2026-12-06-refit-video/tables.md
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from tome_bench.attention_profile import factor
from tome_bench.dit_fidelity import SIZES, variants

HERE = Path(__file__).parent
FIGURES = ("own", "ring1", "within2", "within4", "text", "entropy")


def profile_rows(results: dict, sigma: str = "0.5") -> list[str]:
    base = results["trained"][sigma]["mean"]
    lines = []
    order = sorted((n for n in results if n != "trained"), key=lambda n: (n.split()[0], " refit" not in n, " " in n))
    for name in order:
        result = results[name]
        m = result[sigma]["mean"]
        found = {f: factor(m[f], base[f]) for f in FIGURES}
        cells = [f"{m[f]:.3f}" + ("" if found[f] is None else f" ({found[f]:.2f}x)") for f in FIGURES]
        cells.append("{:.2f}-{:.2f}".format(*m["heads_within4"]))
        cells.append(f"{m['sink_share']:.3f}, {m['sink_at']} ({m['sink_block']})")
        local = max(v for f, v in found.items() if f in FIGURES[:4] and v is not None)
        worst = max(v for v in found.values() if v is not None)
        label = name if " " in name else f"{name} (tied)"
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {local:.2f} | {worst:.2f} |")
    return lines


def _change(value: float) -> str:
    """Three decimals as the other families' rows, four below 0.01 (the video stand-ins' smaller changes)."""
    return f"{value:.3f}" if value >= 0.01 else f"{value:.4f}"


def panel_rows(panel: dict) -> list[str]:
    steps = panel["steps"]
    by: dict[tuple[str, str], dict[str, float]] = {}
    for r in panel["rows"]:
        by.setdefault((r["family"], r["variant"]), {})[r["name"]] = r["generation"]
    lines = []
    for (family, variant), g in by.items():
        port = g["naive port (kv 2x2, every block)"]
        presets = [g[p] for p in ("quality", "balanced", "fast", "fastest")]
        fewer: dict[int, float] = {}
        speeds = {v.name: v.speedup for v in variants(family, SIZES[family]) if v.speedup is not None}
        for name, value in g.items():
            if name in speeds:
                count = max(1, math.ceil(steps / speeds[name] - 1e-9))  # as the panel drops them
                if count < steps:
                    fewer[count] = value
        dropped = ", ".join(f"{c}: {v:.4f}" for c, v in sorted(fewer.items(), reverse=True)) or "none dropped"
        if fewer:
            top = max(fewer)
            ratio = f"{port / fewer[top]:.1f}" if port / fewer[top] >= 1 else f"{port / fewer[top]:.2f}"
            ratio += f" ({top} steps)"
        else:
            ratio = "-"
        cells = [_change(port), *(_change(v) for v in presets), dropped, ratio]
        cells += [f"{v / port:.2f}" for v in presets]
        lines.append(f"| {family} {variant} | " + " | ".join(cells) + " |")
        own = []  # each preset against the step saving at its own speed-up
        for preset, value in zip(("quality", "balanced", "fast", "fastest"), presets):
            name = next(n for n in speeds if n.startswith(f"fewer steps ({preset}'s"))
            count = max(1, math.ceil(steps / speeds[name] - 1e-9))
            own.append(f"{value / g[name]:.2f}x ({count} steps)" if count < steps else "no step to drop")
        OWN.append(f"| {family} {variant} | " + " | ".join(own) + " |")
    return lines


#: Per family and variant: each preset's change over its own step saving's (`panel_rows` fills it).
OWN: list[str] = []


def main() -> None:
    results = {}
    for name in ("profile.json", "profile-ltx2.json"):
        if (HERE / name).exists():
            results |= json.loads((HERE / name).read_text())
    print(
        "| model (sigma 0.5) | own | 8 neighbours | within 2 | within 4 | text | entropy / log N | heads within 4 |"
        " top key (block) | worst factor, own..within 4 | worst factor, all six |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    print("\n".join(profile_rows(results)))
    print()
    print(
        "| family, variant | port | Quality | Balanced | Fast | Fastest | fewer steps (count: change) |"
        " port / fewest-dropped | Q/port | B/port | F/port | Fst/port |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name in ("panel/dit-fidelity.json", "panel-ltx2/dit-fidelity.json"):
        if (HERE / name).exists():
            print("\n".join(panel_rows(json.loads((HERE / name).read_text()))))
    print()
    print("| family, variant | Quality / its step saving | Balanced / its | Fast / its | Fastest / its |")
    print("|---|---|---|---|---|")
    print("\n".join(OWN))


if __name__ == "__main__":
    main()
