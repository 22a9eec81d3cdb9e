"""Shared pytest setup: CPU-only, offline, deterministic; fixtures that build fresh tiny models."""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

# Offline before anything imports huggingface_hub/diffusers: nothing in the tests may download.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("DIFFUSERS_NO_ADVISORY_WARNINGS", "1")
# Inductor, before anything imports its config: the vector switch is read at import, and one value for the whole
# process keeps the C++ it writes and the flags it builds with in step. Set only inside one test, a process whose
# vector-ISA list was already cached wrote vector code under the switch-off cache key, and the next process that hit
# that entry built it without the vector headers (CI, 2026-11-29). Off, the C++ is a fifth smaller and compiles in two
# thirds of the time (GPU users get triton kernels, never this C++). The cache lives in the checkout (a clean
# checkout starts empty), never in a /tmp shared with other runs.
os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "0")
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path(__file__).resolve().parents[1] / ".cache" / "torchinductor"))

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pytest
import torch
from hypothesis import HealthCheck, settings

import tiny_models

torch.set_grad_enabled(True)  # the helpers use no_grad themselves; tests must not depend on a global switch
torch.manual_seed(0)
# One intra-op thread: the tiny models gain nothing from more, and spinning OpenMP threads slow the suite down
# many times over when the 2 cores are shared with other work.
torch.set_num_threads(1)


def _einops_ops_as_the_webuis_get_them() -> None:
    """torch.compile puts einops' `rearrange` & co. into a graph as single ops for the einops the WebUIs pin
    (AUTOMATIC1111 and Forge: 0.4.1; torch._dynamo.decorators._allow_in_graph_einops), and traces einops 0.8.2 (the
    one that installs here) through its pattern parser on every call: 85% of the bytecode dynamo steps through to
    compile the ldm UNet, about twice its trace time. The ldm UNet's attention is the model's code, not ours."""
    import einops

    for op in (einops.rearrange, einops.repeat, einops.reduce, einops.einsum):
        torch._dynamo.allow_in_graph(op)


_einops_ops_as_the_webuis_get_them()

#: The C library where this Python runs on glibc (its `mallopt` set below, its `malloc` in the test of what that
#: setting does), else None.
LIBC = (
    ctypes.CDLL(ctypes.util.find_library("c"))
    if "CS_GNU_LIBC_VERSION" in os.confstr_names and os.confstr("CS_GNU_LIBC_VERSION")
    else None
)


def _keep_freed_memory_for_reuse() -> None:
    """glibc hands every block over its threshold (a few MiB, growing with what was freed) back to the kernel when it
    is freed, and the next tensor of that size faults in and zeroes fresh pages: one call of the SD1.5 stand-in at
    512 px took 1.5 s of system time for its 500,000 page faults besides 12 s computing. Kept in the process (blocks
    up to 2 GiB from the heap, no trimming), the next call reuses them: no faults. The price is memory: a worker
    keeps its peak, and the heap's holes raise it (the stand-in and GPU-budget modules in one process: 4.2 -> 5.5 GB,
    system time 47 -> 19 s), well inside CI's 24 GiB for two workers. Other C libraries: nothing to do."""
    if LIBC is None:
        return
    mallopt = LIBC.mallopt
    m_trim_threshold, m_mmap_threshold = -1, -3  # malloc.h
    for param in (m_trim_threshold, m_mmap_threshold):
        if not mallopt(param, 2**31 - 1):
            raise RuntimeError(f"mallopt({param}) refused")


_keep_freed_memory_for_reuse()

# Hypothesis: no deadline (CPU timing is noisy on 2 shared cores); derandomised on CI so runs are repeatable.
settings.register_profile("default", max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(
    "ci",
    max_examples=50,
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "default"))


@pytest.fixture(autouse=True)
def _no_global_hooks_leak() -> Iterator[None]:
    """No test may leave a global module hook behind (the core must only use per-instance hooks)."""
    from torch.nn.modules import module as nn_module

    names = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks")
    before = {n: len(getattr(nn_module, n, {})) for n in names}
    yield
    after = {n: len(getattr(nn_module, n, {})) for n in names}
    assert after == before, f"global module hooks changed: {before} -> {after}"


@pytest.fixture
def fresh_dynamo() -> Iterator[None]:
    """For a test that traces with torch.compile: dynamo's caches are global and keyed by code objects every tiny
    model of a kind shares (and past the recompile limit dynamo would fall back to eager), so each such test traces
    its own model from a reset.

    Dynamo keeps some of what a trace made past the reset (a stack summary per traced operation; after a
    fail_on_recompile error the graphs themselves): some 50,000 objects a test, which every full collection of
    Python's garbage collector then walks. Frozen, it walks them no more (a bench test took 12.8 CPU-s after the
    core compile tests, 4.9 s with this)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
    gc.collect()
    gc.freeze()


@pytest.fixture
def build() -> Callable[..., torch.nn.Module]:
    """Factory for fresh, seeded tiny UNets: build(kind, seed=0). Fresh per call, so patches never leak."""
    return tiny_models.build_unet


def pytest_collection_finish(session: pytest.Session) -> None:
    # What the imports made lives to the end (torch, diffusers, gradio: some 300,000 objects): out of the garbage
    # collector's way, so that its full collections walk only what the tests make.
    gc.collect()
    gc.freeze()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # pytest-xdist hands the tests out one at a time in this order (after the groups): the ones that trace with
    # torch.compile (5-45 s each) first, so that no worker is still running one at the end while the other has
    # nothing left (make test, 2026-11-28: the SD.Next compile tests, last by name, kept one worker busy for a
    # minute after the other had finished). Every worker sorts the same collection the same way.
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=lambda item: "fresh_dynamo" not in getattr(item, "fixturenames", ()))


def pytest_configure(config: pytest.Config) -> None:
    # Registered here too so that --strict-markers accepts the mark below when pytest-xdist is not installed.
    config.addinivalue_line("markers", "xdist_group(name): run these tests in one pytest-xdist worker")
