"""The GPU job (`python -m tome_bench gpu-job`, `tome_bench.gpu_job`) on the CPU: its rules run on the tiny UNets with
a fake timer in place of the GPU's clock (compile before timing, variants interleaved, a disturbed row re-run and
flagged, baselines out of line stopping the job), its dry run from its own entry (rows calibrate reads, one real
dynamo compile that no timed round compiles again), and the speed table it and `estimate --write` write. The GPU
figures themselves come from a GPU session; nothing here needs one."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import tome_bench
from tome_bench import calibrate, dit_archs, estimate, gpu_job, kernels, options
from tome_bench.gpu_job import Case, Device, Job, Stop, Timed

CASE = Case("tiny", 32)
#: Milliseconds per call the fake clock gives each mode's rows: the compiled modes faster than eager, as on a GPU.
MS = {"eager": 10.0, "compiled": 8.0, "cudagraphs": 6.0}


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def few_variants(monkeypatch: pytest.MonkeyPatch) -> None:
    """The baseline, two presets and ToDo's reference: every kind of row, a few warm calls of the tiny UNet each."""
    every = gpu_job.variants
    keep = {"baseline", "quality", "fastest", "ref-todo"}
    monkeypatch.setattr(gpu_job, "variants", lambda *a: [v for v in every(*a) if v.name in keep])


def fake_device(ms: Callable[[Timed], float], graphs: Callable[[], int] = lambda: 0) -> Device:
    """The device calls of the job, none touching a GPU: the timer answers `ms(row)` without calling (the job's own
    warm call before each sample still runs the model), one profile is 5 ms of busy time, compiling is nothing."""
    return Device(
        "fake", torch.device("cpu"), torch.float32, timer=lambda row, call, calls: ms(row),
        profile=lambda call: (5.0, 100, [["aten::mm", "", 10, 5.0, 1.0]]), peak_mib=lambda call: 1.0,
        compile=lambda model, mode: model, graphs=graphs,
    )  # fmt: skip


def run_job(tmp_path: Path, ms: Callable[[Timed], float], **kwargs: Any) -> tuple[Job, dict[str, Any]]:
    job = Job(fake_device(ms, **kwargs), [CASE], gpu_job.MODES, 600.0, tmp_path, rounds=4)
    try:
        job.run()
        stopped = None
    except Stop as exc:
        stopped = str(exc)
    return job, job.payload(stopped)


def steady(row: Timed) -> float:
    return MS[row.mode] * (0.9 if row.variant.name != "baseline" else 1.0) * (1 + 0.001 * len(row.samples))


