"""`python -m tome_bench gpu-job`: what every preset does to one model call on a GPU, in one command that fits one
10-minute run (--budget-s), with numbers that hold.

Per case (SD1.5 at 512 and 1024 px, SDXL at 1024 and 1536 px; fp16, SDPA, batch 2), for the unpatched model, every
preset of `tome_core.presets()`, the references the presets are held to (`fidelity.references`) and tomesd 0.1.3
itself where installed: GPU busy time and kernels per call (`torch.profiler`), peak memory and the wall clock eager;
the unpatched model and the presets also compiled (`torch.compile`, inductor's default mode) and with CUDA graphs
("reduce-overhead"). The rules, each a method of `Job`:

1. `build`: every compiled and CUDA-graph variant of every case is compiled and warmed in this one process before
   the first timed sample; no compile, and no other process of the job, runs beside a timing. What the budget
   cannot compile is listed as not run.
2. `time_case`: variants interleaved, each round times every row of a case once; per row the median and the
   spread ((max - min) / median) of its samples.
3. `rerun`: a row whose spread exceeds 5% is timed again, interleaved with its baseline; still above 5%, it is
   unreliable: printed as such and kept out of the figures it would feed (speed-ups, the speed table, the fit).
4. `check`: a CUDA-graph baseline slower than the eager one, or a compiled baseline slower than eager beyond their
   spread, stops the job with a message saying what is wrong; so does a graph compiled during the timed rounds.

The clock and the device calls are a `Device`: `--dry-run` (and the tests, with a fake timer) run the whole sequence
on the CPU with the tiny UNets in float32. Writes OUT/gpu.json (`calibrate` reads it) and OUT/gpu.md; `--write` puts
the presets' reliable busy-time speed-ups into tome_core/speed_table.json (`estimate.measured_rows`).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import importlib
import importlib.util
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tome_bench import archs, dit_archs, kernels, options

#: Above this spread a row is timed again, and then unreliable.
SPREAD = 0.05
MODES = ("eager", "compiled", "cudagraphs")
#: torch.compile's mode per compiled mode.
COMPILE_MODES = {"compiled": "default", "cudagraphs": "reduce-overhead"}
#: What a compile takes before one has been measured (s, per family; the H200 runs of 2026-11-26/27: 50-120 s).
COMPILE_GUESS_S = {"sd": 70.0, "sdxl": 120.0, "flux": 240.0, "wan": 150.0}
Inputs = tuple[tuple[Any, ...], dict[str, Any]]


@dataclass(frozen=True)
class Case:
    """One (architecture, size) of the matrix. `build` and `inputs` make its model and one call's arguments, and
    `family` is the presets' family (default `archs.build_unet`, `archs.make_inputs` and the `archs.Arch`'s): another
    kind of model is one entry with its own."""

    arch: str
    size: int
    build: Callable[[str, torch.dtype, torch.device], nn.Module] | None = None
    inputs: Callable[[str, int, torch.dtype, torch.device], Inputs] | None = None
    family: str | None = None

    @property
    def name(self) -> str:
        return f"{self.arch} {self.size}"

    @property
    def presets_family(self) -> str:
        return self.family or archs.get_arch(self.arch).family

    def model(self, dtype: torch.dtype, device: torch.device) -> nn.Module:
        return (self.build or archs.build_unet)(self.arch, dtype, device)

    def call_inputs(self, dtype: torch.dtype, device: torch.device) -> Inputs:
        if self.inputs is not None:
            return self.inputs(self.arch, self.size, dtype, device)
        return archs.make_inputs(self.arch, self.size, dtype=dtype, device=device, latent_kind="natural")


#: The diffusion transformers the job runs (random weights made on the GPU, tome_bench.dit_archs): Flux.1-dev at
#: 1024 px, Wan 2.1 1.3B at 480p (81 frames) and LTX-Video 2B at 768x512 (121 frames), at the batch each family
#: samples with. HunyuanVideo 13B's call at 720p takes about 23 s of GPU work (estimated): not in a 10-minute job.
DIT_CASES = (
    Case("flux-dev", 1024, dit_archs.device_model, dit_archs.device_inputs, "flux"),
    Case("wan-1.3b", 480, dit_archs.device_model, dit_archs.device_inputs, "wan"),
    Case("ltx-2b", 512, dit_archs.device_model, dit_archs.device_inputs, "ltx"),
)
CASES = (Case("sd15", 512), Case("sd15", 1024), Case("sdxl", 1024), Case("sdxl", 1536), *DIT_CASES)
DRY_CASES = (
    Case("tiny", 64),
    Case("tiny-xl", 64),
    Case("flux-tiny", 128, dit_archs.device_model, dit_archs.device_inputs, "flux"),
)


@dataclass(frozen=True)
class Variant:
    """One thing measured: `fields` None for the unpatched model, "tomesd" for tomesd itself, else `apply_patch`
    keywords (a preset as {"preset": name}); `compiled`: also run compiled and with CUDA graphs."""

    name: str
    fields: Mapping[str, Any] | str | None
    compiled: bool = False

    def apply(self, model: nn.Module) -> None:
        if self.fields == "tomesd":
            importlib.import_module("tomesd").apply_patch(model, ratio=0.5)
        elif isinstance(self.fields, Mapping):
            importlib.import_module("tome_core").apply_patch(model, **self.fields)

    def remove(self, model: nn.Module) -> None:
        if self.fields is not None:
            importlib.import_module("tomesd" if self.fields == "tomesd" else "tome_core").remove_patch(model)


def variants(case: Case, candidates: Mapping[str, Mapping[str, Any]] = {}) -> list[Variant]:
    """The unpatched model and the presets (compiled too), the references, tomesd where installed (SD1/SD2: on SDXL
    its default merges nothing), and the candidates (name -> {family -> fields}) of the case's family."""
    from tome_bench.fidelity import references

    family = case.presets_family
    out = [Variant("baseline", None, True), *(Variant(n, {"preset": n}, True) for n in options.preset_names())]
    out += [Variant(name, fields) for name, fields in references(family).items()]
    if family == "sd" and importlib.util.find_spec("tomesd") is not None:
        out.append(Variant("tomesd", "tomesd"))
    return out + [Variant(name, per[family]) for name, per in candidates.items() if family in per]


