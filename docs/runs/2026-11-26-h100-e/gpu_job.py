"""GPU job 2 (2026-11-26, fifth session): the presets after the issue-34 rewrite, one process per part.

python3 .gpu/job2.py OUTDIR PART [--smoke]
  eager            per (arch, size): baseline, every preset, tomesd, kv refs: event/wall ms, GPU busy (sum of kernel
                   durations), kernels, aten ops, peak memory, device time per aten op (calibration)
  gen              whole generations (10 DPM++ 2M steps, the UNet loop): SD1.5 512/768, SDXL 1024, batch 2 CFG 7
                   and batch 1 CFG 1, baseline and every preset, wall time per generation and deviation
  c-MODE-ARCH      compiled (MODE default|ro) one UNet call at 1024 px: baseline, balanced, fastest
Timed sections hold an flock on OUTDIR/lock, so that only one process times at a time.
"""

from __future__ import annotations

import fcntl
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tome_bench import archs
from tome_core import apply_patch, remove_patch, stats

OUT = Path(sys.argv[1])
PART = sys.argv[2]
SMOKE = "--smoke" in sys.argv
DEV = torch.device("cpu" if SMOKE else "cuda")
DT = torch.float32 if SMOKE else torch.float16
OUT.mkdir(parents=True, exist_ok=True)
PRESETS = ["quality", "balanced", "fast", "fastest"]
LOG = open(OUT / f"{PART}.log", "a")  # noqa: SIM115


def say(*a: object) -> None:
    line = " ".join(str(x) for x in a)
    print(line, flush=True)
    LOG.write(line + "\n")
    LOG.flush()


