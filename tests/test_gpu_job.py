"""The GPU job (`python -m tome_bench --gpu-job`, `tome_bench.gpu_job`) on the CPU: `--smoke` runs its eager part's
code on the tiny UNets in float32 (profiles, rows, tables, the resolved fields calibrate rebuilds variants from),
and its tables are checked on canned rows, a disturbed profile among them. The GPU figures themselves come from a
GPU session; nothing here needs one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import tome_bench
import tome_core
from tome_bench import calibrate, gpu_job

#: The variants the smoke run keeps (all of them cost a minute on 2 shared cores): the reference, one preset that
#: pools and one that merges on the tiny UNets, ToDo's reference, tomesd itself where installed.
KEPT = {"baseline", "balanced", "fastest", "ref-todo", "tomesd"}
CANDIDATES = {"kv3-top": {"sd": {"mode": "kv", "sx": 3, "sy": 3}, "sdxl": {"mode": "kv", "sx": 3, "sy": 3}}}


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_gpu_job_smoke_writes_rows_with_profiles_wall_clocks_and_resolved_fields(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`python -m tome_bench --gpu-job --smoke --no-compiled`: per tiny UNet a row per variant with its profile
    (aten operations, device time per operation), peak memory, what the patch merged and the TomeConfig it ran
    (`fields`, a preset resolved for the family); a wall clock beside every variant but the candidates; gpu.json
    as calibrate reads it and gpu.md with a table per model."""
    every = gpu_job.variants
    monkeypatch.setattr(gpu_job, "variants", lambda *a: [v for v in every(*a) if v.name in KEPT | set(CANDIDATES)])
    candidates = tmp_path / "candidates.json"
    candidates.write_text(json.dumps(CANDIDATES))
    out = tmp_path / "job"
    argv = ["--gpu-job", "--smoke", "--no-compiled", "--out", str(out), "--budget-s", "120"]
    assert tome_bench.main([*argv, "--candidates", str(candidates)]) == 0

    data = json.loads((out / "gpu.json").read_text())
    assert data["device"] == "CPU (smoke)"
    rows = {(r["arch"], r["variant"]): r for r in data["rows"]}
    tomesd = ["tomesd"] if any(v.fields == "tomesd" for v in every("tiny", {}, 128)) else []
    sd = ["baseline", "balanced", "fastest", "ref-todo", *tomesd, "kv3-top"]
    assert [v for a, v in rows if a == "tiny"] == sd
    assert [v for a, v in rows if a == "tiny-xl"] == ["baseline", "balanced", "fastest", "ref-todo", "kv3-top"]
    for (_, name), row in rows.items():
        assert row["part"] == "eager" and row["size"] == 128, name
        assert row["aten_calls_per_call"] > 500 and row["gpu_busy_ms"] == 0.0, name  # no CUDA kernels on a CPU
        assert all(len(op) == 5 and op[0].startswith("aten::") for op in row["ops"]), name
        assert ("wall_ms" in row) == (name not in CANDIDATES), name
    assert rows["tiny", "baseline"]["fields"] is None and rows["tiny", "baseline"]["merged"] is None
    for arch, family in (("tiny", "sd"), ("tiny-xl", "sdxl")):
        fields = rows[arch, "fastest"]["fields"]
        assert tome_core.TomeConfig.from_dict(fields) == tome_core.get_preset("fastest").config(family), arch
        assert rows[arch, "kv3-top"]["fields"]["sx"] == 3 and "blocks" in rows[arch, "fastest"]["merged"]
    if tomesd:
        assert rows["tiny", "tomesd"]["fields"] == "tomesd"
    md = (out / "gpu.md").read_text()
    assert md.startswith("# GPU job: CPU (smoke)") and md.count("eager (fp16, batch 2)") == 2

    # calibrate rebuilds every profiled variant from its fields (tomesd included), the candidates too
    points = calibrate.load_points([out / "gpu.json"])
    assert [p.label for p in points] == [f"{a} 128 {v}" for a, v in rows]
    traced = {p.label: sum(op.kernels for op in p.ops.values()) for p in points}
    assert traced["tiny 128 fastest"] != traced["tiny 128 baseline"]  # the patch ran in the trace


def _row(variant: str, conv_ms: float, busy: float, kernels: int, wall: float | None = None) -> dict[str, Any]:
    ops = [["aten::cudnn_convolution", "", 98, conv_ms, 1.0], ["aten::native_group_norm", "", 61, 2.0, 0.5]]
    row = {"part": "eager", "arch": "sd15", "size": 1024, "variant": variant, "gpu_busy_ms": busy}
    row.update(kernels_per_call=kernels, aten_calls_per_call=4000, ops=ops, peak_mib=100.0, merged=None)
    return row if wall is None else {**row, "wall_ms": wall}


def test_tables_compare_with_the_baseline_and_flag_a_disturbed_profile() -> None:
    """Speed-ups and kernels added against the baseline of the same model and size; a row whose untouched
    operations (convolutions, group norms) took more than 5% longer than the baseline's is marked disturbed (another
    process's kernels overlapped its profile), one within 5% is not; the compiled table beside the eager wall."""
    rows = [
        _row("baseline", 10.0, 40.0, 1000, wall=50.0),
        _row("balanced", 10.4, 32.0, 1050, wall=40.0),  # untouched +3%: quiet
        _row("fastest", 11.0, 30.0, 1100),  # untouched +8%: disturbed, no wall clock
        {"part": "compiled", "mode": "default", "arch": "sd15", "size": 1024, "variant": "baseline"}
        | {"compile_s": 60.0, "wall_ms": 30.0, "recompiles": 0, "merged": None},
        {"part": "compiled", "mode": "default", "arch": "sd15", "size": 1024, "variant": "balanced"}
        | {"compile_s": 70.0, "wall_ms": 25.0, "recompiles": 0, "merged": "5/5 blocks (kv 5)"},
    ]
    text = gpu_job.tables(rows, "NVIDIA H200")
    lines = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines() if line.startswith("| ")}
    assert text.startswith("# GPU job: NVIDIA H200") and "## SD1.5 1024 px, eager (fp16, batch 2)" in text
    assert lines["baseline"].startswith("| baseline | 40.00 | 1.00× | 1000 | +0.0% | 50.00 | 1.00× |")
    assert lines["balanced"].startswith("| balanced | 32.00 | 1.25× | 1050 | +5.0% | 40.00 | 1.25× |")
    assert lines["fastest"].startswith("| fastest | 30.00 (disturbed) | 1.33× | 1100 | +10.0% | - | - |")
    assert gpu_job.disturbed(rows[2], rows[0]) and not gpu_job.disturbed(rows[1], rows[0])
    compiled = [line for line in text.splitlines() if line.startswith("| default |")]
    assert compiled[1] == "| default | SD1.5 1024 | balanced | 25.00 | 1.20× | 40.00 | 70 | 0 | 5/5 blocks (kv 5) |"