@dataclass
class Timed:
    """The samples of one row, ms per call: a variant of a case in one mode ("busy": GPU busy time from profiles)."""

    case: Case
    variant: Variant
    mode: str
    samples: list[float] = field(default_factory=list)
    first: list[float] = field(default_factory=list)  # the samples before a re-run

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def spread(self) -> float | None:
        return options.spread(self.samples)

    @property
    def reliable(self) -> bool:
        return bool(self.samples) and (self.spread or 0.0) <= SPREAD

    def summary(self) -> dict[str, Any]:
        return {"median_ms": self.median, "spread": self.spread, "reliable": self.reliable, "samples_ms": self.samples}


class Stop(Exception):
    """A sanity check failed: the job stops and says what is wrong."""


# ---------------------------------------------------------------------------------------------- the device


@dataclass
class Device:
    """What the job asks of the accelerator, replaceable: the CPU dry run and the tests give their own."""

    name: str
    device: torch.device
    dtype: torch.dtype
    #: ms per call of `calls` calls of `call`, timing `row` (the device synchronised around them).
    timer: Callable[[Timed, Callable[[], Any], int], float]
    #: (busy ms, kernels, [[aten name, "", calls, device ms, cpu ms], ...]) of one profiled call.
    profile: Callable[[Callable[[], Any]], tuple[float, int, list[list[Any]]]]
    peak_mib: Callable[[Callable[[], Any]], float]
    #: The compiled callable of a model in a mode of `COMPILE_MODES`.
    compile: Callable[[nn.Module, str], Callable[..., Any]]
    #: Graphs compiled in this process so far (a timed round must not add any).
    graphs: Callable[[], int] = lambda: 0
    sync: Callable[[], None] = lambda: None
    #: Whether a baseline out of line stops the job (the dry run's CPU timings only report it).
    strict: bool = True


def wall_timer(sync: Callable[[], None], clock: Callable[[], float] = time.perf_counter) -> Callable[..., float]:
    def timer(row: Timed, call: Callable[[], Any], calls: int) -> float:
        sync()
        start = clock()
        for _ in range(calls):
            call()
        sync()
        return (clock() - start) * 1e3 / calls

    return timer


