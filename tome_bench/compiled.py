"""--compile: every variant also runs through `torch.compile(unet, fullgraph=True)`, side by side with the eager ones.

A compiled twin of a variant applies the same patch to the same UNet and runs it through one compiled wrapper of
that UNet (made once per UNet). Its speed-up is over the compiled baseline; `speedup_vs_eager` is over the eager
baseline. Compiling happens in the warm-up rounds (the options force one, two in the CUDA-graph modes, whose second
call records the graph): `compile_s` is the first run's time less the median, `graphs` what dynamo compiled for the
variant in the warm-up, `recompiles` what it compiled during the timed runs (a patch that stays whole compiles once
per size and settings, then never again).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from tome_bench.options import Row

#: --compile's modes (torch.compile's `mode`; "default" is inductor's default).
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
#: Suffix of a compiled twin's variant name.
SUFFIX = "+compile"
#: Within this factor of the eager speed-up counts as keeping the saving under compile (issue 24's criterion).
KEEP_WITHIN = 0.10
#: The backend the compiled twins use (the tests swap in "eager": the same graphs, without inductor's code
#: generation).
BACKEND = "inductor"
#: Graphs dynamo may keep per code object: every variant and size is one (its default, 8, would send the later
#: ones back to eager without failing).
RECOMPILE_LIMIT = 256


@dataclass
class Compiled:
    """The compiled wrappers of the UNets a run benchmarks, one per UNet, and dynamo's limits raised for it."""

    mode: str
    wrappers: dict[int, nn.Module] = field(default_factory=dict)

    def __post_init__(self) -> None:
        import torch._dynamo

        torch._dynamo.config.recompile_limit = RECOMPILE_LIMIT
        torch._dynamo.config.accumulated_recompile_limit = RECOMPILE_LIMIT * 4

    def of(self, unet: nn.Module) -> nn.Module:
        wrapper = self.wrappers.get(id(unet))
        if wrapper is None:
            if BACKEND == "inductor":
                mode = None if self.mode == "default" else self.mode
                wrapper = torch.compile(unet, mode=mode, fullgraph=True, dynamic=False)
            else:
                wrapper = torch.compile(unet, backend=BACKEND, fullgraph=True, dynamic=False)
            self.wrappers[id(unet)] = wrapper
        return wrapper


#: --compile modes that run the graph as CUDA graphs (inductor says when it cannot, and runs it without).
CUDAGRAPH_MODES = ("reduce-overhead", "max-autotune")


