"""The lab's main job (`python -m tome_bench`, what `make bench` runs) and the estimate job: every preset of both
families beside the unpatched UNet and tomesd, the GPU estimate beside the CPU figures, CUDA when there is one, a
progress bar (tqdm) whose time left weighs each call by its FLOPs, and printed sizes that are the measured ones
(issue 33, section 2)."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
import torch

import tome_bench
import tome_core
from tome_bench import archs, bench, compare, estimate, gpu_estimate, run

PRESETS = [p.name for p in tome_core.presets()]
TOMESD = run.load_tomesd()[0]


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_the_default_is_the_main_job_of_both_families(no_cuda: None) -> None:
    """No option: SD1.5 at 512 px and SDXL at 640 px, the unpatched UNet, every preset (read at run time) and
    tomesd at its defaults; an untimed round on the natural latent first, then four timed rounds on noise; the
    GPU estimate's grid. Checked on the parsed options and the plan of calls, without running it."""
    opts = bench.parse_options([])
    assert opts.main_job and opts.job == "main"
    assert opts.device.type == "cpu" and opts.dtype == torch.float32 and opts.device_note is None
    assert [a.name for a in opts.arches] == ["sd15", "sdxl"]
    assert opts.arch_sizes == {"sd15": [(512, 512)], "sdxl": [(640, 640)]}
    assert opts.sizes_of("sd15") == [(512, 512)] and opts.sizes_of("sdxl") == [(640, 640)]
    assert opts.variants == ["baseline", "tomesd"] and opts.ratios == [0.5] and opts.tomesd_max_downsample == "1"
    assert opts.presets == PRESETS and opts.extra_ours == [] and opts.ours_fields == {}
    assert (opts.repeats, opts.warmup, opts.latents) == (4, 0, ["noise", "natural"])
    assert estimate.GRID == {"sd15": (512, 768, 1024), "sdxl": (1024,)} and opts.gpu == "h200"
    assert opts.out == Path("bench-out") and opts.steps is None
    assert run.extra_latents_first(opts) and not run.primes(opts)

    # The plan: the variants of each family as the run makes them (on meta-device UNets: nothing computed).
    calls = {}
    for spec in opts.arches:
        variants = run.make_variants(opts, gpu_estimate.meta_unet(spec.name), TOMESD)
        labels = [v.label for v in variants]
        presets = [f"ours:preset={name}" for name in PRESETS]
        # tomesd's default max_downsample=1 reaches no attention block of SDXL: left out, the report says why
        tomesd = ["tomesd r=0.5"] if TOMESD is not None and spec.name == "sd15" else []
        assert labels == ["baseline", *tomesd, *presets], spec.name
        calls[spec.name] = run.calls_per_size(opts, len(variants))
    assert calls == {"sd15": 5 * (1 + len(PRESETS) + (TOMESD is not None)), "sdxl": 5 * (1 + len(PRESETS))}


def test_the_main_jobs_knobs_and_the_compare_job(no_cuda: None) -> None:
    """--arch, --sizes (ARCH:SIZE for one family), --presets, --repeats adjust the main job; the variants are the
    compare job's, which runs as before the main job was the default."""
    opts = bench.parse_options(["--arch", "sd15", "--sizes", "768", "--presets", "fast", "--repeats", "2"])
    assert opts.main_job and opts.arch_sizes == {"sd15": [(768, 768)]} and opts.presets == ["fast"]
    assert opts.repeats == 2
    opts = bench.parse_options(["--sizes", "sdxl:768x512,sdxl:1024"])
    assert opts.arch_sizes == {"sd15": [(512, 512)], "sdxl": [(512, 768), (1024, 1024)]}
    for argv in ([], ["--variants", "baseline,ours,tomesd"], ["--arch", "sd15", "--ratios", "0.5"]):
        old = compare.parse_options(argv)
        assert not old.main_job, argv
        assert [a.name for a in old.arches] == ["sd15"] and old.sizes == [(512, 512), (1024, 1024)]
        assert (old.ratios, old.repeats, old.warmup, old.latents) == ([0.5], 3, 0, ["noise"])
        assert old.variants == ["baseline", "ours", "tomesd"] and old.presets == []
    assert compare.parse_options([]).arch_sizes == {"sd15": [(512, 512), (1024, 1024)]}
    for argv in (["--sizes", "sdxl:640", "--arch", "sd15"], ["--ratios", "0.5"], ["--steps", "2"]):
        with pytest.raises(SystemExit):
            bench.parse_options(argv)  # sdxl is not run; the main job takes no ratio, no sampler steps