class Lock:
    def __enter__(self):
        self.f = open(OUT / "lock", "a")
        fcntl.flock(self.f, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        self.f.close()


def sync() -> None:
    if DEV.type == "cuda":
        torch.cuda.synchronize()


def variants(arch: str) -> list[tuple[str, object]]:
    key = "sd" if arch in ("sd15", "tiny") else "sdxl"
    out = [("baseline", None), *((p, {"preset": p}) for p in PRESETS), ("tomesd", "tomesd")]
    out += [("kv2", {"mode": "kv", "max_downsample": 4})] if key == "sd" else [("kv2", {"mode": "kv"})]
    return out


def patch(unet, fields) -> None:
    if fields == "tomesd":
        import tomesd

        tomesd.apply_patch(unet, ratio=0.5)
    elif fields is not None:
        apply_patch(unet, **fields)


def unpatch(unet, fields) -> None:
    if fields == "tomesd":
        import tomesd

        tomesd.remove_patch(unet)
    elif fields is not None:
        remove_patch(unet)


def timed(fn, n: int) -> dict:
    ev, walls = [], []
    for _ in range(n):
        if DEV.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
        t0 = time.perf_counter()
        fn()
        if DEV.type == "cuda":
            b.record()
        sync()
        walls.append((time.perf_counter() - t0) * 1e3)
        if DEV.type == "cuda":
            ev.append(a.elapsed_time(b))
    src = ev or walls
    return {"ms_median": statistics.median(src), "ms_min": min(src), "wall_median": statistics.median(walls), "n": n}


def profile(fn, calls: int = 2) -> dict:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof_

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEV.type == "cuda" else [])
    sync()
    with prof_(activities=acts) as p:
        for _ in range(calls):
            fn()
        sync()
    kernels = [e for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy = sum(e.time_range.elapsed_us() for e in kernels) / 1e3
    ops = []
    for k in p.key_averages():
        if not k.key.startswith("aten::"):
            continue
        dev_t = getattr(k, "self_device_time_total", getattr(k, "self_cuda_time_total", 0.0))
        ops.append([k.key, "", k.count / calls, dev_t / 1e3 / calls, k.self_cpu_time_total / 1e3 / calls])
    ops.sort(key=lambda o: -o[3])
    return {
        "kernels_per_call": len(kernels) / calls,
        "gpu_busy_ms": busy / calls,
        "aten_calls_per_call": sum(o[2] for o in ops),
        "ops": ops,
    }


def wait_for_compiles() -> None:
    """Eager timing starts once every compiled part has compiled (WARM_PARTS of them, each leaving OUTDIR/warm.*, at
    most WARM_WAIT s): compiles on the CPU and their first GPU calls disturbed the eager timings of 2026-11-26."""
    import os

    want, limit, start = int(os.environ.get("WARM_PARTS", "0")), float(os.environ.get("WARM_WAIT", "240")), time.time()
    while len(list(OUT.glob("warm.*"))) < want and time.time() - start < limit:
        time.sleep(2)
    say(f"waited {time.time() - start:.0f} s for {want} compiled parts to warm up")


def part_eager() -> None:
    wait_for_compiles()
    combos = [("tiny", 256)] if SMOKE else [("sd15", 512), ("sd15", 768), ("sd15", 1024), ("sdxl", 1024)]
    unet, built, results = None, None, []
    for arch, size in combos:
        if built != arch:
            unet = None
            if DEV.type == "cuda":
                torch.cuda.empty_cache()
            unet, built = archs.build_unet(arch, DT, DEV), arch
        args, kwargs = archs.make_inputs(arch, size, dtype=DT, device=DEV, latent_kind="natural")
        base_out = None
        n = 3 if SMOKE else (30 if size <= 768 else 20)
        with Lock():
            for name, fields in variants(arch):
                try:
                    patch(unet, fields)
                    with torch.inference_mode():

                        def call(unet=unet, args=args, kwargs=kwargs):
                            return unet(*args, **kwargs).sample

                        for _ in range(3):
                            out = call()
                        del out
                        sync()
                        if DEV.type == "cuda":
                            torch.cuda.reset_peak_memory_stats()
                            before = torch.cuda.memory_allocated()
                        out = call()
                        sync()
                        peak = (torch.cuda.max_memory_allocated() - before) / 2**20 if DEV.type == "cuda" else 0.0
                        t = timed(call, n)
                        pr = profile(call)
                        st = stats(unet) if fields != "tomesd" else None
                        dev = 0.0 if base_out is None else float((out.float() - base_out).norm() / base_out.norm())
                        if base_out is None:
                            base_out = out.float()
                        del out
                except Exception as exc:
                    say(f"{arch} {size} {name} FAILED {type(exc).__name__}: {exc}")
                    traceback.print_exc()
                    continue
                finally:
                    unpatch(unet, fields)
                r = {
                    "arch": arch,
                    "size": size,
                    "variant": name,
                    **t,
                    "peak_mib": peak,
                    **pr,
                    "deviation": dev,
                    "stats": None if st is None else str(st)[:400],
                }
                results.append(r)
                say(
                    f"{arch} {size} {name:9s} event {t['ms_median']:8.2f} ms wall {t['wall_median']:8.2f} | busy"
                    f" {pr['gpu_busy_ms']:8.2f} ms {pr['kernels_per_call']:5.0f} kernels {pr['aten_calls_per_call']:5.0f}"
                    f" aten | peak {peak:7.0f} MiB | dev {dev:.4f}"
                )
                (OUT / "eager.json").write_text(json.dumps(results))


def part_gen() -> None:
    from diffusers import DPMSolverMultistepScheduler

    combos = [("tiny", 256)] if SMOKE else [("sd15", 512), ("sd15", 768), ("sdxl", 1024)]
    results, unet, built = [], None, None
    for arch, size in combos:
        if built != arch:
            unet = None
            if DEV.type == "cuda":
                torch.cuda.empty_cache()
            unet, built = archs.build_unet(arch, DT, DEV), arch
        for batch, cfg in ((2, 7.0), (1, 1.0)):
            (latent, _), kwargs = archs.make_inputs(arch, size, batch=1, dtype=DT, device=DEV, latent_kind="natural")
            cond = {
                k: (
                    v[:1].repeat(batch, *[1] * (v.dim() - 1))
                    if torch.is_tensor(v)
                    else {kk: vv[:1].repeat(batch, *[1] * (vv.dim() - 1)) for kk, vv in v.items()}
                )
                for k, v in kwargs.items()
            }

            def generate(unet=unet, latent=latent, cond=cond, batch=batch, cfg=cfg):
                sched = DPMSolverMultistepScheduler(num_train_timesteps=1000)
                sched.set_timesteps(3 if SMOKE else 10, device=DEV)
                x = latent.clone()
                for t in sched.timesteps:
                    inp = x.repeat(batch, 1, 1, 1)
                    eps = unet(inp, t.expand(batch), **cond).sample
                    if batch == 2:
                        eps = eps[1:] + cfg * (eps[:1] - eps[1:])
                    x = sched.step(eps, t, x).prev_sample
                return x

            with Lock():
                base = None
                for name, fields in variants(arch):
                    if name in ("kv2",):
                        continue
                    try:
                        patch(unet, fields)
                        with torch.inference_mode():
                            out = generate()
                            sync()
                            t = timed(generate, 2 if SMOKE else 3)
                    except Exception as exc:
                        say(f"gen {arch} {size} b{batch} {name} FAILED {type(exc).__name__}: {exc}")
                        continue
                    finally:
                        unpatch(unet, fields)
                    dev = 0.0 if base is None else float((out.float() - base).norm() / base.norm())
                    if base is None:
                        base = out.float()
                    results.append(
                        {"arch": arch, "size": size, "batch": batch, "cfg": cfg, "variant": name, **t, "deviation": dev}
                    )
                    say(
                        f"gen {arch} {size} b{batch} {name:9s} {t['wall_median']:9.1f} ms (event {t['ms_median']:.1f}) dev {dev:.4f}"
                    )
                    (OUT / "gen.json").write_text(json.dumps(results))


def part_compiled(mode: str, arch: str) -> None:
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.config.recompile_limit = 64
    size = 256 if SMOKE else 1024
    arch = "tiny" if SMOKE else arch
    unet = archs.build_unet(arch, DT, DEV)
    args, kwargs = archs.make_inputs(arch, size, dtype=DT, device=DEV, latent_kind="natural")
    comp = torch.compile(
        unet, mode=None if (SMOKE or mode == "default") else "reduce-overhead", fullgraph=True, dynamic=False
    )
    results = []
    names = ["baseline", "balanced", "fastest"]
    warm: dict[str, float] = {}
    for name in names:  # compile every variant first (one graph each), then time them one by one under the lock
        try:
            if name != "baseline":
                apply_patch(unet, preset=name)
            with torch.inference_mode():
                t0 = time.perf_counter()
                for _ in range(3):
                    comp(*args, **kwargs)
                sync()
                warm[name] = time.perf_counter() - t0
        except Exception as exc:
            say(f"{PART} {name} FAILED {type(exc).__name__}: {str(exc)[:300]}")
            traceback.print_exc()
        finally:
            if name != "baseline":
                remove_patch(unet)
    (OUT / f"warm.{PART}").touch()
    for name in [n for n in names if n in warm]:
        try:
            if name != "baseline":
                apply_patch(unet, preset=name)
            with torch.inference_mode(), Lock():
                for _ in range(3):
                    comp(*args, **kwargs)
                t = timed(lambda: comp(*args, **kwargs).sample, 5 if SMOKE else 30)
            st = stats(unet)
        except Exception as exc:
            say(f"{PART} {name} FAILED {type(exc).__name__}: {str(exc)[:300]}")
            continue
        finally:
            if name != "baseline":
                remove_patch(unet)
        r = {
            "mode": mode,
            "arch": arch,
            "size": size,
            "variant": name,
            "warm_s": warm[name],
            **t,
            "graphs": int(counters["stats"]["unique_graphs"]),
            "skips": int(counters["inductor"]["cudagraph_skips"]),
            "stats": None if st is None else str(st)[:300],
        }
        results.append(r)
        say(
            f"{PART} {name:9s} {t['ms_median']:8.2f} ms (wall {t['wall_median']:.2f}) warm {warm[name]:.0f} s graphs"
            f" {r['graphs']} skips {r['skips']} | {r['stats']}"
        )
        (OUT / f"{PART}.json").write_text(json.dumps(results))


if __name__ == "__main__":
    if DEV.type == "cuda":
        say(torch.__version__, torch.cuda.get_device_name())
    if PART == "eager":
        part_eager()
    elif PART == "gen":
        part_gen()
    elif PART.startswith("c-"):
        _, mode, arch = PART.split("-")
        part_compiled(mode, arch)
    say("done", PART)
