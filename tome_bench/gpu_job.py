"""The GPU job: what every preset does to one UNet call on a real GPU, in one command.

    python -m tome_bench --gpu-job [--out DIR] [--budget-s 420] [--candidates FILE] [--smoke]

Per architecture and size (SD1.5 512/768/1024 px, SDXL 1024/1536 px; fp16, SDPA, batch 2 = cond + uncond), for
the unpatched UNet, every preset, the references the presets are held to (tomesd's default and ToDo's default, as
`tome_bench.fidelity.references` states them, and tomesd 0.1.3 itself where it is installed) and the candidates
of `--candidates` (a JSON file: name -> {family -> TomeConfig fields}):

* eager: GPU busy time (the sum of the call's kernel durations, `torch.profiler`), kernels and aten operations per
  call, device time per aten operation (what `python -m tome_bench.calibrate` fits the GPU estimate to), peak
  memory above the inputs, wall clock (`torch.utils.benchmark.Timer`, which synchronises the device), and what the
  patch reports it merged (`tome_core.stats`);
* compiled: `torch.compile(fullgraph=True)` in inductor's default mode and in "reduce-overhead" (CUDA graphs), each
  in a process of its own started at the beginning, so that compiling (CPU) overlaps the eager part's profiling
  (GPU); every wall-clock measurement holds a lock on OUT/lock, so that only one process times at a time, and the
  eager part's wall clocks wait until the compiled parts have compiled.

Writes OUT/gpu.json (one row per measured call) and OUT/gpu.md (the tables), and prints the tables. Every part
stops starting new work when the budget is spent and writes what it has. `--smoke` runs the same code on the CPU
with the tiny UNets in float32 (the tests do).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tome_bench import archs

#: (arch, size) of the eager part: the sizes users run each family at, and the hires pass above them.
EAGER_SIZES: tuple[tuple[str, int], ...] = (
    ("sd15", 512),
    ("sd15", 768),
    ("sd15", 1024),
    ("sdxl", 1024),
    ("sdxl", 1536),
)
#: (mode, arch, size, variants) of the compiled parts, one process each.
COMPILED_PARTS: tuple[tuple[str, str, int, tuple[str, ...]], ...] = (
    ("default", "sd15", 1024, ("baseline", "quality", "balanced", "fastest")),
    ("reduce-overhead", "sd15", 1024, ("baseline", "quality", "balanced", "fastest")),
    ("reduce-overhead", "sdxl", 1024, ("baseline", "balanced")),
)
SMOKE_EAGER: tuple[tuple[str, int], ...] = (("tiny", 128), ("tiny-xl", 128))
SMOKE_COMPILED: tuple[tuple[str, str, int, tuple[str, ...]], ...] = (
    ("default", "tiny", 128, ("baseline", "balanced")),
)
#: Candidates (names beside the presets) are measured at these sizes only: they feed the GPU estimate's fit.
CANDIDATE_SIZES = frozenset({("sd15", 1024), ("sdxl", 1024), ("tiny", 128), ("tiny-xl", 128)})
FAMILY = {"sd15": "sd", "tiny": "sd", "sdxl": "sdxl", "tiny-xl": "sdxl"}


@dataclass(frozen=True)
class Variant:
    """One thing measured: None fields for the unpatched UNet, "tomesd" for tomesd itself, else TomeConfig fields
    (a preset as {"preset": name})."""

    name: str
    fields: Mapping[str, Any] | str | None

    def apply(self, unet: torch.nn.Module) -> None:
        if self.fields == "tomesd":
            import tomesd

            tomesd.apply_patch(unet, ratio=0.5)
        elif self.fields is not None:
            from tome_core import apply_patch

            apply_patch(unet, **self.fields)

    def remove(self, unet: torch.nn.Module) -> None:
        if self.fields == "tomesd":
            import tomesd

            tomesd.remove_patch(unet)
        elif self.fields is not None:
            from tome_core import remove_patch

            remove_patch(unet)

    def resolved(self, unet: torch.nn.Module) -> dict[str, Any] | str | None:
        """The TomeConfig fields that ran (a preset resolved for the UNet's family), for the calibration."""
        if not isinstance(self.fields, Mapping):
            return self.fields
        from tome_core import get_config

        self.apply(unet)
        try:
            config = get_config(unet)
            return None if config is None else config.to_dict()
        finally:
            self.remove(unet)


def variants(arch: str, candidates: Mapping[str, Mapping[str, Mapping[str, Any]]], size: int) -> list[Variant]:
    """The unpatched UNet, the presets, the references, tomesd where installed, and the candidates at their sizes."""
    from tome_bench.fidelity import references
    from tome_core import presets

    family = FAMILY[arch]
    out = [Variant("baseline", None), *(Variant(p.name, {"preset": p.name}) for p in presets())]
    out += [Variant(name, fields) for name, fields in references(family).items()]
    with contextlib.suppress(ImportError):
        import tomesd  # noqa: F401

        if family == "sd":  # on SDXL its default merges nothing
            out.append(Variant("tomesd", "tomesd"))
    if (arch, size) in CANDIDATE_SIZES:
        out += [Variant(name, per[family]) for name, per in candidates.items() if family in per]
    return out


class Job:
    """Paths, device and budget shared by the parts."""

    def __init__(self, out: Path, smoke: bool, budget_s: float, started: float) -> None:
        self.out = out
        self.smoke = smoke
        self.device = torch.device("cpu" if smoke else "cuda")
        self.dtype = torch.float32 if smoke else torch.float16
        self.deadline = started + budget_s
        out.mkdir(parents=True, exist_ok=True)

    def left(self) -> float:
        return self.deadline - time.time()

    def say(self, part: str, text: str) -> None:
        line = f"[{part} {time.strftime('%H:%M:%S')}] {text}"
        print(line, flush=True)
        with open(self.out / f"{part}.log", "a") as log:
            log.write(line + "\n")

    @contextlib.contextmanager
    def timing_lock(self) -> Iterator[None]:
        with open(self.out / "lock", "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def rows_file(self, part: str) -> Path:
        return self.out / f"rows-{part}.json"


def wall_ms(call: Callable[[], Any], min_run_time: float) -> dict[str, float]:
    """Median and IQR (ms) of one call, from `torch.utils.benchmark.Timer` (it synchronises the device)."""
    from torch.utils.benchmark import Timer

    # The process's thread count: Timer's default of one thread would also be a new global state to torch.compile's
    # guards, which then compile the graph again.
    timer = Timer(stmt="call()", globals={"call": call}, num_threads=torch.get_num_threads())
    m = timer.blocked_autorange(min_run_time=min_run_time)
    return {"wall_ms": m.median * 1e3, "wall_iqr_ms": m.iqr * 1e3, "wall_n": len(m.times)}


def profile_call(job: Job, call: Callable[[], Any], tries: int = 3) -> dict[str, Any]:
    """GPU busy time (sum of kernel durations), kernels, aten operations and device time per aten operation of one
    call: the least busy of `tries` calls, each profiled on its own. Another process's kernels on the GPU (a
    compiled part's first calls, which compile outside the timing lock) stretch the kernels they overlap, and
    seldom all of the tries."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if job.device.type == "cuda" else [])
    best: dict[str, Any] | None = None
    for _ in range(tries):
        job.sync()
        with profile(activities=acts) as prof:
            call()
            job.sync()
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        busy = sum(e.time_range.elapsed_us() for e in kernels) / 1e3
        if best is not None and busy >= best["gpu_busy_ms"]:
            continue
        ops = []
        for k in prof.key_averages():
            if k.key.startswith("aten::"):
                ops.append(
                    [k.key, "", k.count, getattr(k, "self_device_time_total", 0.0) / 1e3, k.self_cpu_time_total / 1e3]
                )
        ops.sort(key=lambda o: -o[3])
        best = {
            "gpu_busy_ms": busy,
            "kernels_per_call": len(kernels),
            "aten_calls_per_call": sum(o[2] for o in ops),
            "ops": ops,
        }
    assert best is not None
    return best


#: Operations no patch changes: their device time beside the baseline's tells a disturbed profile.
UNTOUCHED = ("aten::cudnn_convolution", "aten::native_group_norm")


def untouched_ms(row: Mapping[str, Any]) -> float:
    return sum(op[3] for op in row["ops"] if op[0] in UNTOUCHED)


def disturbed(row: Mapping[str, Any], base: Mapping[str, Any] | None, limit: float = 0.05) -> bool:
    """Whether `row`'s untouched operations took more than `limit` longer than the baseline's: another process's
    kernels overlapped the profile."""
    if base is None or not untouched_ms(base):
        return False
    return untouched_ms(row) > (1 + limit) * untouched_ms(base)


def peak_mib(job: Job, call: Callable[[], Any]) -> float:
    if job.device.type != "cuda":
        return 0.0
    job.sync()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    call()
    job.sync()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def merged_text(unet: torch.nn.Module, v: Variant) -> str | None:
    """What the patch says it did, as 'applied/selected blocks (kinds)'; None for the baseline and tomesd."""
    if not isinstance(v.fields, Mapping):
        return None
    from tome_core import stats

    st = stats(unet)
    if st is None:
        return "not patched"
    kinds = ", ".join(f"{kind} {n}" for kind, n in st.modules)
    return f"{st.applied}/{st.selected} blocks ({kinds})"


def _inputs(job: Job, arch: str, size: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
    return archs.make_inputs(arch, size, dtype=job.dtype, device=job.device, latent_kind="natural")


def _save(job: Job, part: str, rows: list[dict[str, Any]]) -> None:
    job.rows_file(part).write_text(json.dumps(rows, indent=1))


def part_eager(job: Job, candidates: Mapping[str, Any], sizes: Sequence[tuple[str, int]], warm_parts: int) -> None:
    """Profile every variant at every size, then, once the compiled parts have compiled (a compile's CPU load
    disturbs an eager call's launches, not its kernels), take the wall clocks of all but the candidates. Every
    measurement holds the timing lock: two processes' kernels on one GPU would stretch each other's times."""
    part, rows = "eager", []
    todo = [(arch, size, v) for arch, size in sizes for v in variants(arch, candidates, size)]
    runs: dict[tuple[str, int, str], dict[str, Any]] = {}
    models = _Models(job)
    for arch, size, v in todo:
        if job.left() < 30:
            job.say(part, f"budget spent: skipping {arch} {size} {v.name}")
            continue
        unet = models.get(arch)
        args, kwargs = _inputs(job, arch, size)
        try:
            with torch.inference_mode(), job.timing_lock():
                v.apply(unet)
                try:
                    call = _caller(unet, args, kwargs)
                    for _ in range(3):
                        call()
                    row: dict[str, Any] = {"part": part, "arch": arch, "size": size, "variant": v.name}
                    row["peak_mib"] = peak_mib(job, call)
                    row.update(profile_call(job, call))
                    row["merged"] = merged_text(unet, v)
                finally:
                    v.remove(unet)
            row["fields"] = v.resolved(unet)
        except Exception as exc:  # one variant failing must not end the job: it is reported and the rest run
            job.say(part, f"{arch} {size} {v.name} FAILED {type(exc).__name__}: {exc}")
            traceback.print_exc()
            continue
        runs[arch, size, v.name] = row
        rows.append(row)
        job.say(
            part,
            f"{arch} {size} {v.name:14s} busy {row['gpu_busy_ms']:8.2f} ms {row['kernels_per_call']:5.0f} kernels"
            f" {row['aten_calls_per_call']:5.0f} aten, peak {row['peak_mib']:7.0f} MiB | {row['merged']}",
        )
        _save(job, part, rows)
    timed = [(arch, size, v) for arch, size, v in todo if v.name not in candidates and (arch, size, v.name) in runs]
    _wait_for_compiles(job, part, warm_parts, reserve_s=20 + 1.5 * len(timed))
    for arch, size, v in timed:
        if job.left() < 15:
            continue
        row = runs[arch, size, v.name]
        unet = models.get(arch)
        args, kwargs = _inputs(job, arch, size)
        try:
            with torch.inference_mode(), job.timing_lock():
                v.apply(unet)
                try:
                    call = _caller(unet, args, kwargs)
                    for _ in range(3):
                        call()
                    row.update(wall_ms(call, 0.05 if job.smoke else 0.6))
                finally:
                    v.remove(unet)
        except Exception as exc:
            job.say(part, f"{arch} {size} {v.name} wall clock FAILED {type(exc).__name__}: {exc}")
            continue
        job.say(part, f"{arch} {size} {v.name:14s} wall {row['wall_ms']:8.2f} ms (IQR {row['wall_iqr_ms']:.2f})")
        _save(job, part, rows)


class _Models:
    """The one UNet of the architecture being measured (a GPU holds one SDXL at a time beside compiled parts)."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.arch: str | None = None
        self.unet: torch.nn.Module | None = None

    def get(self, arch: str) -> torch.nn.Module:
        if self.arch != arch or self.unet is None:
            self.unet = None
            if self.job.device.type == "cuda":
                torch.cuda.empty_cache()
            self.unet, self.arch = archs.build_unet(arch, self.job.dtype, self.job.device), arch
        return self.unet


def _caller(unet: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Callable[[], Any]:
    return lambda: unet(*args, **kwargs).sample


def _wait_for_compiles(job: Job, part: str, want: int, reserve_s: float) -> None:
    start = time.time()
    while len(list(job.out.glob("warm.*"))) < want and job.left() > reserve_s:
        time.sleep(2)
    job.say(part, f"waited {time.time() - start:.0f} s for {want} compiled parts to compile")


def part_compiled(job: Job, mode: str, arch: str, size: int, names: Sequence[str]) -> None:
    """Compile every variant (one graph each, through one wrapper), then time them under the lock."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.config.recompile_limit = 64
    part = f"compiled-{mode}-{arch}-{size}"
    unet = archs.build_unet(arch, job.dtype, job.device)
    args, kwargs = _inputs(job, arch, size)
    comp = torch.compile(unet, mode=None if mode == "default" else mode, fullgraph=True, dynamic=False)
    chosen = [v for v in variants(arch, {}, size) if v.name in names]
    compile_s: dict[str, float] = {}
    rows: list[dict[str, Any]] = []
    try:
        for v in chosen:
            if job.left() < 45:
                break
            v.apply(unet)
            try:
                with torch.inference_mode():
                    t0 = time.perf_counter()
                    for _ in range(3):
                        comp(*args, **kwargs)
                    job.sync()
                    compile_s[v.name] = time.perf_counter() - t0
                job.say(part, f"{v.name} compiled in {compile_s[v.name]:.0f} s")
            except Exception as exc:
                job.say(part, f"{v.name} FAILED to compile: {type(exc).__name__}: {str(exc)[:300]}")
            finally:
                v.remove(unet)
    finally:
        (job.out / f"warm.{part}").touch()
    for v in chosen:
        if v.name not in compile_s or job.left() < 15:
            continue
        graphs = int(counters["stats"]["unique_graphs"])
        v.apply(unet)
        try:
            with torch.inference_mode(), job.timing_lock():
                for _ in range(3):
                    comp(*args, **kwargs)
                timing = wall_ms(lambda: comp(*args, **kwargs).sample, 0.05 if job.smoke else 0.6)
            merged = merged_text(unet, v)
        except Exception as exc:
            job.say(part, f"{v.name} FAILED: {type(exc).__name__}: {str(exc)[:300]}")
            continue
        finally:
            v.remove(unet)
        row = {
            "part": "compiled",
            "mode": mode,
            "arch": arch,
            "size": size,
            "variant": v.name,
            "compile_s": compile_s[v.name],
            **timing,
            "recompiles": int(counters["stats"]["unique_graphs"]) - graphs,
            "cudagraph_skips": int(counters["inductor"]["cudagraph_skips"]),
            "merged": merged,
        }
        rows.append(row)
        job.say(part, f"{v.name:10s} wall {row['wall_ms']:8.2f} ms, recompiles {row['recompiles']} | {merged}")
        _save(job, part, rows)


# ---------------------------------------------------------------------------------------------- the tables


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if not a or not b else f"{a / b:.2f}×"


def tables(rows: Sequence[Mapping[str, Any]], device: str) -> str:
    """Markdown: per (arch, size) the eager figures of every variant beside the baseline, then the compiled ones."""
    out = [f"# GPU job: {device}", ""]
    eager = [r for r in rows if r.get("part") == "eager"]
    for arch, size in dict.fromkeys((r["arch"], r["size"]) for r in eager):
        group = [r for r in eager if (r["arch"], r["size"]) == (arch, size)]
        base = next((r for r in group if r["variant"] == "baseline"), None)
        out += [
            f"## {archs.get_arch(arch).label} {size} px, eager (fp16, batch 2)",
            "",
            "| variant | GPU busy ms | less GPU time | kernels | kernels added | wall ms | wall speed-up | peak MiB"
            " | merged (stats) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for r in group:
            added = "-"
            flag = " (disturbed)" if r is not base and disturbed(r, base) else ""
            if base is not None and base["kernels_per_call"]:
                added = f"{100 * (r['kernels_per_call'] / base['kernels_per_call'] - 1):+.1f}%"
            wall = r.get("wall_ms")
            out.append(
                f"| {r['variant']} | {r['gpu_busy_ms']:.2f}{flag} | {_ratio(base and base['gpu_busy_ms'], r['gpu_busy_ms'])}"
                f" | {r['kernels_per_call']:.0f} | {added} | {'-' if wall is None else f'{wall:.2f}'}"
                f" | {_ratio(base and base.get('wall_ms'), wall)} | {r['peak_mib']:.0f} | {r.get('merged') or ''} |"
            )
        out.append("")
    comp = [r for r in rows if r.get("part") == "compiled"]
    if comp:
        out += [
            "## Compiled (torch.compile fullgraph, inductor; reduce-overhead = CUDA graphs)",
            "",
            "| mode | model | variant | wall ms | speed-up | eager wall ms | compile s | recompiles | merged |",
            "|---|---|---|---:|---:|---:|---:|---:|---|",
        ]
        for r in comp:
            base = next(
                (
                    c
                    for c in comp
                    if (c["mode"], c["arch"], c["size"], c["variant"]) == (r["mode"], r["arch"], r["size"], "baseline")
                ),
                None,
            )
            twin = next(
                (e for e in eager if (e["arch"], e["size"], e["variant"]) == (r["arch"], r["size"], r["variant"])), {}
            )
            eager_wall = twin.get("wall_ms")
            out.append(
                f"| {r['mode']} | {archs.get_arch(r['arch']).label} {r['size']} | {r['variant']} | {r['wall_ms']:.2f}"
                f" | {_ratio(base and base['wall_ms'], r['wall_ms'])} | {'-' if eager_wall is None else f'{eager_wall:.2f}'}"
                f" | {r['compile_s']:.0f} | {r['recompiles']} | {r.get('merged') or ''} |"
            )
        out.append("")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------- the command


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m tome_bench --gpu-job", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("bench-out/gpu-job"), help="where the rows and tables go")
    ap.add_argument("--budget-s", type=float, default=420.0, help="seconds the job may take in all (default 420)")
    ap.add_argument("--candidates", type=Path, help="JSON: name -> {family -> TomeConfig fields}, measured too")
    ap.add_argument("--smoke", action="store_true", help="the tiny UNets on the CPU in float32 (tests)")
    ap.add_argument("--no-compiled", action="store_true", help="the eager part alone")
    ap.add_argument("--part", help=argparse.SUPPRESS)  # a compiled part, in its own process
    ap.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    return ap


def main(argv: Sequence[str]) -> int:
    a = build_parser().parse_args(argv)
    if not a.smoke and not torch.cuda.is_available():
        print("error: --gpu-job needs CUDA (or --smoke for the CPU check)", file=sys.stderr)
        return 2
    started = time.time() if a.deadline is None else a.deadline - a.budget_s
    job = Job(a.out, a.smoke, a.budget_s, started)
    if a.part:
        mode, arch, size, names = a.part.split(":")
        part_compiled(job, mode, arch, int(size), names.split(","))
        return 0
    candidates = json.loads(a.candidates.read_text()) if a.candidates else {}
    for stale in [*job.out.glob("warm.*"), *job.out.glob("rows-*.json")]:
        stale.unlink()
    parts = [] if a.no_compiled else list(SMOKE_COMPILED if a.smoke else COMPILED_PARTS)
    procs = []
    env = {**os.environ, "TORCHINDUCTOR_COMPILE_THREADS": os.environ.get("TORCHINDUCTOR_COMPILE_THREADS", "4")}
    for mode, arch, size, names in parts:
        cmd = [sys.executable, "-m", "tome_bench", "--gpu-job", "--out", str(job.out), "--budget-s", str(a.budget_s)]
        cmd += ["--deadline", str(job.deadline - 10), "--part", f"{mode}:{arch}:{size}:{','.join(names)}"]
        cmd += ["--smoke"] if a.smoke else []
        log = open(job.out / f"compiled-{mode}-{arch}-{size}.out", "w")  # noqa: SIM115 (closed below)
        procs.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env), log))
    device = "CPU (smoke)" if a.smoke else f"{torch.cuda.get_device_name()}, torch {torch.__version__}"
    job.say("eager", device)
    try:
        part_eager(job, candidates, SMOKE_EAGER if a.smoke else EAGER_SIZES, len(parts))
    finally:
        for proc, log in procs:
            try:
                proc.wait(timeout=max(5.0, job.left() + 5))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()
    rows = [row for path in sorted(job.out.glob("rows-*.json")) for row in json.loads(path.read_text())]
    (job.out / "gpu.json").write_text(json.dumps({"device": device, "rows": rows}, indent=1))
    text = tables(rows, device)
    (job.out / "gpu.md").write_text(text)
    print(text)
    return 0