def test_cuda_is_the_main_jobs_default_device_in_fp16(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Where torch.cuda.is_available(), the main job runs on the GPU in fp16 and says so; --device cpu (or --clock
    cpu) keeps it on the CPU, and a comparison stays on the CPU unless told. Option parsing only: CUDA is faked."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA Test GPU")
    opts = bench.parse_options([])
    assert opts.main_job and opts.device.type == "cuda" and opts.dtype == torch.float16 and opts.dtype_name == "fp16"
    assert opts.device_note is not None and "CUDA" in opts.device_note and "fp16" in opts.device_note
    assert opts.arch_sizes == {"sd15": [(512, 512), (1024, 1024)], "sdxl": [(1024, 1024)]} and opts.repeats == 20
    header = bench.header(opts, None)
    assert "On cuda in fp16 on the NVIDIA Test GPU" in header and opts.device_note in header
    forced = bench.parse_options(["--device", "cpu"])
    assert (forced.device.type, forced.dtype, forced.device_note) == ("cpu", torch.float32, None)
    assert forced.arch_sizes == {"sd15": [(512, 512)], "sdxl": [(640, 640)]} and forced.repeats == 4
    assert bench.parse_options(["--clock", "cpu"]).device.type == "cpu"
    assert compare.parse_options([]).device.type == "cpu"


def test_gpu_estimate_prints_only_the_estimate_table(capsys: pytest.CaptureFixture[str]) -> None:
    """The estimate job for real on a tiny SDXL-like UNet, where tomesd's default merges nothing, and on SD1.5 at
    512 px (a meta-device trace: seconds, nothing built or timed): the table, the GPU and the model's source."""
    assert tome_bench.main(["estimate", "--arch", "tiny-xl", "--sizes", "64"]) == 0
    rows = {
        line.split(" | ")[0].lstrip("| "): line for line in capsys.readouterr().out.splitlines() if line[:2] == "| "
    }
    for preset in tome_core.presets():
        assert preset.label in rows, preset.name
    if TOMESD is not None:
        assert rows["tomesd r=0.5"].split(" | ")[1] == "merges nothing"  # tiny-xl: max_downsample=1 reaches none
    assert tome_bench.main(["estimate", "--arch", "sd15", "--sizes", "512", "--presets", "fast"]) == 0
    printed = capsys.readouterr()
    text = printed.out
    spec = gpu_estimate.GPUS["h200"]
    assert "## What to expect on a GPU (estimated, not measured: NVIDIA H200, fp16)" in text
    assert spec.source in text and "meta device" in text and "cost model" in text
    assert "| SD1.5 512 px, H200 (est.) |" in text and "| ops added, SD1.5 |" in text
    assert "median s" not in text  # nothing timed
    rows = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines() if line.startswith("| ")}
    # the table's Fast cell is gpu_estimate's own figure for apply_patch(unet, preset="fast")
    [fast] = gpu_estimate.estimate_rows("sd15", [512], {"fast": lambda u: tome_core.apply_patch(u, preset="fast")})
    assert rows["Fast"].split(" | ")[1] == f"{fast.speedup:.2f}x"
    assert rows["Fast"].split(" | ")[2] == f"{fast.ops_added:+.0%} |"
    assert re.search(r"GPU estimate: sd15 512 px on the NVIDIA H200, traced on the meta device: [\d.]+ s", printed.err)


def _sizes_in(text: str) -> set[str]:
    """Every image size the text names: '512px', '512 px', '768x512px'."""
    return set(re.findall(r"\b(\d+(?:x\d+)?) ?px\b", text))


def test_main_job_runs_writes_the_estimate_beside_the_timings_and_prints_only_measured_sizes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_cuda: None
) -> None:
    """The main job for real on tiny UNets (one timed round): a progress bar naming every call, the results and the GPU table in the report and the JSON, the natural latent's deviation, the output
    folder named at the start and the end; every size it prints is one it measured."""
    out = tmp_path / "bench-out"
    argv = ["--arch", "tiny,tiny-xl", "--sizes", "tiny:64,tiny-xl:32", "--repeats", "1", "--threads", "1"]
    assert tome_bench.main(["main", *argv, "--out", str(out)]) == 0
    printed = capsys.readouterr()
    data = json.loads((out / "bench.json").read_text())
    rows = {(r["arch"], r["size"], r["variant"]): r for r in data["rows"]}
    presets = [f"ours:preset={name}" for name in PRESETS]
    tomesd = ["tomesd"] if TOMESD is not None else []
    assert [v for a, _, v in rows if a == "tiny"] == ["baseline", *tomesd, *presets]
    assert [v for a, _, v in rows if a == "tiny-xl"] == ["baseline", *presets]  # tomesd merges nothing there
    assert {(a, s) for a, s, _ in rows} == {("tiny", "64"), ("tiny-xl", "32")}
    for key, row in rows.items():
        assert row["error"] is None and set(row["deviations"]) == {"noise", "natural"}, key
        assert (row["deviation"] == 0.0) == (key[2] == "baseline"), key
    est = data["gpu_estimate"]
    assert est["gpu"] == "NVIDIA H200" and est["source"] == gpu_estimate.GPUS["h200"].source
    assert {(r["arch"], r["size"]) for r in est["rows"]} == {("tiny", 64), ("tiny-xl", 32)}
    assert all(r["speedup"] > 0 for r in est["rows"])
    md = (out / "bench.md").read_text()
    assert "## What to expect on a GPU (estimated, not measured: NVIDIA H200, fp16)" in md
    assert "(measured)" in md and "H200 (est.)" in md and "before the timed ones" in md
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Issue 38: the change of the image on the stand-ins, every preset beside tomesd's and ToDo's defaults.
    assert "## How much each preset changes the image (stand-in model)" in md
    labels = ["tomesd's default", "ToDo's default", *(p.label for p in tome_core.presets())]
    for arch, size in (("tiny", 64), ("tiny-xl", 32)):
        got = [r for r in data["stand_in_change"] if (r["arch"], r["size"]) == (arch, size)]
        assert [r["variant"] for r in got] == labels and all(r["model"] == "stand-in" for r in got), arch
        assert all(r["change"] > 0 for r in got), got

    measured = {"64", "32"}
    # the estimate's explanation names the sizes its cost model was fitted at: no size of this run
    stdout = printed.out.replace(estimate.explanation("h200"), "")
    assert _sizes_in(stdout) == measured and _sizes_in(printed.err) == measured
    assert f"Output: {out}/" in printed.out and f"are in {out}/: bench.md, bench.json, bench.png" in printed.out
    assert "The main job took" in printed.out
    total = 2 * (1 + len(tomesd) + len(PRESETS)) + 2 * (1 + len(PRESETS))
    calls = _calls(printed.err)
    assert f"{total} UNet calls planned" in printed.err
    assert [int(c.split()[1].split("/")[0]) for c in calls] == list(range(1, total + 1))
    assert calls[0].startswith(f"call 1/{total} tiny 64px baseline natural latent")