def profile_call(call: Callable[[], Any], cuda: bool) -> tuple[float, int, list[list[Any]]]:
    """torch.profiler of one call: the sum of its kernels' durations, its kernels and its aten operations' device
    and CPU times (on the CPU: the aten operations stand in for kernels, their CPU time for the busy time)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]) as prof:
        call()
        if cuda:
            torch.cuda.synchronize()
    device_ms = lambda k: getattr(k, "self_device_time_total", 0.0) / 1e3
    averages = [k for k in prof.key_averages() if k.key.startswith("aten::")]
    ops = [[k.key, "", k.count, device_ms(k), k.self_cpu_time_total / 1e3] for k in averages]
    if not cuda:
        return sum(op[4] for op in ops), sum(op[2] for op in ops), ops
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sum(e.time_range.elapsed_us() for e in kernels) / 1e3, len(kernels), ops


def cuda_peak_mib(call: Callable[[], Any]) -> float:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    call()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def compile_with(backend: str) -> Callable[[nn.Module, str], Callable[..., Any]]:
    def compile_model(model: nn.Module, mode: str) -> Callable[..., Any]:
        # every variant and size is a graph of the same code: dynamo's default limit (8) would send the rest to eager
        torch._dynamo.config.recompile_limit = 256
        torch._dynamo.config.accumulated_recompile_limit = 1024
        how = {"backend": backend} if backend != "inductor" else {"mode": None if mode == "default" else mode}
        return torch.compile(model, fullgraph=True, dynamic=False, **how)

    return compile_model


def dynamo_graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def cuda_device() -> Device:
    timer, profile, sync = wall_timer(torch.cuda.synchronize), lambda c: profile_call(c, True), torch.cuda.synchronize
    name, compiled = torch.cuda.get_device_name(), compile_with("inductor")
    return Device(
        name, torch.device("cuda"), torch.float16, timer, profile, cuda_peak_mib, compiled, dynamo_graphs, sync
    )


def dry_device() -> Device:
    """The CPU dry run: the tiny UNets in float32, dynamo's eager backend for both compiled modes (graphs, no code)."""
    timer, profile, compiled = wall_timer(lambda: None), lambda c: profile_call(c, False), compile_with("eager")
    cpu, graphs = torch.device("cpu"), dynamo_graphs
    return Device("CPU (dry run)", cpu, torch.float32, timer, profile, lambda c: 0.0, compiled, graphs, strict=False)


# ---------------------------------------------------------------------------------------------- the job


