"""Timing one call, the same way in every job that times variants side by side: a UNet step (`run.run_step`), a whole
generation (`generate.run_generation`) and an image (`images`) are each `timed_call(fn, ...)`.

Two clocks (`--clock`): "wall" (`torch.utils.benchmark.timer`: `time.perf_counter` read after synchronising the
device, the default) and "cpu" (`time.process_time`, the CPU time of this process, every thread together). On a
machine shared with other processes the wall time of a CPU-bound call grows with their load, while its CPU time stays
near the quiet wall time as long as torch runs one thread (`--threads 1`); with N threads it is about N times the wall
time and no longer compares with it. The GPU job times on its own (`gpu_job.Device`).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch
from torch.utils.benchmark import timer as benchmark_timer

#: The clocks of `--clock`: name -> (seconds function, how the report names it).
CLOCKS: dict[str, tuple[Callable[[], float], str]] = {
    "wall": (benchmark_timer, "wall time (time.perf_counter after synchronising the device, torch.utils.benchmark)"),
    "cpu": (time.process_time, "CPU time of the process, all threads (time.process_time)"),
}

T = TypeVar("T")


def clock(name: str) -> Callable[[], float]:
    """The seconds function of a `--clock` name; ValueError naming the known ones."""
    try:
        return CLOCKS[name][0]
    except KeyError:
        raise ValueError(f"clock must be one of {', '.join(CLOCKS)}, got {name!r}") from None


def _status(key: str) -> int | None:
    """A size in bytes from /proc/self/status ("VmRSS", "VmHWM": the peak since the last reset); None off Linux."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return None


def rss_bytes() -> int | None:
    return _status("VmRSS")


def reset_peak_rss() -> int | None:
    """Give freed heap back to the OS (glibc), reset the kernel's peak RSS (clear_refs 5) and return the RSS now."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")
    return rss_bytes()


def timed_call(
    fn: Callable[[], T], device: torch.device, *, clock_name: str = "wall", sample_rss: bool = False
) -> tuple[float, T, int | None]:
    """Run `fn()` once under `torch.inference_mode`, timed on `clock_name`: (seconds, its result, peak memory growth
    in bytes or None). Memory: CUDA's max_memory_allocated growth on cuda, else with `sample_rss` the peak RSS the
    kernel recorded over the call. The garbage collector is off inside the timed call (no collection pause lands on
    one variant). One call exactly, and its result kept: `torch.utils.benchmark.Timer` runs a statement three times
    at least and keeps no result, so the round-robin rounds time their calls here."""
    now = clock(clock_name)
    before = reset_peak_rss() if sample_rss and device.type != "cuda" else None
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
    gc.disable()
    try:
        with torch.inference_mode():
            start = now()  # the wall clock waits for the device's queued work before each reading
            result = fn()
            seconds = now() - start
    finally:
        gc.enable()
    if device.type == "cuda":
        return seconds, result, torch.cuda.max_memory_allocated(device) - (before or 0)
    peak = _status("VmHWM") if before is not None else None
    return seconds, result, None if peak is None or before is None else peak - before
