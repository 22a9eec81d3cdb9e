"""Counting the aten operations a call dispatches: what a GPU would launch, and where it would stop to sync.

On a GPU every operation that computes launches at least one kernel (several microseconds of CPU time each),
and an operation that reads a device value back to the host (`aten._local_scalar_dense`, `nonzero`, ...) stops
the CPU from queueing work ahead. Counting them on the CPU predicts that overhead without a GPU: `count_ops(fn)`
runs `fn` under a `TorchDispatchMode` and sorts every dispatched operation into views (no data touched),
factories without data (`empty`), host synchronisations, and kernel-launching operations (the rest).

It imports torch only, and `tome_bench/__init__.py` nothing, so the core's own tests (tests/test_core_lean.py)
count with it without loading the benchmark's command line, reports or peers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

#: Operations that only make a new view of existing storage (no kernel runs).
VIEW_OPS: frozenset[str] = frozenset(
    {
        "view",
        "_unsafe_view",
        "reshape",
        "expand",
        "select",
        "slice",
        "narrow",
        "transpose",
        "t",
        "permute",
        "unsqueeze",
        "squeeze",
        "as_strided",
        "alias",
        "detach",
        "unbind",
        "split",
        "split_with_sizes",
        "chunk",
        "unflatten",
        "flatten",
        "diagonal",
        "view_as",
        "expand_as",
        "lift_fresh",
        "_reshape_alias",
        "unfold",
    }
)
#: Factories that allocate without writing (no kernel runs).
ALLOC_OPS: frozenset[str] = frozenset({"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided"})
#: Operations that read a device value back to the host (or size an output by data): a GPU sync each.
SYNC_OPS: frozenset[str] = frozenset(
    {
        "_local_scalar_dense",
        "item",
        "nonzero",
        "nonzero_static",
        "masked_select",
        "unique",
        "_unique",
        "_unique2",
        "unique_consecutive",
        "unique_dim",
        "repeat_interleave",
        "equal",
        "is_nonzero",
        "allclose",
        "_assert_async",
        "tolist",
        "bincount",
        "histc",
    }
)


@dataclass
class OpCounts:
    """Operations dispatched while a call ran, by kind; `names` counts every operation by its aten name."""

    names: Counter[str] = field(default_factory=Counter)

    @property
    def total(self) -> int:
        return sum(self.names.values())

    @property
    def views(self) -> int:
        return sum(n for name, n in self.names.items() if name in VIEW_OPS)

    @property
    def syncs(self) -> int:
        return sum(n for name, n in self.names.items() if name in SYNC_OPS)

    @property
    def launching(self) -> int:
        """Operations that run a kernel: everything but views and allocations (syncs included)."""
        return sum(n for name, n in self.names.items() if name not in VIEW_OPS and name not in ALLOC_OPS)

    def sync_names(self) -> list[str]:
        return sorted(name for name in self.names if name in SYNC_OPS)

    def __sub__(self, other: OpCounts) -> OpCounts:
        diff = Counter(self.names)
        diff.subtract(other.names)
        return OpCounts(Counter({k: v for k, v in diff.items() if v}))


def op_name(func: Any) -> str:
    """`aten.index_add_.default` -> "index_add" (in-place and out variants count as the operation itself)."""
    name = func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else str(func)
    return name[:-1] if name.endswith("_") and not name.startswith("_") else name


class _Counting(TorchDispatchMode):
    def __init__(self, counts: OpCounts) -> None:
        super().__init__()
        self.counts = counts

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        self.counts.names[op_name(func)] += 1
        return func(*args, **(kwargs or {}))


def count_ops(fn: Callable[[], Any]) -> tuple[OpCounts, Any]:
    """Run `fn()` and count the aten operations it dispatched: (counts, fn's result)."""
    counts = OpCounts()
    with torch.inference_mode(), _Counting(counts):
        result = fn()
    return counts, result