class Job:
    """One run: the cases, their models, inputs and compiled callables, the rows, and what happened in which order
    (`events`: ("build" | "compile" | "profile" | "time", what), the sequence the tests check)."""

    def __init__(self, device: Device, cases: Sequence[Case], modes: Sequence[str], budget_s: float, out: Path,
                 rounds: int = 5, calls: int = 2, profiles: int = 3, candidates: Mapping[str, Any] = {}) -> None:  # fmt: skip
        self.device, self.cases, self.modes, self.out = device, list(cases), list(modes), out
        self.rounds, self.calls, self.profiles, self.budget_s = rounds, calls, profiles, budget_s
        self.started = time.monotonic()
        self.variants = {case.name: variants(case, candidates) for case in cases}
        self.models: dict[str, nn.Module] = {}
        self.inputs: dict[str, Inputs] = {}
        self.compiled: dict[tuple[str, str], Callable[..., Any]] = {}
        self.call_s: dict[str, float] = {}  # the slowest eager call of each case, for the budget
        self.rows: dict[tuple[str, str, str], Timed] = {}
        self.info: dict[tuple[str, str], dict[str, Any]] = {}
        self.events: list[tuple[str, str]] = []
        self.not_run: list[str] = []
        self.checks: list[str] = []
        out.mkdir(parents=True, exist_ok=True)

    def left(self) -> float:
        return self.started + self.budget_s - time.monotonic()

    def say(self, text: str) -> None:
        line = f"[gpu-job {time.monotonic() - self.started:6.1f} s] {text}"
        print(line, flush=True)
        with open(self.out / "gpu-job.log", "a") as log:
            log.write(line + "\n")

    @contextlib.contextmanager
    def applied(self, case: Case, v: Variant, mode: str, warm: int = 1) -> Iterator[Callable[[], Any]]:
        """`v` applied to the case's model and its call in `mode`, warmed `warm` times (untimed): the first call
        after a patch builds what the patch keeps per grid, a compiled mode's first calls compile and record."""
        model, (args, kwargs) = self.models[case.arch], self.inputs[case.name]
        fn = model if mode in ("eager", "busy") else self.compiled[case.arch, mode]
        # under CUDA graphs each call is a step of its own: no output of the graphs is kept
        step = torch.compiler.cudagraph_mark_step_begin if mode == "cudagraphs" else lambda: None

        def call() -> Any:
            step()
            return fn(*args, **kwargs)

        v.apply(model)
        try:
            with torch.inference_mode():
                for _ in range(warm):
                    call()
                self.device.sync()
                yield call
        finally:
            v.remove(model)

    def run(self) -> None:
        failed = kernels.check_own_key(self.device, self.checks)
        if failed is not None:
            raise Stop(failed)
        kernels.time_masked_attention(self.device, self.checks)
        kernels.check_libraries(self.device, self.checks)
        self.build()
        for case in self.cases:
            if self.left() < self.reserve([case]):
                self.not_run.append(f"{case.name}: timed rounds (budget)")
                continue
            self.rerun(case, self.time_case(case))
            self.check(case)

    def build(self) -> None:
        """Models, inputs and each variant's eager call (warmed; peak memory, the fields that ran, what merged),
        then every compiled variant the budget allows, case by case, baselines first: all before any timing."""
        for case in self.cases:
            if case.arch not in self.models:
                self.models[case.arch] = case.model(self.device.dtype, self.device.device)
            self.inputs[case.name] = case.call_inputs(self.device.dtype, self.device.device)
            for v in self.variants[case.name]:
                self.events.append(("build", f"{case.name} {v.name}"))
                try:
                    with self.applied(case, v, "eager", warm=2) as call, torch.inference_mode():
                        start = time.perf_counter()
                        call()
                        self.device.sync()
                        self.call_s[case.name] = max(self.call_s.get(case.name, 0.0), time.perf_counter() - start)
                        peak = self.device.peak_mib(call)
                        self.info[case.name, v.name] = {"peak_mib": peak, **merged(self.models[case.arch], v)}
                except Exception as exc:  # one variant failing must not end the job: it is reported, the rest run
                    self.say(f"{case.name} {v.name} FAILED {type(exc).__name__}: {exc}")
                    self.not_run.append(f"{case.name} {v.name}: {type(exc).__name__}: {exc}")
                    continue
                for mode in ("busy", "eager"):
                    self.rows[case.name, v.name, mode] = Timed(case, v, mode)
        compiled = [m for m in self.modes if m in COMPILE_MODES]
        spent: dict[str, float] = {}
        for case, v, mode in [
            (c, v, m) for c in self.cases for v in self.variants[c.name] if v.compiled for m in compiled
        ]:
            guess = spent.get(case.arch, COMPILE_GUESS_S.get(case.presets_family, 60.0))
            if (case.name, v.name, "eager") not in self.rows or self.left() < guess + self.reserve(self.cases, case):
                self.not_run.append(f"{case.name} {v.name} {mode}: not compiled (budget, or it failed eager)")
                continue
            self.events.append(("compile", f"{case.name} {v.name} {mode}"))
            start = time.monotonic()
            try:
                if (case.arch, mode) not in self.compiled:
                    self.compiled[case.arch, mode] = self.device.compile(self.models[case.arch], COMPILE_MODES[mode])
                with self.applied(case, v, mode, warm=3):  # compiles; under CUDA graphs the later calls record
                    pass
            except Exception as exc:
                self.say(f"{case.name} {v.name} {mode} FAILED to compile: {type(exc).__name__}: {str(exc)[:300]}")
                self.not_run.append(f"{case.name} {v.name} {mode}: {type(exc).__name__}")
                continue
            spent[case.arch] = time.monotonic() - start
            self.say(f"{case.name} {v.name} {mode}: compiled and warmed in {spent[case.arch]:.0f} s")
            self.rows[case.name, v.name, mode] = Timed(case, v, mode)

    def reserve(self, cases: Sequence[Case], more: Case | None = None) -> float:
        """Seconds the timed rounds of `cases` will take, half again for re-runs, with one more compiled row of
        `more`: each sample a warm call and `calls` calls (an eager call's time), each profile half a second more."""
        total = 10.0
        for case in cases:
            modes = [m for (name, _, m) in self.rows if name == case.name] + (["compiled"] if more == case else [])
            calls = sum(self.profiles if m == "busy" else self.rounds * (self.calls + 1) for m in modes)
            total += 1.5 * (calls * self.call_s.get(case.name, 0.1) + 0.5 * self.profiles * modes.count("busy"))
        return total

    def time_case(self, case: Case, rows: Sequence[Timed] | None = None, rounds: int | None = None) -> list[Timed]:
        """Round-robin: each round times every row once (busy rows: one profiled call each, in the first rounds),
        applying its variant, warming its call once, and removing it again; no graph may compile meanwhile."""
        rows = list(rows if rows is not None else (r for r in self.rows.values() if r.case == case))
        graphs = self.device.graphs()
        for rnd in range(rounds or self.rounds):
            for row in [r for r in rows if r.mode != "busy" or rnd < self.profiles]:
                self.events.append(
                    ("profile" if row.mode == "busy" else "time", f"{case.name} {row.variant.name} {row.mode}")
                )
                with self.applied(case, row.variant, row.mode) as call, torch.inference_mode():
                    if row.mode != "busy":
                        row.samples.append(self.device.timer(row, call, self.calls))
                        continue
                    busy, kernels, ops = self.device.profile(call)
                    row.samples.append(busy)
                    info = self.info[case.name, row.variant.name]
                    if busy < info.get("least_busy_ms", float("inf")):  # the operations of the least busy profile
                        info |= {"least_busy_ms": busy, "kernels_per_call": kernels, "ops": ops}
                        info["aten_calls_per_call"] = sum(op[2] for op in ops)
        if self.device.graphs() != graphs:
            raise Stop(f"{case.name}: {self.device.graphs() - graphs} graph(s) compiled during the timed rounds")
        return rows

    def rerun(self, case: Case, rows: Sequence[Timed]) -> None:
        """Rows above SPREAD timed again with the baseline of their mode, round-robin (their first samples kept)."""
        for mode in dict.fromkeys(r.mode for r in rows if not r.reliable):
            again = [r for r in rows if r.mode == mode and (not r.reliable or r.variant.name == "baseline")]
            flagged = ", ".join(r.variant.name for r in again if not r.reliable)
            self.say(f"{case.name} {mode}: {flagged} spread above {SPREAD:.0%}: timed again with the baseline")
            for r in again:
                r.first, r.samples = r.samples, []
            self.time_case(case, again, max(self.rounds, self.profiles))
            for r in again:
                state = "" if r.reliable else ": UNRELIABLE"
                self.say(f"{case.name} {r.variant.name} {mode}: {r.median:.3f} ms, spread {r.spread or 0:.1%}{state}")

    def check(self, case: Case) -> None:
        """Stop when a baseline is out of line: CUDA graphs slower than eager, or compiled slower beyond the spread
        (the dry run only reports it: CPU timings say nothing of a GPU)."""
        eager, compiled, graphs = (self.rows.get((case.name, "baseline", m)) for m in MODES)
        if eager is None or not eager.samples:
            return
        wrong, line = [], f"{case.name}: the {{}} baseline took {{:.3f}} ms per call, slower than the eager baseline's"
        line += f" {eager.median:.3f} ms{{}}: something else ran on the GPU, or {{}}"
        if graphs is not None and graphs.samples and graphs.median > eager.median:
            why = "inductor ran the graph without CUDA graphs (TORCH_LOGS=cudagraphs says why)"
            wrong.append(line.format("CUDA-graph", graphs.median, "", why))
        spread = max(eager.spread or 0.0, (compiled.spread if compiled and compiled.samples else None) or 0.0)
        if compiled is not None and compiled.samples and compiled.median > eager.median * (1 + spread):
            wrong.append(line.format("compiled", compiled.median, " beyond their spread", "the compile fell back"))
        if wrong and self.device.strict:
            raise Stop(wrong[0])
        got = "".join(f", {r.mode} {r.median:.3f} ms" for r in (compiled, graphs) if r is not None and r.samples)
        self.checks += [f"would stop on a GPU: {w}" for w in wrong] or [
            f"{case.name}: baselines in line (eager {eager.median:.3f} ms{got})"
        ]

    def payload(self, stopped: str | None) -> dict[str, Any]:
        rows = []
        for (name, variant), info in self.info.items():
            case = next(c for c in self.cases if c.name == name)
            got = {m: r.summary() for m in ("busy", *MODES) if (r := self.rows.get((name, variant, m))) and r.samples}
            row = {"part": "eager", "arch": case.arch, "size": case.size, "variant": variant, **info, "timings": got}
            if "busy" in got:  # what calibrate and the speed table read
                row |= {"gpu_busy_ms": got["busy"]["median_ms"], "busy_reliable": got["busy"]["reliable"]}
            rows.append(row)
        now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        out = {
            "device": self.device.name,
            "torch": torch.__version__,
            "date": now,
            "dry_run": self.device.device.type != "cuda",
        }
        out |= {"budget_s": self.budget_s, "wall_s": time.monotonic() - self.started, "rounds": self.rounds}
        out |= {"calls": self.calls, "profiles": self.profiles, "spread_limit": SPREAD, "stopped": stopped}
        return out | {"checks": self.checks, "not_run": self.not_run, "rows": rows}