def graphs_compiled() -> int:
    """Graphs dynamo has compiled in this process so far."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def cudagraph_skips() -> int:
    """Graphs inductor ran without CUDA graphs in this process so far (each logs "skipping cudagraphs due to ...")."""
    from torch._dynamo.utils import counters

    return int(counters["inductor"]["cudagraph_skips"])


@contextmanager
def counting(v: Any, warm: bool) -> Iterator[None]:
    """Add the graphs compiled inside to `v.graphs` (warm-up) or `v.recompiles` (a timed run), and the graphs
    inductor could not run as CUDA graphs to `v.cudagraph_skips`."""
    before, skips = graphs_compiled(), cudagraph_skips()
    try:
        yield
    finally:
        new = graphs_compiled() - before
        if warm:
            v.graphs += new
        else:
            v.recompiles += new
        v.cudagraph_skips += cudagraph_skips() - skips


def twin_name(kind: str) -> str:
    return kind + SUFFIX


def is_twin(kind: str) -> bool:
    return kind.endswith(SUFFIX)


def eager_name(kind: str) -> str:
    return kind[: -len(SUFFIX)] if is_twin(kind) else kind


def fill_rows(rows: Sequence[Row], variants: Sequence[Any]) -> None:
    """Give the compiled twins' rows their compile figures and the speed-up over the eager baseline; the twins'
    `speedup` is over the compiled baseline (make_row got it as their base)."""
    eager_base = next((v for v in variants if v.kind == "baseline"), None)
    base_median = statistics.median(eager_base.times) if eager_base is not None and eager_base.times else None
    for row, v in zip(rows, variants):
        if not getattr(v, "compiled", False):
            continue
        row.compiled = True
        row.graphs = v.graphs
        row.recompiles = v.recompiles
        row.cudagraph_skips = v.cudagraph_skips
        if row.median_s is not None and base_median is not None:
            row.speedup_vs_eager = base_median / row.median_s
        if row.median_s is not None and v.first_s is not None:
            row.compile_s = max(v.first_s - row.median_s, 0.0)


def checks(rows: Sequence[Row]) -> list[tuple[bool, str]]:
    """Per size: no compiled variant compiled again in its timed runs; each preset and configuration of ours
    keeps its eager speed-up within KEEP_WITHIN under compile, and runs faster compiled than eager."""
    out: list[tuple[bool, str]] = []
    by_key = {(r.arch, r.size, r.variant, r.ratio): r for r in rows}
    for r in rows:
        if not r.compiled or r.error is not None or r.median_s is None:
            continue
        where = f"{r.arch} {r.size}px {eager_name(r.variant)}" + ("" if r.ratio is None else f" r={r.ratio:g}")
        out.append(
            (
                r.recompiles == 0,
                f"{where} compiled: {r.graphs} graph(s) in the warm-up, {r.recompiles} in the timed runs",
            )
        )
        eager = by_key.get((r.arch, r.size, eager_name(r.variant), r.ratio))
        if eager is None or eager.speedup is None or eager.median_s is None or r.variant.startswith("baseline"):
            continue
        kept = r.speedup is not None and r.speedup >= eager.speedup * (1 - KEEP_WITHIN)
        out.append(
            (
                kept,
                f"{where}: {r.speedup:.2f}x over the compiled baseline, {eager.speedup:.2f}x eager over eager"
                f" (within {KEEP_WITHIN:.0%}: {'yes' if kept else 'NO'})",
            )
        )
        faster = r.median_s < eager.median_s
        out.append(
            (
                faster,
                f"{where}: compiled {r.median_s:.3g} s against eager {eager.median_s:.3g} s"
                f" ({'faster' if faster else 'NOT faster'})",
            )
        )
    return out


def format_table(rows: Sequence[Row], mode: str | None = None) -> str:
    """The compiled twins beside their eager variants: speed-ups, compile time, graphs and recompiles (and, for a
    mode that uses CUDA graphs, how many graphs inductor ran without them)."""
    graphs_mode = mode in CUDAGRAPH_MODES
    header = [
        "arch",
        "size",
        "variant",
        "ratio",
        "eager speed-up",
        "compiled speed-up",
        "compiled vs eager baseline",
        "compile s",
        "graphs",
        "recompiles",
        *(["cudagraph skips"] if graphs_mode else []),
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * 4 + "---:|" * (len(header) - 4)]
    by_key = {(r.arch, r.size, r.variant, r.ratio): r for r in rows}
    for r in rows:
        if not r.compiled:
            continue
        eager = by_key.get((r.arch, r.size, eager_name(r.variant), r.ratio))

        def x(value: float | None) -> str:
            return "-" if value is None else f"{value:.2f}x"

        cells = [r.arch, r.size, eager_name(r.variant), "-" if r.ratio is None else f"{r.ratio:g}"]
        if r.error is not None:
            cells += ["-", "error: " + r.error.replace("|", "/"), "-", "-", "-", "-"]
            cells += ["-"] if graphs_mode else []
        else:
            cells += [
                x(eager.speedup if eager is not None else None),
                x(r.speedup),
                x(r.speedup_vs_eager),
                "-" if r.compile_s is None else f"{r.compile_s:.1f}",
                str(r.graphs),
                str(r.recompiles),
                *([str(r.cudagraph_skips)] if graphs_mode else []),
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def twins(variants: Sequence[Any], make: Callable[[Any], Any]) -> list[Any]:
    """`variants` followed by a compiled twin of each (tomesd's patch breaks the graph: no twin)."""
    return [*variants, *(make(v) for v in variants if not v.kind.startswith("tomesd"))]
