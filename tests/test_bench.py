"""The lab's per-call jobs (`python -m tome_bench compare`, the main job's runner) and what they share: a fast
in-process run on a tiny UNet, option parsing derived from the field table, the defaults and --quick, the clocks,
each job from its own entry, the SD1.5/SDXL configs and checkpoint loading."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import tome_bench
import tome_core
from tome_bench import archs, compare, options, run, timing
from tome_core import TomeConfig, field_specs

ROOT = Path(__file__).parents[1]
TINY = ["compare", "--arch", "tiny", "--threads", "1"]


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models run fastest on one thread (and the shared CI cores stay free); restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _data(out: Path) -> dict:
    return json.loads((out / "bench.json").read_text())


def test_compare_on_a_tiny_unet_writes_md_json_png_and_leaves_the_rng_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bench-out"
    rng_before = torch.get_rng_state()
    # the default warm-up (none: one untimed baseline call), two timed runs
    argv = [*TINY, "--sizes", "64", "--ratios", "0.5", "--repeats", "2"]
    assert tome_bench.main([*argv, "--out", str(out), "--set", "use_rand=false"]) == 0
    assert torch.equal(torch.get_rng_state(), rng_before), "the benchmark must leave the global RNG alone"

    printed = capsys.readouterr().out
    assert "| arch | size | variant | ratio | median s | speed-up |" in printed
    assert (
        "PASS: tiny 64px: the baseline's output bitwise identical in 1 later timed run(s) after 2 apply/remove"
        in printed
    )
    for name in ("bench.md", "bench.png", "bench.json"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (out / "bench.md").read_text()
    assert "python -m tome_bench compare --arch tiny" in md and "torch threads: 1" in md
    assert "- clock: wall, wall time (time.perf_counter after synchronising the device" in md
    assert "median wall time of one UNet call" in md
    assert "use_rand=False" in md and "2 timed runs per variant after one untimed baseline call" in md
    assert "## Merge overhead per block" in md

    data = _data(out)
    rows = {(r["variant"], r["ratio"]): r for r in data["rows"]}
    assert rows[("baseline", None)]["deviation"] == 0.0
    assert rows[("baseline", None)]["speedup"] == 1.0
    expected = {("ours", 0.5)} | ({("tomesd", 0.5)} if run.load_tomesd()[0] is not None else set())
    assert expected <= set(rows)
    for key in expected:
        row = rows[key]
        assert row["error"] is None, row["error"]
        assert row["deviation"] > 0.0, key
        assert row["median_s"] > 0.0 and len(row["times_s"]) == 2
    assert all(c["ok"] for c in data["checks"])
    assert data["ours_config"]["use_rand"] is False and data["merge_overhead"]
    assert data["clock"] == "wall" and data["mode"] == "call"


def test_variants_subset_always_runs_baseline(tmp_path: Path) -> None:
    out = tmp_path / "o"
    assert tome_bench.main([*TINY, "--quick", "--sizes", "32", "--variants", "ours", "--out", str(out)]) == 0
    assert [r["variant"] for r in _data(out)["rows"]] == ["baseline", "ours"]


def test_single_baseline_run_claims_no_bitwise_check(tmp_path: Path) -> None:
    """--warmup 0 --repeats 1 runs the baseline once after the priming call: nothing to compare, nothing claimed."""
    out = tmp_path / "o"
    argv = [*TINY, "--sizes", "32", "--repeats", "1", "--warmup", "0", "--variants", "ours"]
    assert tome_bench.main([*argv, "--out", str(out)]) == 0
    assert [c["text"] for c in _data(out)["checks"]] == ["tiny 32px: no hook or class left behind by any removal"]


def test_set_parses_by_field_kind() -> None:
    values = options.parse_sets(
        ["mode=kv", "max_downsample=2", "matching=global", "seed=none", "use_rand=off", "sx=4", "step_end=0.8"]
    )
    assert values == {
        "mode": "kv",
        "max_downsample": 2,
        "matching": "global",
        "seed": None,
        "use_rand": False,
        "sx": 4,
        "step_end": 0.8,
    }
    assert options.parse_sets(["max_downsample=auto"]) == {"max_downsample": "auto"}
    # every field but ratio can be set with its default's text
    for spec in field_specs():
        if spec.name != "ratio":
            text = "none" if spec.default is None else str(spec.default)
            assert options.parse_sets([f"{spec.name}={text}"]) == {spec.name: spec.default}


@pytest.mark.parametrize(
    ("item", "words"),
    [
        ("mode=fast", ["mode", "'merge'", "'kv'"]),
        ("max_downsample=3", ["max_downsample", "'auto'", "8"]),
        ("use_rand=maybe", ["use_rand", "true or false"]),
        ("sx=two", ["sx", "integer"]),
        ("sx=9", ["sx", "[1, 8]"]),
        ("nonsense=1", ["nonsense", "mode", "matching"]),
        ("ratio=0.5", ["ratio", "--ratios"]),
        ("mode", ["NAME=VALUE"]),
        ("seed=none", []),  # valid
    ],
)
def test_set_errors_name_field_and_allowed_values(item: str, words: list[str]) -> None:
    if not words:
        options.parse_sets([item])
        return
    with pytest.raises(ValueError) as info:
        options.parse_sets([item])
    for word in words:
        assert word in str(info.value)


def test_bad_options_exit_with_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, word in [
        (["--set", "matching=nearest"], "matching"),
        (["--ratios", "0.99"], "ratio"),
        (["--sizes", "500"], "multiples of 8"),
        (["--variants", "ours,fast"], "'fast'"),
        (["--arch", "sd3"], "sd3"),
        (["--set", "step_start=0.9", "--set", "step_end=0.5"], "step_start"),
    ]:
        with pytest.raises(SystemExit) as info:
            compare.parse_options(argv)
        assert info.value.code == 2
        assert word in capsys.readouterr().err


def _defaults(opts: options.Options) -> tuple[list[tuple[int, int]], list[float], int, int]:
    return opts.sizes, opts.ratios, opts.repeats, opts.warmup


def test_compare_and_quick_defaults() -> None:
    both = [(512, 512), (1024, 1024)]
    # compare: baseline, ours and tomesd at 512 and 1024 px, ratio 0.5, 3 timed runs, no warm-up round
    opts = compare.parse_options([])
    assert _defaults(opts) == (both, [0.5], 3, 0) and opts.job == "compare" and not opts.main_job
    assert opts.device.type == "cpu" and opts.dtype == torch.float32 and opts.latents == ["noise"]
    assert opts.arches == [archs.ARCHS["sd15"]] and opts.variants == ["baseline", "ours", "tomesd"]
    assert opts.presets == [] and opts.out == Path("bench-out")
    assert _defaults(compare.parse_options(["--quick"])) == ([(256, 256)], [0.5], 1, 1)
    # explicit options override the defaults, piece by piece (the former --full: three ratios, a warm-up round)
    assert _defaults(compare.parse_options(["--ratios", "0.3,0.5,0.7", "--warmup", "1"])) == (
        both,
        [0.3, 0.5, 0.7],
        3,
        1,
    )
    argv = ["--repeats", "2", "--sizes", "768x512", "--warmup", "2"]
    assert _defaults(compare.parse_options(argv)) == ([(512, 768)], [0.5], 2, 2)
    assert compare.parse_options(["--presets", "all"]).presets == options.preset_names()


def test_cuda_runs_in_fp16(monkeypatch: pytest.MonkeyPatch) -> None:
    """Option parsing only (no GPU here): torch.cuda.is_available is faked."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    opts = compare.parse_options(
        ["--device", "cuda", "--arch", "sd15,sdxl", "--sizes", "1024,2048", "--presets", "all"]
    )
    assert opts.dtype == torch.float16 and opts.sizes == [(1024, 1024), (2048, 2048)]
    assert [a.name for a in opts.arches] == ["sd15", "sdxl"] and opts.presets == options.preset_names()
    assert _defaults(compare.parse_options(["--device", "cuda", "--quick"])) == ([(256, 256)], [0.5], 1, 1)