def merged(model: nn.Module, v: Variant) -> dict[str, Any]:
    """The TomeConfig fields that ran (a preset resolved for the family; what calibrate rebuilds the variant from)
    and what the patch says it merged, as 'applied/selected blocks (kinds)'."""
    if not isinstance(v.fields, Mapping):
        return {"fields": v.fields, "merged": None}
    from tome_core import get_config, stats

    st, config = stats(model), get_config(model)
    what = None if st is None else f"{st.applied}/{st.selected} blocks ({', '.join(f'{k} {n}' for k, n in st.modules)})"
    return {"fields": None if config is None else config.to_dict(), "merged": what}


#: Operations no patch changes: their device time beside the baseline's tells a disturbed profile (older runs).
UNTOUCHED = ("aten::cudnn_convolution", "aten::native_group_norm")


def disturbed(row: Mapping[str, Any], base: Mapping[str, Any] | None, limit: float = 0.05) -> bool:
    """Whether `row`'s untouched operations took more than `limit` longer than the baseline's (another process's
    kernels overlapped the profile: runs before the spread rule)."""
    untouched = lambda r: sum(op[3] for op in r["ops"] if op[0] in UNTOUCHED)
    return base is not None and untouched(base) > 0 and untouched(row) > (1 + limit) * untouched(base)