def test_quick_smoke_run_prints_the_sizes_it_measures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every call's line names the size it times."""
    out = tmp_path / "o"
    argv = ["compare", "--arch", "tiny", "--quick", "--sizes", "64", "--variants", "ours", "--threads", "1"]
    assert tome_bench.main([*argv, "--out", str(out)]) == 0
    calls = _calls(capsys.readouterr().err)
    assert len(calls) == 4 and all(" tiny 64px " in line for line in calls)  # warm-up and timed: 2 variants
    assert {r["size"] for r in json.loads((out / "bench.json").read_text())["rows"]} == {"64"}


def _calls(err: str) -> list[str]:
    """The calls the progress bar named, in order, once each: 'call 3/40 tiny 64px ours:preset=fast'."""
    named = [m.group(1).strip() for m in re.finditer(r"(call \d+/\d+ [^\r\n\]]*)\]", err)]
    return list(dict.fromkeys(named))


def test_call_bar_weighs_each_call_by_its_flops_and_names_it() -> None:
    """The bar's total is the planned calls' FLOPs, a call moves it by its group's FLOPs (an SDXL call by the several
    SD1.5 calls it costs), and `call_flops` is FlopCounterMode's count of the unpatched call."""
    sink = io.StringIO()
    bar = run.CallBar({"a": (3, 1.0e9), "b": (2, 4.0e9)}, file=sink)
    assert bar.calls == 5 and bar.bar.total == pytest.approx(11.0e9)
    bar.group("a")
    bar.set_postfix_str("a baseline")
    bar.update(1)
    bar.group("b")
    bar.set_postfix_str("b baseline")
    bar.update(1)
    assert bar.done == 2 and bar.bar.n == pytest.approx(5.0e9)
    bar.close()
    assert "call 2/5 b baseline" in sink.getvalue() and "FLOP" in sink.getvalue()
    sd15, sdxl = (run.call_flops(gpu_estimate.meta_unet(a), a, (512, 512)) for a in ("sd15", "sdxl"))
    assert sdxl > 1.5 * sd15 > 0  # SDXL at 512 px: twice the FLOPs of SD1.5


def test_the_readme_names_the_main_jobs_time_output_and_content() -> None:
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    section = readme[readme.index("## Benchmark and tests") :]
    section = section[: section.index("\n## ", 5)] if "\n## " in section[5:] else section
    assert "make bench" in section and "bench-out/" in section and "20 min" in section
    assert "GPU" in section and "tome_bench estimate" in section and "preset" in section
    assert archs.get_arch("sdxl").label in section and "640 px" in section


def test_the_estimate_table_lists_the_presets_first() -> None:
    row = gpu_estimate.EstimateRow("sd15", 512, "ours:preset=fast", "h200", 5.0, 10.0, 110, 100, 120, 1.0, 2.0)
    other = gpu_estimate.EstimateRow("sd15", 512, "tomesd r=0.5", "h200", 12.5, 10.0, 120, 100, 130, 1.0, 2.0)
    table = estimate.format_table([other, row], {})
    body = table.splitlines()[2:]
    assert body[0].startswith("| unpatched: GPU work per call / kernel-launching ops | 10.0 ms | 100 ops |")
    assert body[1] == "| Fast | 2.00x | +10% |" and body[2] == "| tomesd r=0.5 | 0.80x | +20% |"