@pytest.mark.parametrize("job", list(tome_bench.JOBS))
def test_each_job_runs_from_its_own_entry_with_its_own_few_options(
    job: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`python -m tome_bench JOB --help`: every job parses its own options, a few, not one parser's 54."""
    with pytest.raises(SystemExit) as info:
        tome_bench.main([job, "--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    assert f"python -m tome_bench {'[main]' if job == 'main' else job}" in text
    assert 1 <= text.count("\n  --") <= 26, job


def test_the_fidelity_job_runs_from_its_own_entry(tmp_path: Path) -> None:
    """`python -m tome_bench fidelity` on the tiny UNet: the references and the presets on the random UNet and the
    stand-in, one call from a natural start, into fidelity.md and fidelity.json."""
    argv = ["fidelity", "--arch", "tiny", "--sizes", "64", "--models", "random,stand-in", "--latents", "natural"]
    assert tome_bench.main([*argv, "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "fidelity.json").read_text())
    labels = ["tomesd's default", "ToDo's default", *(p.label for p in tome_core.presets())]
    assert [r["variant"] for r in rows if r["model"] == "stand-in"] == labels and all(r["change"] > 0 for r in rows)
    assert "| variant | random, natural, 1 call | stand-in, natural, 1 call |" in (tmp_path / "fidelity.md").read_text()


def test_the_old_spellings_reach_the_same_jobs(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    seen: list[tuple[str, list[str]]] = []
    for name, module in tome_bench.JOBS.items():
        imported = importlib.import_module(f"tome_bench.{module}")
        monkeypatch.setattr(imported, "main", lambda argv, name=name: seen.append((name, list(argv))) or 0)
    for argv, job, rest in [
        ([], "main", []),
        (["--arch", "sd15"], "main", ["--arch", "sd15"]),
        (["--gpu-estimate", "--arch", "sd15"], "estimate", ["--arch", "sd15"]),
        (["--gpu-job", "--out", "x"], "gpu-job", ["--out", "x"]),
        (["--fidelity"], "fidelity", []),
        (["--checkpoint", "f", "--images"], "images", ["--checkpoint", "f"]),
        (["--steps", "10", "--peers", "all"], "peers", ["--steps", "10", "--peers", "all"]),
        (["--compare"], "compare", []),
        (["--quick", "--arch", "tiny"], "compare", ["--quick", "--arch", "tiny"]),
        (["--ours", "kv:mode=kv"], "compare", ["--ours", "kv:mode=kv"]),
        (["calibrate", "x.json"], "calibrate", ["x.json"]),
    ]:
        seen.clear()
        assert tome_bench.main(argv) == 0
        assert seen == [(job, rest)], argv


def _modules_after(statement: str) -> list[str]:
    """Names in sys.modules after `statement` ran in a fresh interpreter."""
    code = f"import json, sys; {statement}; print(json.dumps(sorted(sys.modules)))"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_import_tome_core_loads_no_benchmark_module() -> None:
    modules = _modules_after("import tome_core")
    assert "tome_core.patch" in modules  # the probe sees what was imported
    assert [m for m in modules if m.startswith(("tome_bench", "tome_core.bench"))] == []


def test_ops_and_archs_load_neither_the_command_line_nor_reports_nor_peers() -> None:
    """The core's tests count operations with tome_bench.ops and build UNets with tome_bench.archs: neither may pull
    in the rest of the benchmark."""
    modules = _modules_after("import tome_bench.ops, tome_bench.archs")
    assert sorted(m for m in modules if m.startswith("tome_bench")) == [
        "tome_bench",
        "tome_bench.archs",
        "tome_bench.ops",
    ]


def test_python_m_tome_bench_runs_in_a_fresh_interpreter_and_records_its_command(tmp_path: Path) -> None:
    out = tmp_path / "o"
    argv = [*TINY, "--quick", "--sizes", "32", "--variants", "ours", "--out", str(out)]
    proc = subprocess.run(
        [sys.executable, "-m", "tome_bench", *argv], capture_output=True, text=True, check=False, timeout=300, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr
    assert "PASS: tiny 32px: the baseline's output bitwise identical" in proc.stdout
    assert _data(out)["command"][:4] == ["python", "-m", "tome_bench", "compare"]


def _count(unet: torch.nn.Module) -> tuple[int, int]:
    blocks = sum(type(m).__name__ == "BasicTransformerBlock" for m in unet.modules())
    return sum(p.numel() for p in unet.parameters()), blocks


def test_real_architectures_match_published_sizes() -> None:
    from diffusers import UNet2DConditionModel

    with torch.device("meta"):
        sd15 = UNet2DConditionModel(**archs.SD15_CONFIG)
        sdxl = UNet2DConditionModel(**archs.SDXL_CONFIG)
    assert _count(sd15) == (859_520_964, 16)
    assert _count(sdxl) == (2_567_463_684, 70)
    assert type(sdxl.down_blocks[0]).__name__ == "DownBlock2D"  # SDXL: no attention at full resolution


def test_make_inputs_shapes() -> None:
    args, kwargs = archs.make_inputs("sdxl", 1024, 768, dtype="bf16")
    latent, t = args
    assert latent.shape == (2, 4, 128, 96) and latent.dtype == torch.bfloat16 and t.shape == (2,)
    assert kwargs["encoder_hidden_states"].shape == (2, 77, 2048)
    assert kwargs["added_cond_kwargs"]["text_embeds"].shape == (2, 1280)
    assert kwargs["added_cond_kwargs"]["time_ids"][0].tolist() == [1024, 768, 0, 0, 1024, 768]
    args, kwargs = archs.make_inputs("sd15", 512)
    assert args[0].shape == (2, 4, 64, 64) and kwargs["encoder_hidden_states"].shape == (2, 77, 768)
    assert "added_cond_kwargs" not in kwargs


def test_build_unet_is_seeded_and_input_dependent() -> None:
    a = archs.build_unet("tiny", seed=1)
    b = archs.build_unet("tiny", seed=1)
    c = archs.build_unet("tiny", seed=2)
    sa, sc = a.state_dict(), c.state_dict()
    assert all(torch.equal(v, b.state_dict()[k]) for k, v in sa.items())
    assert not torch.equal(sa["conv_out.weight"], sc["conv_out.weight"])
    assert all(v.abs().max() > 0 for v in sa.values()), "no parameter may stay zero"
    args, kwargs = archs.make_inputs("tiny", 64, seed=0)
    args2, _ = archs.make_inputs("tiny", 64, seed=1)
    with torch.inference_mode():
        out, out2 = a(*args, **kwargs).sample, a(*args2, **kwargs).sample
    assert torch.isfinite(out).all()
    assert (out - out2).norm() / out.norm() > 0.1, "the output must depend on the input"


def test_load_checkpoint_reads_diffusers_and_unet_prefixed_weights(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    src = archs.build_unet("tiny", seed=3)
    state = {k: v.contiguous() for k, v in src.state_dict().items()}
    plain, prefixed = tmp_path / "unet.safetensors", tmp_path / "pipe.safetensors"
    save_file(state, str(plain))
    save_file({"unet." + k: v.half() for k, v in state.items()}, str(prefixed))
    for path, exact in ((plain, True), (prefixed, False)):
        dst = archs.load_checkpoint(archs.build_unet("tiny", seed=4), path, "tiny")
        for k, v in dst.state_dict().items():
            assert v.dtype == torch.float32
            if exact:
                assert torch.equal(v, state[k]), k
            else:
                assert torch.equal(v, state[k].half().float()), k


def test_load_checkpoint_errors_name_the_problem(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    unet = archs.build_unet("tiny")
    with pytest.raises(ValueError, match="safetensors"):
        archs.load_checkpoint(unet, tmp_path / "model.ckpt", "tiny")
    state = {k: v.contiguous() for k, v in unet.state_dict().items()}
    del state["conv_out.bias"]
    save_file(state, str(tmp_path / "partial.safetensors"))
    with pytest.raises(ValueError, match=r"1 missing \(e.g. conv_out.bias\)"):
        archs.load_checkpoint(unet, tmp_path / "partial.safetensors", "tiny")
    wide = {"model.diffusion_model.input_blocks.1.1.transformer_blocks.0.attn2.to_k.weight": torch.zeros(320, 1024)}
    save_file(wide, str(tmp_path / "sd2.safetensors"))
    with pytest.raises(ValueError, match=r"1024-wide text states \(SD2.x\)"):
        archs.load_checkpoint(unet, tmp_path / "sd2.safetensors", "tiny")


def test_tome_config_fields_reach_ours() -> None:
    opts = compare.parse_options(["--arch", "tiny", "--set", "mode=kv", "--set", "sx=4", "--variants", "ours"])
    unet = archs.build_unet("tiny")
    variants = run.make_variants(opts, unet, None)
    ours = [v for v in variants if v.kind == "ours"]
    assert [v.ratio for v in ours] == opts.ratios
    ours[0].apply(unet)
    try:
        assert tome_core.get_config(unet) == TomeConfig(ratio=opts.ratios[0], mode="kv", sx=4)
    finally:
        ours[0].remove(unet)
    assert not tome_core.is_patched(unet)


def test_missing_tomesd_is_skipped_with_a_note(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run, "load_tomesd", lambda: (None, "tomesd is not installed (test)"))
    out = tmp_path / "o"
    assert tome_bench.main([*TINY, "--quick", "--sizes", "32", "--out", str(out)]) == 0
    data = _data(out)
    assert [r["variant"] for r in data["rows"]] == ["baseline", "ours"]
    assert "tomesd is not installed (test)" in data["notes"]
    assert "- tomesd is not installed (test)" in (out / "bench.md").read_text()


def test_sdxl_like_arch_ours_merges_where_tomesds_default_merges_nothing(tmp_path: Path) -> None:
    """An SDXL-like UNet has no attention at full resolution: ours ('auto') merges at level 2, while tomesd's
    default max_downsample=1 merges nothing, which the report points out."""
    out = tmp_path / "o"
    argv = ["compare", "--arch", "tiny-xl", "--quick", "--sizes", "64", "--threads", "1", "--out", str(out)]
    assert tome_bench.main(argv) == 0
    data = _data(out)
    rows = {r["variant"]: r for r in data["rows"]}
    assert rows["ours"]["deviation"] > 0.0
    if "tomesd" in rows:
        assert rows["tomesd"]["deviation"] == 0.0
        assert any("--tomesd-max-downsample auto" in n for n in data["notes"])


# ---------------------------------------------------------------------------------------------- clocks


def test_cpu_clock_leaves_out_time_spent_waiting() -> None:
    """A call that sleeps takes wall time but next to no CPU time: what other processes' load does to a call."""
    cpu = torch.device("cpu")
    wall_s, result, _ = timing.timed_call(lambda: time.sleep(0.1) or "done", cpu, clock_name="wall")
    cpu_s, _, _ = timing.timed_call(lambda: time.sleep(0.1), cpu, clock_name="cpu")
    assert result == "done" and wall_s >= 0.1 and cpu_s < 0.02
    # the RSS sampler's own thread polls during the call: its CPU time is not the call's
    sampled_s, _, _ = timing.timed_call(lambda: time.sleep(0.1), cpu, clock_name="cpu", sample_rss=True)
    assert sampled_s < 0.02
    with pytest.raises(ValueError, match="wall, cpu"):
        timing.clock("gpu")


def test_clock_cpu_is_recorded_in_json_and_report(tmp_path: Path) -> None:
    out = tmp_path / "o"
    argv = [*TINY, "--quick", "--sizes", "32", "--variants", "ours", "--clock", "cpu"]
    assert tome_bench.main([*argv, "--out", str(out)]) == 0
    data = _data(out)
    assert data["clock"] == "cpu" and all(r["median_s"] > 0 for r in data["rows"])
    md = (out / "bench.md").read_text()
    assert "- clock: cpu, CPU time of the process, all threads (time.process_time)" in md
    assert "median CPU time of one UNet call" in md
    assert not any("--clock cpu with" in n for n in data["notes"])  # one thread: nothing to warn about


def test_clock_option_default_choices_and_cuda(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert compare.parse_options([]).clock == "wall" and compare.parse_options(["--clock", "cpu"]).clock == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for argv, words in (
        (["--clock", "gpu"], "invalid choice"),
        (["--device", "cuda", "--clock", "cpu"], "--clock wall"),
    ):
        with pytest.raises(SystemExit) as info:
            compare.parse_options(argv)
        assert info.value.code == 2 and words in capsys.readouterr().err


@pytest.mark.parametrize(("arch", "first_level"), [("sd15", 1), ("sdxl", 2)])
def test_transformer_blocks_give_the_benchmark_each_blocks_level_and_width(arch: str, first_level: int) -> None:
    """The merge-overhead table sizes its input from the first merged level's block (public API, no private name)."""
    from diffusers import UNet2DConditionModel

    with torch.device("meta"):
        unet = UNet2DConditionModel(**archs.get_arch(arch).config)
    blocks = tome_core.transformer_blocks(unet)
    assert all(type(b).__name__ == "BasicTransformerBlock" for b, _ in blocks)
    counts: dict[int, int] = {}
    for _, level in blocks:
        counts[level] = counts.get(level, 0) + 1
    assert counts == tome_core.blocks_per_level(unet)
    assert blocks[0][1] == first_level and blocks[0][0].norm1.normalized_shape[0] == 320 * first_level