def tables(data: Mapping[str, Any]) -> str:
    """Markdown: per case a row per variant, each figure with its spread; an unreliable one says so and feeds no
    speed-up."""
    from tome_bench.report import markdown_table

    out = [f"# GPU job: {data['device']}", "", *([f"**Stopped: {data['stopped']}**", ""] if data["stopped"] else [])]
    head = ["variant", "GPU busy ms", "less GPU time", "kernels", "kernels added"]
    head += [f"{m} {k}" for m in ("eager", "compiled", "CUDA graphs") for k in ("ms", "speed-up")]
    for arch, size in dict.fromkeys((r["arch"], r["size"]) for r in data["rows"]):
        group = [r for r in data["rows"] if (r["arch"], r["size"]) == (arch, size)]
        base = next((r for r in group if r["variant"] == "baseline"), {"timings": {}})
        lines = []
        for r in group:
            kernels, ref = r.get("kernels_per_call"), base.get("kernels_per_call")
            cells = [r["variant"], *_pair(base, r, "busy"), str(kernels or "-")]
            cells += [f"{100 * (kernels / ref - 1):+.1f}%" if kernels and ref else "-"]
            lines.append(
                [*cells, *(c for m in MODES for c in _pair(base, r, m)), f"{r['peak_mib']:.0f}", r.get("merged") or ""]
            )
        table = markdown_table([*head, "peak MiB", "merged (stats)"], lines)
        label = archs.ARCHS[arch].label if arch in archs.ARCHS else arch
        out += [f"## {label} {size} px (fp16)", "", table, ""]
    out += [f"ms: median per call (spread: (max - min) / median of its samples); unreliable: above {SPREAD:.0%} after"]
    out += [" a re-run, no speed-up from it. not run: not compiled (the budget) or not measured.", ""]
    out += [f"- check: {c}" for c in data["checks"]] + [f"- not run: {n}" for n in data["not_run"]]
    return "\n".join(out) + "\n"