def test_compiles_come_before_every_timing_and_rows_are_interleaved(tmp_path: Path, few_variants: None) -> None:
    job, data = run_job(tmp_path, steady)
    kinds = [kind for kind, _ in job.events]
    first_timed = min(kinds.index("time"), kinds.index("profile"))
    assert "compile" in kinds and max(i for i, k in enumerate(kinds) if k == "compile") < first_timed
    # every compiled and CUDA-graph row was built: the baseline and the presets, not the reference
    assert {what for kind, what in job.events if kind == "compile"} == {
        f"tiny 32 {v} {m}" for v in ("baseline", "quality", "fastest") for m in ("compiled", "cudagraphs")
    }
    # round-robin: each round times every row once, in the same order
    timed = [what for kind, what in job.events if kind == "time"]
    rows = len(timed) // job.rounds
    assert rows == 4 + 3 * 2 and all(timed[r * rows : (r + 1) * rows] == timed[:rows] for r in range(job.rounds))
    assert len(set(timed[:rows])) == rows
    profiled = [what for kind, what in job.events if kind == "profile"]
    assert len(profiled) == 4 * job.profiles and len(set(profiled[:4])) == 4
    (row,) = [r for r in data["rows"] if r["variant"] == "fastest"]
    assert row["timings"]["eager"]["median_ms"] == pytest.approx(9.0, rel=0.01) and row["timings"]["eager"]["reliable"]
    assert (
        len(row["timings"]["eager"]["samples_ms"]) == job.rounds and row["busy_reliable"] and row["gpu_busy_ms"] == 5.0
    )
    assert data["stopped"] is None and "baselines in line" in data["checks"][-1]
    # first, the kernels each query's own key reads the log-sum-exp from, against the plain operations
    assert [c.split(":")[0] for c in data["checks"][:2]] == [
        f"own key's attention {w} a mask" for w in ("without", "with")
    ]
    # then the masked attention a per-key weight would need, timed against flash (docs/runs/2026-11-29-text-weight)
    assert [c.split(":")[0] for c in data["checks"][2:4]] == [
        f"masked attention at {m}" for m in ("Flux.1-dev 1024 px", "Wan 2.1 1.3B 480p")
    ]
    assert all("flash" in c and "rate" in c for c in data["checks"][2:4])
    # then each kernel library the own key can run under (issue 58), named where it is not installed
    assert [c.split(":")[0] for c in data["checks"][4:8]] == [name for name, *_ in kernels.LIBRARIES]
    assert all("not installed here" in c or "not run off a GPU" in c for c in data["checks"][4:8])
    assert row["fields"]["sx"] == 8 and "blocks" in row["merged"]  # what ran, as calibrate rebuilds it
    md = gpu_job.tables(data)
    assert "| fastest | 5.00 (0%) | 1.00x |" in md and "1.11x" in md


@pytest.mark.parametrize("lasting", [True, False])
def test_a_disturbed_row_is_timed_again_with_its_baseline_then_flagged(
    tmp_path: Path, few_variants: None, lasting: bool
) -> None:
    """A fake clock that disturbs one row (every other sample 30% slower): the row and its baseline are timed again,
    interleaved, after the rounds; still above 5% the row is unreliable, printed so and feeds no speed-up. A
    disturbance that passed (only the first rounds) leaves the row reliable after the re-run."""

    def ms(row: Timed) -> float:
        hit = row.variant.name == "quality" and row.mode == "eager" and (lasting or not row.first)
        return steady(row) * (1.3 if hit and len(row.samples) % 2 else 1.0)

    job, data = run_job(tmp_path, ms)
    timed = [what for kind, what in job.events if kind == "time"]
    after = timed[10 * job.rounds :]
    assert after == ["tiny 32 baseline eager", "tiny 32 quality eager"] * job.rounds
    quality = job.rows["tiny 32", "quality", "eager"]
    assert len(quality.first) == job.rounds and quality.reliable is not lasting
    (row,) = [r for r in data["rows"] if r["variant"] == "quality"]
    assert row["timings"]["eager"]["reliable"] is not lasting
    line = next(line for line in gpu_job.tables(data).splitlines() if line.startswith("| quality |"))
    if lasting:
        assert "unreliable | - |" in line and (tmp_path / "gpu-job.log").read_text().count("UNRELIABLE") == 1
    else:
        assert "unreliable" not in line
    assert all(r.reliable for key, r in job.rows.items() if key[1:] != ("quality", "eager"))


