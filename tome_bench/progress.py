"""Progress of a per-call run: a line per UNet call and per other task, with the time elapsed and an estimate of
the time left from the first call on.

A bar over calls alone misleads: one SDXL call costs several SD1.5 calls, and building a UNet or tracing the GPU
estimate is no call at all. So the plan is known up front (`plan_calls`, `plan_task`) and the estimate weighs it:

* the calls of one architecture and size (a group) cost what that group's calls cost so far; before its first call,
  its unpatched call's FLOPs (`call_flops`, a meta-device trace: no weights, a second) times the seconds per FLOP
  of the calls done so far;
* a task costs its guess, scaled by how the finished tasks of its kind compared with their guesses.

Until the first call has finished nothing says how fast this machine is, and the line says so. The lines go to
stderr, as plain lines: `make bench` piped to a file or a CI log reads as well as a terminal.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TextIO

import torch


@dataclass
class _Group:
    """The UNet calls of one architecture and size."""

    calls: int
    flops: float
    done: int = 0
    seconds: float = 0.0
    #: The first call's seconds: it pays one-time costs (on CUDA the context and cuDNN: seconds, against
    #: milliseconds per call after it), so once later calls are done they price the rest without it.
    first_s: float | None = None

    def steady(self) -> tuple[float, int]:
        """(seconds, calls) of the calls done, the first left out once there are others."""
        if self.done > 1 and self.first_s is not None:
            return self.seconds - self.first_s, self.done - 1
        return self.seconds, self.done


@dataclass
class _Task:
    """Work other than a timed call (building a UNet, tracing the GPU estimate): a first guess of its seconds."""

    kind: str
    guess_s: float
    seconds: float | None = None


def clock_text(seconds: float) -> str:
    """62.4 -> '1:02'; 3725 -> '1:02:05'."""
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class Progress:
    """The lines and the estimate; `set_postfix_str` and `update` are what `run.bench_size` calls around each call
    (the names of tqdm's, which the tests' stand-ins also have)."""

    def __init__(self, stream: TextIO | None = None, clock: Callable[[], float] = time.perf_counter) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.clock = clock
        self.started = clock()
        self.groups: dict[str, _Group] = {}
        self.tasks: dict[str, _Task] = {}
        self.group_key: str | None = None
        self.what = ""
        self.call_started: float | None = None

    # ------------------------------------------------------------------------------------------ the plan

    def plan_calls(self, key: str, calls: int, flops: float) -> None:
        """`calls` UNet calls under `key` ('sd15 512 px'), each costing about what `flops` FLOPs cost."""
        self.groups[key] = _Group(calls, flops)

    def plan_task(self, key: str, kind: str, guess_s: float) -> None:
        self.tasks[key] = _Task(kind, guess_s)

    @property
    def total_calls(self) -> int:
        return sum(g.calls for g in self.groups.values())

    @property
    def done_calls(self) -> int:
        return sum(g.done for g in self.groups.values())

    # ------------------------------------------------------------------------------------------ the estimate

    def _per_flop(self) -> float | None:
        steady = [(g.steady(), g.flops) for g in self.groups.values() if g.done]
        flops = sum(calls * f for (_, calls), f in steady)
        return sum(seconds for (seconds, _), _ in steady) / flops if flops > 0 else None

    def left_s(self) -> float | None:
        """Seconds of planned work left, or None before the first of the planned calls has finished (a plan of
        tasks only, the GPU estimate alone, goes by the tasks' guesses)."""
        per_flop = self._per_flop()
        if per_flop is None and any(g.calls for g in self.groups.values()):
            return None
        left = 0.0
        for g in self.groups.values():
            seconds, calls = g.steady()
            per_call = seconds / calls if calls else (per_flop or 0.0) * g.flops
            left += per_call * (g.calls - g.done)
        for task in self.tasks.values():
            if task.seconds is None:
                left += task.guess_s * self._task_scale(task.kind)
        return left

    def _task_scale(self, kind: str) -> float:
        done = [t for t in self.tasks.values() if t.kind == kind and t.seconds is not None and t.guess_s > 0]
        guessed = sum(t.guess_s for t in done)
        return sum(t.seconds or 0.0 for t in done) / guessed if guessed > 0 else 1.0

    def status(self) -> str:
        """'1:23 elapsed, about 8:10 left (ends about 19:58)', or before the first call 'the time left is known
        after the first call'."""
        elapsed = self.clock() - self.started
        left = self.left_s()
        if left is None:
            return f"{clock_text(elapsed)} elapsed; the time left is known after the first call"
        ends = time.strftime("%H:%M", time.localtime(time.time() + left))
        return f"{clock_text(elapsed)} elapsed, about {clock_text(left)} left (ends about {ends})"

    def say(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    # ------------------------------------------------------------------------------------------ calls

    def group(self, key: str) -> None:
        """The calls that follow belong to the group `key` (planned with `plan_calls`)."""
        self.group_key = key

    def set_postfix_str(self, text: str) -> None:
        """A call is about to run: what it is ('sd15 512px ours:preset=fast')."""
        self.what = text
        self.call_started = self.clock()

    def update(self, n: int = 1) -> None:
        """`n` calls have finished (n > 1: calls skipped after their variant failed, no time of their own)."""
        now = self.clock()
        seconds = 0.0 if self.call_started is None else now - self.call_started
        self.call_started = None
        if self.group_key is not None:
            group = self.groups[self.group_key]
            if group.first_s is None:
                group.first_s = seconds
            group.done += n
            group.seconds += seconds
        width = len(str(self.total_calls))
        self.say(f"[{self.done_calls:>{width}}/{self.total_calls}] {self.what}: {seconds:.1f} s | {self.status()}")

    # ------------------------------------------------------------------------------------------ tasks

    @contextmanager
    def task(self, key: str, text: str) -> Iterator[None]:
        """Time the planned task `key`, saying `text` as it starts and what it took when it ends."""
        self.say(f"{text} ...")
        start = self.clock()
        yield
        seconds = self.clock() - start
        if key in self.tasks:
            self.tasks[key].seconds = seconds
        self.say(f"{text}: {seconds:.1f} s | {self.status()}")


def call_flops(arch: str, size: tuple[int, int]) -> tuple[float, float]:
    """(FLOPs, seconds the trace took) of one unpatched UNet call (batch 2) of `arch` at `size` (height, width),
    from a trace on the meta device: the relative cost of a group's calls, and how long one trace of this
    architecture takes (what the GPU estimate's traces will)."""
    from tome_bench import archs, gpu_estimate

    start = time.perf_counter()
    unet = gpu_estimate.meta_unet(arch)
    height, width = size
    args, kwargs = archs.make_inputs(arch, height, width, dtype=torch.float16, device="meta")
    trace, _ = gpu_estimate.trace(lambda: unet(*args, **kwargs))
    return trace.flops, time.perf_counter() - start