def _pair(base: Mapping[str, Any], row: Mapping[str, Any], mode: str) -> tuple[str, str]:
    """A row's median ms (spread) in one mode, and its speed-up over the baseline's unless either is unreliable."""
    got, ref = row["timings"].get(mode), base["timings"].get(mode)
    if not got:
        return "not run", "-"
    ms = f"{got['median_ms']:.2f} ({got['spread'] or 0:.0%})" + ("" if got["reliable"] else " unreliable")
    return ms, f"{ref['median_ms'] / got['median_ms']:.2f}x" if ref and ref["reliable"] and got["reliable"] else "-"


# ---------------------------------------------------------------------------------------------- the command


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m tome_bench gpu-job", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("bench-out/gpu-job"), help="where gpu.json and gpu.md go")
    ap.add_argument("--budget-s", type=float, default=480.0, help="seconds it may take (default 480: a 10-min run)")
    ap.add_argument("--cases", help=f"ARCH:SIZE,... (default {','.join(f'{c.arch}:{c.size}' for c in CASES)})")
    ap.add_argument("--modes", default=",".join(MODES), help=f"of {','.join(MODES)} (default all)")
    ap.add_argument("--rounds", type=int, default=5, help="timed samples per row (default 5)")
    ap.add_argument("--calls", type=int, default=2, help="calls per timed sample (default 2)")
    ap.add_argument("--candidates", type=Path, help="JSON: name -> {family -> TomeConfig fields}, measured eager too")
    ap.add_argument("--dry-run", action="store_true", help="the tiny UNets on the CPU: the sequence, no GPU figure")
    help_write = "put the measured rows into tome_core/speed_table.json: of this run, or of GPU_JSON without a run"
    ap.add_argument("--write", nargs="?", const="", metavar="GPU_JSON", help=help_write)
    return ap


def main(argv: Sequence[str], device: Device | None = None) -> int:
    a = build_parser().parse_args(argv)
    if a.write:
        return write(json.loads(Path(a.write).read_text()))
    if device is None and not a.dry_run and not torch.cuda.is_available():
        print("error: gpu-job needs CUDA (--dry-run runs its sequence on the CPU)", file=sys.stderr)
        return 2
    device = device or (dry_device() if a.dry_run else cuda_device())
    cases = DRY_CASES if a.dry_run else CASES
    known = {(c.arch, c.size): c for c in (*CASES, *DRY_CASES)}
    if a.cases:
        asked = [(c.split(":")[0], int(c.split(":")[1])) for c in a.cases.split(",")]
        cases = tuple(known.get(key, Case(*key)) for key in asked)
    candidates = json.loads(a.candidates.read_text()) if a.candidates else {}
    modes = options.names(a.modes, MODES, "--modes")
    job = Job(device, cases, modes, a.budget_s, a.out, a.rounds, a.calls, candidates=candidates)
    job.say(f"{device.name}: {', '.join(c.name for c in cases)}; {', '.join(modes)}; budget {a.budget_s:.0f} s")
    stopped = None
    try:
        job.run()
    except Stop as exc:
        stopped = str(exc)
        job.say(f"STOPPED: {stopped}")
    data = job.payload(stopped)
    (a.out / "gpu.json").write_text(json.dumps(data, indent=1))
    (a.out / "gpu.md").write_text(tables(data))
    print(tables(data))
    return 1 if stopped else write(data) if a.write == "" else 0


def write(data: Mapping[str, Any]) -> int:
    """The measured rows of a GPU job's output into the speed table (`estimate.measured_rows`)."""
    from tome_bench import estimate

    if data.get("dry_run") or data.get("stopped"):
        print("error: a dry run or a stopped job measured nothing for the speed table", file=sys.stderr)
        return 2
    sources, rows = estimate.measured_rows(data)
    estimate.write_table(sources, rows)
    print(f"wrote {len(rows)} measured rows into {estimate.SPEED_TABLE}")
    return 0
