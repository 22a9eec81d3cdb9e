"""The 2026-11-26 H200 run in one table and one plot, from the bench.json files of its jobs.

python docs/runs/2026-11-26-h200/summarize.py DIR1 DIR2 (the two batches' output folders, /tmp/gpu on the device).
Per (arch, size, preset): the quiet batch where it ran, else the parallel one.
"""

from __future__ import annotations

import glob
import json
import sys
from pathlib import Path

ORDER = {"quality": 0, "balanced": 1, "fast": 2, "fastest": 3}


def load(folders: list[str]) -> list[dict]:
    out: dict[tuple, dict] = {}
    for folder in folders:
        for path in sorted(glob.glob(f"{folder}/*/*.json")):
            data = json.loads(Path(path).read_text())
            quiet = "--lock-after" in data["command"]
            mode = "reduce-overhead" if "reduce-overhead" in data["command"] else data["mode"]
            rows = {r["variant"]: r for r in data["rows"]}
            for name, r in rows.items():
                if r["compiled"] or name == "baseline":
                    continue
                twin, base, cbase = rows[name + "+compile"], rows["baseline"], rows["baseline+compile"]
                key = (mode, r["arch"], int(r["size"]), name.split("=")[-1])
                if key in out and out[key]["quiet"] and not quiet:
                    continue
                out[key] = dict(
                    mode=mode,
                    arch=r["arch"],
                    size=int(r["size"]),
                    preset=name.split("=")[-1],
                    quiet=quiet,
                    eager=r["speedup"],
                    compiled=twin["speedup"],
                    vs_eager=twin["speedup_vs_eager"],
                    base_ms=(base["median_s"] * 1e3, cbase["median_s"] * 1e3),
                    ms=(r["median_s"] * 1e3, twin["median_s"] * 1e3),
                    spread=max(x["spread"] for x in (r, twin, base, cbase)),
                    compile_s=twin["compile_s"],
                    graphs=(twin["graphs"], twin["recompiles"]),
                    deviation=r["deviation"],
                )
    order = {"call": 0, "generate": 1, "reduce-overhead": 2}
    return sorted(out.values(), key=lambda x: (order[x["mode"]], x["arch"], x["size"], ORDER[x["preset"]]))


def table(rows: list[dict]) -> str:
    lines = [
        "| what | arch | px | preset | eager speed-up | compiled speed-up | compiled vs eager baseline"
        " | baseline ms eager / compiled | preset ms eager / compiled | worst spread | timed | compile s"
        " | graphs / recompiles | deviation |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for r in rows:
        what = {"call": "per call", "generate": "10 steps", "reduce-overhead": "per call, reduce-overhead"}[r["mode"]]
        lines.append(
            f"| {what} | {r['arch']} | {r['size']} | {r['preset']} | {r['eager']:.2f}x | {r['compiled']:.2f}x"
            f" | {r['vs_eager']:.2f}x | {r['base_ms'][0]:.0f} / {r['base_ms'][1]:.0f}"
            f" | {r['ms'][0]:.0f} / {r['ms'][1]:.0f} | {r['spread']:.0%} | {'quiet' if r['quiet'] else 'parallel'}"
            f" | {r['compile_s']:.0f} | {r['graphs'][0]} / {r['graphs'][1]} | {r['deviation']:.4f} |"
        )
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = [(a, s) for a in ("sd15", "sdxl") for s in (1024, 2048)]
    fig, axes = plt.subplots(1, len(groups), figsize=(14, 3.6), sharey=True)
    for ax, (arch, size) in zip(axes, groups):
        sel = [r for r in rows if r["mode"] == "call" and r["arch"] == arch and r["size"] == size]
        xs = range(len(sel))
        ax.bar([x - 0.2 for x in xs], [r["eager"] for r in sel], 0.4, label="eager / eager baseline")
        ax.bar([x + 0.2 for x in xs], [r["compiled"] for r in sel], 0.4, label="compiled / compiled baseline")
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_xticks(list(xs), [r["preset"] for r in sel])
        ax.set_title(f"{'SD1.5' if arch == 'sd15' else 'SDXL'} {size} px")
    axes[0].set_ylabel("speed-up of one UNet call")
    axes[0].legend(fontsize=8)
    fig.suptitle("ToMe presets on an NVIDIA H200, fp16, SDPA: eager and torch.compile (inductor, fullgraph)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


if __name__ == "__main__":
    rows = load(sys.argv[1:])
    print(table(rows))
    plot(rows, Path("docs/h200-compiled.png"))