@pytest.mark.parametrize(
    ("mode", "slow", "words"),
    [
        (
            "cudagraphs",
            1.02,
            "the CUDA-graph baseline took 10.200 ms per call, slower than the eager baseline's 10.000",
        ),
        ("compiled", 1.5, "the compiled baseline took 15.000 ms per call, slower than the eager baseline's 10.000 ms"),
    ],
)
def test_a_baseline_out_of_line_stops_the_job_saying_what_is_wrong(
    tmp_path: Path, few_variants: None, mode: str, slow: float, words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    def ms(row: Timed) -> float:
        if row.variant.name == "baseline" and row.mode in ("eager", mode):
            return 10.0 * (slow if row.mode == mode else 1.0)
        return steady(row)

    device = fake_device(ms)
    code = gpu_job.main(["--cases", "tiny:32", "--rounds", "3", "--out", str(tmp_path)], device=device)
    assert code == 1
    data = json.loads((tmp_path / "gpu.json").read_text())
    assert words in data["stopped"] and data["stopped"].startswith("tiny 32: ")
    assert f"**Stopped: tiny 32: {words}" in (tmp_path / "gpu.md").read_text()
    assert f"STOPPED: tiny 32: {words}" in capsys.readouterr().out


def test_a_graph_compiled_during_the_timed_rounds_stops_the_job(tmp_path: Path, few_variants: None) -> None:
    counter = iter(range(10**6))
    _, data = run_job(tmp_path, steady, graphs=lambda: next(counter))
    assert "graph(s) compiled during the timed rounds" in data["stopped"]


def test_the_budget_leaves_compiles_out_and_says_so(tmp_path: Path, few_variants: None, monkeypatch) -> None:
    monkeypatch.setattr(gpu_job, "COMPILE_GUESS_S", {"sd": 10**6, "sdxl": 10**6})
    job, data = run_job(tmp_path, steady)
    assert not [e for e in job.events if e[0] == "compile"]
    assert sum("not compiled (budget" in n for n in data["not_run"]) == 6
    (row,) = [r for r in data["rows"] if r["variant"] == "baseline"]
    assert set(row["timings"]) == {"busy", "eager"} and "| not run | - |" in gpu_job.tables(data)


def test_the_dry_run_from_its_entry_compiles_once_and_writes_what_calibrate_reads(tmp_path: Path, monkeypatch) -> None:
    """`python -m tome_bench gpu-job --dry-run`: the tiny UNet on the CPU, dynamo compiling for real (its eager
    backend): re-applying a patch between timed samples compiles nothing again (else the job would stop)."""
    every = gpu_job.variants
    monkeypatch.setattr(gpu_job, "variants", lambda *a: [v for v in every(*a) if v.name in ("baseline", "balanced")])
    torch._dynamo.reset()
    argv = ["gpu-job", "--dry-run", "--cases", "tiny:32", "--modes", "eager,compiled", "--rounds", "2", "--calls", "1"]
    assert tome_bench.main([*argv, "--out", str(tmp_path)]) == 0
    torch._dynamo.reset()
    data = json.loads((tmp_path / "gpu.json").read_text())
    assert data["dry_run"] and data["stopped"] is None and data["device"] == "CPU (dry run)"
    assert [(r["variant"], sorted(r["timings"])) for r in data["rows"]] == [
        (v, ["busy", "compiled", "eager"]) for v in ("baseline", "balanced")
    ]
    assert all(r["aten_calls_per_call"] > 100 and r["gpu_busy_ms"] > 0 for r in data["rows"])
    points = calibrate.load_points([tmp_path / "gpu.json"])
    assert [p.label for p in points] == ["tiny 32 baseline", "tiny 32 balanced"]
    assert tome_bench.main(["calibrate", str(tmp_path / "gpu.json")]) == 0  # the error table, from its own entry
    assert gpu_job.write(data) == 2  # a dry run measured nothing for the speed table


def test_disturbed_profiles_of_older_runs_are_told_by_their_untouched_operations() -> None:
    def row(conv_ms: float) -> dict[str, Any]:
        return {
            "ops": [["aten::cudnn_convolution", "", 98, conv_ms, 1.0], ["aten::native_group_norm", "", 61, 2.0, 0.5]]
        }

    assert gpu_job.disturbed(row(11.0), row(10.0)) and not gpu_job.disturbed(row(10.4), row(10.0))


# ---------------------------------------------------------------------------------------------- the speed table


def test_the_speed_table_holds_every_family_preset_and_size_in_order() -> None:
    data = json.loads(estimate.SPEED_TABLE.read_text())
    assert data["about"].startswith("written by `python -m tome_bench estimate --write`")
    gpu = {"device": "NVIDIA H200", "measured": False}
    assert data["sources"] == {
        "h200-estimate-2026-11-27": gpu | {"what": estimate.ESTIMATED.format(batch=2, gpu="H200", date="2026-11-27")},
        **{
            f"h200-estimate-2026-11-27-batch{b}": gpu
            | {"what": estimate.ESTIMATED.format(batch=b, gpu="H200", date="2026-11-27")}
            for b in (1, 2)
        },
    }
    presets = options.preset_names()
    unets = [a for a in tome_bench.archs.ARCHS.values() if a.table_sizes]
    sizes = {a.family: [(s, s, 1) for s in a.table_sizes] for a in unets}
    dits = {family: dit_archs.DIT_ARCHS[name] for family, name in dit_archs.TABLE_ARCH.items()}
    sizes |= {family: list(arch.sizes) for family, arch in dits.items()}
    expected = [(family, preset, *size) for family in sorted(sizes) for preset in presets for size in sizes[family]]
    assert [(r["family"], r["preset"], r["width"], r["height"], r["frames"]) for r in data["rows"]] == expected
    for r in data["rows"]:
        batch = dits[r["family"]].batch if r["family"] in dits else None
        assert r["source"] == "h200-estimate-2026-11-27" + (f"-batch{batch}" if batch else "")
        # A diffusion transformer at 512 px has too few tokens for the kernels a preset adds to pay: under 1x there.
        small = r["family"] in dits and r["width"] * r["height"] * r["frames"] < 1024 * 1024
        assert r["speedup"] == round(r["speedup"], 3) and (0.9 if small else 1.0) < r["speedup"] < 8.0, r
    # the estimate at the sizes the presets were chosen at rises from Quality to Fastest
    chosen = {"sd": (1024, 1024, 1), "sdxl": (1024, 1024, 1)}
    chosen |= {f: dit_archs.chosen_at(f) for f in dits}
    for family, size in chosen.items():
        at = [
            r["speedup"] for r in data["rows"] if (r["family"], r["width"], r["height"], r["frames"]) == (family, *size)
        ]
        assert len(at) == len(presets) and at == sorted(at), (family, at)


def test_the_speed_table_is_deterministic_and_measured_rows_replace_estimated_ones(tmp_path: Path) -> None:
    path = tmp_path / "speed_table.json"
    path.write_text(estimate.SPEED_TABLE.read_text())
    sources = json.loads(path.read_text())["sources"]
    rows = json.loads(path.read_text())["rows"]
    estimate.write_table(sources, rows, path)
    assert path.read_text() == estimate.SPEED_TABLE.read_text()  # written by the same code: the same bytes
    measured = {"device": "NVIDIA H200", "date": "2026-11-28 10:00:00 UTC", "profiles": 3}
    busy = {"baseline": 20.0, "fast": 16.0, "quality": 18.0}
    measured["rows"] = [
        {"arch": "sd15", "size": 1024, "variant": v, "gpu_busy_ms": ms, "busy_reliable": v != "quality"}
        for v, ms in busy.items()
    ]
    estimate.write_table(*estimate.measured_rows(measured), path)
    table = json.loads(path.read_text())
    key = "nvidia-h200-measured-2026-11-28"
    assert table["sources"][key]["measured"] and table["sources"][key]["device"] == measured["device"]
    got = {(r["preset"], r["width"]): r for r in table["rows"] if r["family"] == "sd"}
    assert got["fast", 1024]["speedup"] == 1.25 and got["fast", 1024]["source"] == key
    assert got["quality", 1024]["source"] == "h200-estimate-2026-11-27"  # its busy time was unreliable
    # estimating again keeps what was measured
    estimate.write_table(sources, rows, path)
    assert json.loads(path.read_text())["rows"] == table["rows"]
