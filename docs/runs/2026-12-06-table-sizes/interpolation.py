"""The speed table's interpolation checked against the estimate itself: each family at sizes people use that the
table does not hold, the meta-device estimate traced at that exact size beside `tome_core.figures.speed`'s figure
(interpolated in the log of the token count between the two rows around it).

    PYTHONPATH=. .venv/bin/python docs/runs/2026-12-06-table-sizes/interpolation.py > interpolation.log
"""

from tome_bench import dit_archs, options
from tome_core import figures

OFF_TABLE = {
    "flux": [(896, 1152, 1), (1216, 832, 1), (1280, 1280, 1)],
    "qwen": [(1140, 1140, 1), (928, 1664, 1)],
    "zimage": [(1280, 1280, 1), (768, 1344, 1)],
    "wan": [(1024, 576, 65), (960, 544, 49), (1280, 720, 49)],
    "wan22-5b": [(1024, 576, 97), (1280, 704, 65)],
    "hunyuanvideo": [(960, 544, 61), (1280, 720, 97)],
    "ltx": [(768, 512, 97), (1024, 576, 121)],
}

worst = 0.0
print("| family | size | preset | traced | table (interpolated) | difference |")
print("|---|---|---|---:|---:|---:|")
for family, sizes in OFF_TABLE.items():
    arch = dit_archs.DIT_ARCHS[dit_archs.TABLE_ARCH[family]]
    for size in sizes:
        for r in dit_archs.estimate_rows(arch, options.preset_names(), "h200", [size]):
            found = figures.speed(family, r.variant, *size)
            diff = found.speedup / r.speedup - 1
            worst = max(worst, abs(diff))
            text = "x".join(map(str, size if size[2] > 1 else size[:2]))
            print(
                f"| {family} | {text} | {r.variant} | {r.speedup:.3f} | {found.speedup:.3f} {found.bound} | {diff:+.1%} |"
            )
print(f"largest difference: {worst:.1%}")
