"""Timing one call, the same way in both modes: a UNet step (`run.run_step`) and a whole generation
(`generate.run_generation`) are both `timed_call(fn, ...)`.

Two clocks (`--clock`): "wall" (`torch.utils.benchmark.timer`: `time.perf_counter` read after synchronising the
device, the default) and "cpu" (`time.process_time`, the CPU time of this process, every thread together). On a machine shared with other processes the wall time of a CPU-bound
call grows with their load, while its CPU time stays near the quiet wall time as long as torch runs one thread
(`--threads 1`); with N threads the CPU time is about N times the wall time and no longer compares with it.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

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


def rss_bytes() -> int | None:
    """Current resident set size from /proc (Linux); None elsewhere."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def _malloc_trim() -> None:
    """Give freed heap memory back to the OS (glibc) so RSS before a run is close to live memory."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class RssSampler:
    """Peak RSS growth over a block, sampled from /proc/self/statm every `interval` s by a thread.

    An estimate: short-lived peaks between samples are missed and allocator caching blurs it, but large
    tensors (attention maps, activations) are mmap'ed by glibc and show up. `peak` is None off Linux.
    `cpu_s` is the CPU time the sampling thread itself used, which the "cpu" clock takes off the call's time.
    """

    def __init__(self, interval: float = 0.001) -> None:
        self.interval = interval
        self.peak: int | None = None
        self.cpu_s = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> RssSampler:
        gc.collect()
        _malloc_trim()
        self._base = rss_bytes()
        if self._base is not None:
            self._max = self._base
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        start = time.thread_time()
        while not self._stop.wait(self.interval):
            rss = rss_bytes()
            if rss is not None and rss > self._max:
                self._max = rss
        self.cpu_s = time.thread_time() - start

    def __exit__(self, *exc: Any) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        rss = rss_bytes()
        self.peak = max(self._max, rss or 0) - self._base


def timed_call(
    fn: Callable[[], T], device: torch.device, *, clock_name: str = "wall", sample_rss: bool = False
) -> tuple[float, T, int | None]:
    """Run `fn()` once under `torch.inference_mode`, timed on `clock_name`: (seconds, its result, peak memory
    growth in bytes or None).

    Memory: CUDA's max_memory_allocated growth on cuda, else the sampled RSS growth when `sample_rss`. The
    garbage collector is off inside the timed call (no collection pause lands on one variant). One call exactly, and
    its result kept: `torch.utils.benchmark.Timer` runs a statement three times at least and keeps no result, so the
    round-robin rounds time their calls here.
    """
    now = clock(clock_name)
    sampler = RssSampler() if sample_rss else None
    before = 0
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
    gc.disable()
    try:
        with torch.inference_mode(), sampler if sampler is not None else contextlib.nullcontext():
            start = now()  # the wall clock waits for the device's queued work before each reading
            result = fn()
            seconds = now() - start
    finally:
        gc.enable()
    mem: int | None = None
    if device.type == "cuda":
        mem = torch.cuda.max_memory_allocated(device) - before
    elif sampler is not None:
        mem = sampler.peak
    if sampler is not None and clock_name == "cpu":
        seconds = max(seconds - sampler.cpu_s, 0.0)
    return seconds, result, mem


class TimingLock:
    """--lock: an exclusive file lock (flock) taken before the first timed run of a size and held to its end.

    Several benchmark processes on one machine can then warm up (compile, on the CPU) side by side while only
    one of them times at a time, so that no other process's kernels share the device during a timed run (their
    warm-up calls still can). `waited_s` is the time spent waiting for the lock. Without a path it does nothing.

    With `after` (--lock-after N), a process first waits until N processes sharing the path have finished their
    warm-ups (each leaves a file `<path>.warm.<pid>`), at most `after_s` seconds: then none of them compiles on
    the CPU while another one times.
    """

    def __init__(self, path: Path | None, after: int = 0, after_s: float = 300.0) -> None:
        self.path = path
        self.after = after
        self.after_s = after_s
        self.waited_s = 0.0
        self._file: Any = None

    def hold(self) -> None:
        """Take the lock if it is not held yet (blocks until the other holder lets it go)."""
        if self.path is None or self._file is not None:
            return
        import fcntl  # POSIX only, like --lock

        start = time.perf_counter()
        if self.after > 1:
            Path(f"{self.path}.warm.{os.getpid()}").touch()
            while len(list(self.path.parent.glob(self.path.name + ".warm.*"))) < self.after:
                if time.perf_counter() - start > self.after_s:
                    break
                time.sleep(0.5)
        self._file = open(self.path, "a")  # noqa: SIM115 - held across calls, closed in release()
        fcntl.flock(self._file, fcntl.LOCK_EX)
        self.waited_s += time.perf_counter() - start

    def release(self) -> None:
        if self._file is not None:
            self._file.close()  # closing the file lets the lock go
            self._file = None

    def __enter__(self) -> TimingLock:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()
