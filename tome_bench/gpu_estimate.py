"""What one UNet call costs on a GPU, estimated on a CPU: host operations and GPU work from a meta-device trace.

A user with a GPU pays for two things that a CPU timing hides:

* **Host operations.** Eager, a fast GPU finishes most kernels sooner than Python dispatches the next, so below
  2048 px a call's wall clock follows the number of operations that launch a kernel.
* **GPU work.** The sum of the kernels' times: what a call costs where the GPU is the bottleneck (CUDA graphs, a
  consumer card, large images). Every kernel takes at least a few microseconds, so many small merge kernels can
  eat what a smaller attention saves.

`trace(fn)` runs `fn` (a UNet call on meta tensors: no memory, no arithmetic, seconds for SDXL) and records every
operation a GPU would run, with its FLOPs and the bytes it moves; SDPA is one fused kernel as on a GPU, views and
allocations run none. `estimate(ops, gpu)` prices each operation against a `GpuSpec` (a roofline: the larger of
FLOPs over throughput and bytes over bandwidth, plus a minimum time per kernel), calibrated against the kernel
profiles in docs/runs (`calibration_points`). Imports torch only.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch.multiprocessing.reductions import StorageWeakRef
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry, sdpa_flop_count

from tome_bench.ops import ALLOC_OPS, VIEW_OPS, op_name

#: Views that the decomposed (no-grad) trace sees on top of `ops.VIEW_OPS`: no kernel runs.
_MORE_VIEWS = frozenset({"_unsafe_view", "t", "split_with_sizes", "split", "chunk", "_reshape_alias", "lift_fresh"})
#: Operations that only set metadata or make nothing (a factory's allocation is in ALLOC_OPS).
_NO_KERNEL = frozenset({"set_", "resize_", "_local_scalar_dense_meta", "sym_size", "sym_stride", "sym_numel"})

#: The kind of each operation the cost model prices differently; anything else is "memory" (elementwise,
#: bandwidth-bound).
KIND: Mapping[str, str] = {
    **dict.fromkeys(("mm", "addmm", "bmm", "baddbmm"), "matmul"),
    **{"convolution": "conv", "attention": "attention", "avg_pool2d": "pool"},
    # The fused kernels that also return the log-sum-exp (tome_core.compat.attention_lse: each query's own key).
    **dict.fromkeys(("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention"), "attention"),
    **{"native_group_norm": "group_norm", "native_layer_norm": "layer_norm", "sort": "sort", "topk": "sort"},
    **dict.fromkeys(("index_select", "gather", "index"), "gather"),
    **dict.fromkeys(("index_add", "scatter", "scatter_add", "scatter_reduce", "index_put", "index_copy"), "scatter"),
    **dict.fromkeys(("max", "argmax", "sum", "mean", "linalg_vector_norm"), "reduce"),
}
#: Kinds priced by their arithmetic as well as their bytes.
COMPUTE_KINDS = ("matmul", "conv", "attention")
#: Every kind, in the order `GpuSpec` lists their rates.
KINDS = (*COMPUTE_KINDS, "memory", "group_norm", "layer_norm", "gather", "scatter", "sort", "reduce", "pool")


@dataclass(frozen=True)
class TracedOp:
    """One operation a GPU would run: its aten name, kind, FLOPs, bytes read and written, and kernels."""

    name: str
    kind: str
    flops: float
    bytes: float
    kernels: int = 1
    host: bool = True  # False: a second kernel of the operation before it (one dispatch on the host)


@dataclass
class Trace:
    """The operations of one traced call, in order, and the most memory its outputs held at once (`peak_bytes`:
    every tensor an operation of the call allocated, while alive; the weights and inputs not counted)."""

    ops: list[TracedOp] = field(default_factory=list)
    peak_bytes: float = 0.0

    @property
    def launching(self) -> int:
        """Operations that launch at least one kernel (the host's dispatch work)."""
        return sum(op.host for op in self.ops)

    @property
    def kernels(self) -> int:
        return sum(op.kernels for op in self.ops)

    @property
    def flops(self) -> float:
        return sum(op.flops for op in self.ops)

    def names(self) -> Counter[str]:
        return Counter(op.name for op in self.ops)


def _nbytes(t: Any) -> float:
    return float(t.numel() * t.element_size()) if isinstance(t, torch.Tensor) else 0.0


def _tensors(values: Iterable[Any]) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for v in values:
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            out.extend(x for x in v if isinstance(x, torch.Tensor))
    return out


def _bytes(name: str, args: tuple[Any, ...], kwargs: Mapping[str, Any], out: Any) -> float:
    """Bytes an operation reads and writes on a GPU (inputs once, outputs once; a gather reads what it writes)."""
    outs = _tensors([out])
    written = sum(_nbytes(t) for t in outs)
    if name in ("index_select", "gather", "index"):
        index = _tensors([a for a in args[1:]])
        return 2.0 * written + sum(_nbytes(t) for t in index)
    if name in ("index_add", "scatter", "scatter_add", "index_copy", "index_fill", "masked_fill", "index_put"):
        # In place: reads and writes the destination, reads the source and the index.
        return 2.0 * written + sum(_nbytes(t) for t in _tensors(args[1:]))
    read = 0.0
    for t in _tensors(list(args) + list(kwargs.values())):
        # A broadcast operand (stride 0) is read once; an expanded view's storage is what moves.
        read += float(t.untyped_storage().nbytes()) if t.numel() > 1 and 0 in t.stride() else _nbytes(t)
    return read + written


def _layer_norm(x: torch.Tensor, normalized: Sequence[int], *_: Any) -> tuple[torch.Tensor, ...]:
    stats = (*x.shape[: x.dim() - len(normalized)], *([1] * len(normalized)))
    wide = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    empty = functools.partial(torch.empty, device=x.device)
    return empty(x.shape, dtype=x.dtype), empty(stats, dtype=wide), empty(stats, dtype=wide)


def _mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.empty((a.shape[0], b.shape[1]), dtype=a.dtype, device=a.device)


def _addmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *_: Any, **__: Any) -> torch.Tensor:
    return _mm(a, b)


def _like(x: torch.Tensor, *_: Any, **__: Any) -> Any:
    """An elementwise operation's output for `x`: its layout where `x` is dense, contiguous where its strides already
    fall (a slice of the last dimension); anything else to the operation's own meta function."""
    if x.is_contiguous() or (x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last)):
        return torch.empty_like(x)
    if list(x.stride()) == sorted(x.stride(), reverse=True) and 0 not in x.stride():
        return torch.empty(x.shape, dtype=x.dtype, device=x.device)
    return NotImplemented


def _group_norm(x: torch.Tensor, weight: Any, bias: Any, n: int, c: int, hw: int, groups: int, *_: Any) -> Any:
    out = _like(x)
    return NotImplemented if out is NotImplemented else (out, x.new_empty((n, groups)), x.new_empty((n, groups)))


def _binary(a: torch.Tensor, b: Any, *_: Any, **__: Any) -> Any:
    """Two operands of one shape, dtype and layout, or a float tensor and a Python number: no broadcast, no
    promotion; or float operands of one dtype, each with the strides `torch.empty` gives its shape, broadcast to a
    shape with no size-1 dimension after the leading ones (the batch): contiguous (a size-1 dimension between others
    takes its stride from the meta function's tie-break)."""
    same = isinstance(b, torch.Tensor) and (b.shape, b.dtype, b.stride()) == (a.shape, a.dtype, a.stride())
    number = isinstance(b, (int, float)) and not isinstance(b, bool) and a.is_floating_point()
    if same or number:
        return _like(a)
    if not (isinstance(b, torch.Tensor) and b.dtype == a.dtype and b.device == a.device and a.is_floating_point()):
        return NotImplemented
    try:
        shape = torch.broadcast_shapes(a.shape, b.shape)
    except RuntimeError:
        return NotImplemented
    dense = all(t.stride() == torch.empty(t.shape, device="meta").stride() for t in (a, b))
    inner = list(itertools.dropwhile(lambda n: n == 1, shape))
    return torch.empty(shape, dtype=a.dtype, device=a.device) if dense and 1 not in inner else NotImplemented


def _integer(a: torch.Tensor, b: Any, *_: Any, **__: Any) -> Any:
    """`_binary`, or an integer tensor and a Python int (a sum or product: the tensor's dtype)."""
    if isinstance(b, int) and not isinstance(b, bool) and not (a.is_floating_point() or a.is_complex()):
        return _like(a) if a.dtype != torch.bool else NotImplemented
    return _binary(a, b)


def _float_like(x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    """One float tensor's elementwise operation, its other arguments Python numbers (or None): `_like`."""
    numbers = all(v is None or type(v) in (int, float) for v in (*args, *kwargs.values()))
    return _like(x) if numbers and x.is_floating_point() else NotImplemented


def _mean(x: torch.Tensor, dim: Any, keepdim: bool = False, *, dtype: Any = None) -> Any:
    """A contiguous float tensor's mean over `dim` (not over every dimension, not in another dtype): contiguous."""
    if dtype is not None or not x.is_floating_point() or not dim or x.dim() == 0 or not x.is_contiguous():
        return NotImplemented
    dims = {d % x.dim() for d in ([dim] if isinstance(dim, int) else dim)}
    shape = [1 if i in dims else n for i, n in enumerate(x.shape) if keepdim or i not in dims]
    return torch.empty(shape, dtype=x.dtype, device=x.device)


def _rms_norm(x: torch.Tensor, normalized_shape: Any, weight: Any = None, eps: Any = None) -> Any:
    """A fused RMS norm's output for a contiguous input (and a weight, if any, of its dtype): contiguous, its dtype."""
    plain = x.is_contiguous() and (weight is None or weight.dtype == x.dtype)
    return torch.empty_like(x) if plain else NotImplemented


def _attention(q: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """A fused attention kernel's output: written [B, L, H, D], returned as a [B, H, L, D] view."""
    shape = (*q.shape[:-3], q.shape[-2], q.shape[-3], v.shape[-1])
    return torch.empty(shape, dtype=q.dtype, device=q.device).transpose(-3, -2)


#: Outputs of the operations whose meta functions are slow Python (with them, an SDXL call's trace took twice the
#: time), made directly on the meta device with the shapes, dtypes and layouts those give, for the plain cases
#: (other cases go to the meta function): the same trace, op for op (tests/test_gpu_budget.py traces with and
#: without them).
_META_OUTPUTS: dict[Any, Callable[..., Any]] = {
    F.scaled_dot_product_attention: _attention,
    torch.ops.aten.native_layer_norm.default: _layer_norm,
    torch.ops.aten.addmm.default: _addmm,
    torch.ops.aten.mm.default: _mm,
    torch.ops.aten.native_group_norm.default: _group_norm,
    torch.ops.aten.gelu.default: _like,
    torch.ops.aten.silu.default: _like,
    torch.ops.aten.add.Tensor: _integer,
    torch.ops.aten.mul.Tensor: _integer,
    torch.ops.aten.div.Tensor: _binary,
    torch.ops.aten.neg.default: _float_like,
    torch.ops.aten.rsqrt.default: _float_like,
    torch.ops.aten.pow.Tensor_Scalar: _float_like,
    torch.ops.aten.clamp.default: _float_like,
    torch.ops.aten.mean.dim: _mean,
    F.rms_norm: _rms_norm,
}


class _Record(TorchDispatchMode):
    def __init__(self, trace: Trace) -> None:
        super().__init__()
        self.trace = trace
        self.muted = 0
        self.live: dict[int, tuple[StorageWeakRef, float]] = {}  # storage -> its bytes, while a tensor holds it
        self.held = 0.0  # their sum

    def allocated(self, out: Any, inputs: Iterable[Any]) -> None:
        """Count `out`'s storages that are new (not an input's: a view or an in-place result is not), after letting
        go of those no tensor holds any more, into the trace's `peak_bytes`. They are swept out of `held` only when
        it passes the peak, as the peak cannot rise before (a sweep at every operation took a sixth of a trace)."""
        given = {StorageWeakRef(t.untyped_storage()).cdata for t in _tensors(list(inputs))}
        for t in _tensors([out]):
            ref = StorageWeakRef(t.untyped_storage())
            if ref.cdata in given:
                continue
            before = self.live.get(ref.cdata)
            if before is not None:
                if not before[0].expired():
                    continue
                self.held -= before[1]
            size = float(t.untyped_storage().nbytes())
            self.live[ref.cdata] = (ref, size)
            self.held += size
        if self.held > self.trace.peak_bytes:
            for key, (ref, size) in list(self.live.items()):
                if ref.expired():
                    del self.live[key]
                    self.held -= size
            self.trace.peak_bytes = max(self.trace.peak_bytes, self.held)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        fast = _META_OUTPUTS.get(func)
        out = NotImplemented
        if fast is not None and isinstance(args[0], torch.Tensor) and args[0].device.type == "meta":
            out = fast(*args, **kwargs)
        if out is NotImplemented:
            out = func(*args, **kwargs)
        if self.muted:
            return out
        self.allocated(out, [*args, *kwargs.values()])
        name = op_name(func)
        if name in VIEW_OPS or name in _MORE_VIEWS or name in ALLOC_OPS or name in _NO_KERNEL:
            return out
        if name in ("copy", "_to_copy", "clone", "contiguous") and _is_noop_copy(name, args, out):
            return out
        kind = KIND.get(name, "memory")
        # FLOPs as FlopCounterMode counts them (matrix products, convolutions); 0 for the rest, priced by bytes.
        formula = flop_registry.get(func.overloadpacket)
        flops = 0.0 if formula is None else float(formula(*args, **kwargs, out_val=out))
        self.trace.ops.append(TracedOp(name, kind, flops, _bytes(name, args, kwargs, out)))
        if name == "convolution" and len(args) > 2 and args[2] is not None:
            # cuDNN convolves, then adds the bias in a kernel of its own that reads and writes the whole output.
            self.trace.ops.append(TracedOp("conv_bias", "memory", 0.0, 2.0 * _nbytes(out), host=False))
        return out


def _is_noop_copy(name: str, args: tuple[Any, ...], out: Any) -> bool:
    return name == "copy" and isinstance(out, torch.Tensor) and args and args[0] is args[1]


class _Fused(TorchFunctionMode):
    """The operations a GPU runs as one fused kernel where the meta device decomposes them: SDPA (flash, cuDNN or
    memory-efficient), not its math; `rms_norm` (torch.nn.RMSNorm, F.rms_norm: one `_fused_rms_norm` kernel on CUDA in
    torch 2.13), not the eight casts and elementwise operations the meta device runs. A model that writes its RMS norm
    out itself (diffusers' own RMSNorm) launches those operations on a GPU too, and is counted as it runs."""

    def __init__(self, record: _Record) -> None:
        super().__init__()
        self.record = record

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is F.rms_norm:
            return self.rms_norm(func, args, kwargs)
        if func is not F.scaled_dot_product_attention:
            return func(*args, **kwargs)
        names = ("query", "key", "value")
        args = (*args, *(kwargs.pop(n) for n in names[len(args) : 3]))  # diffusers passes them by keyword
        q, k, v = args[:3]
        self.record.muted += 1
        try:
            # The fused kernels write [B, L, H, D] and return it as a [B, H, L, D] view: transposing back (as
            # diffusers and ldm do) is then free, where the math path's contiguous output would need a copy. On the
            # meta device: that output alone, not the math path's decomposition.
            fast = _META_OUTPUTS.get(func) if q.device.type == "meta" and q.dim() >= 3 else None
            if fast is not None:
                out = fast(q, v)
            else:
                mask = kwargs.get("attn_mask")
                if isinstance(mask, torch.Tensor) and mask.device != q.device:
                    kwargs["attn_mask"] = mask.to(q.device)  # a mask a model reads back, made on the CPU
                out = func(*args, **kwargs).transpose(-3, -2).contiguous().transpose(-3, -2)
        finally:
            self.record.muted -= 1
        if not self.record.muted:
            self.record.allocated(out, args)
            flops = float(sdpa_flop_count(q.shape, k.shape, v.shape))
            moved = sum(_nbytes(t) for t in (q, k, v, out))
            self.record.trace.ops.append(TracedOp("attention", "attention", flops, moved))
        return out

    def rms_norm(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """One kernel that reads the input (and weight) and writes the output, in the input's dtype."""
        fast = _META_OUTPUTS.get(func) if args and args[0].device.type == "meta" else None
        out = NotImplemented if fast is None else fast(*args, **kwargs)
        if out is NotImplemented:
            self.record.muted += 1
            try:
                out = func(*args, **kwargs)
            finally:
                self.record.muted -= 1
        if not self.record.muted:
            self.record.allocated(out, args)
            weight = args[2] if len(args) > 2 else kwargs.get("weight")
            moved = sum(_nbytes(t) for t in (args[0], weight, out))
            self.record.trace.ops.append(TracedOp("rms_norm", "layer_norm", 0.0, moved))
        return out


def trace(fn: Callable[[], Any], record_ops: bool = True) -> tuple[Trace, Any]:
    """Run `fn()` (on meta tensors: nothing is computed) and record what a GPU would run: (trace, fn's result).
    `record_ops` False: the same call with the same outputs, recording nothing (a warm-up call; an empty trace).

    Runs under `no_grad`, not `inference_mode`, so that composite operations (linear, layer_norm, ...) reach the
    recorder as the kernels they run (addmm, native_layer_norm, ...).
    """
    result_trace = Trace()
    record = _Record(result_trace)
    record.muted = 0 if record_ops else 1
    with torch.no_grad(), _Fused(record), record:
        result = fn()
    return result_trace, result


# ---------------------------------------------------------------------------------------------- the cost model


@dataclass(frozen=True)
class GpuSpec:
    """What a GPU achieves per kind of operation (fp16): the cost model's parameters.

    An operation of a compute kind takes FLOPs / `tflops[kind]` + bytes / `gbs[kind]`, any other bytes /
    `gbs[kind]`, and every kernel adds `kernel_us` (a kernel's minimum time on the GPU: the profile's kernel
    duration, not the host's launch). Adding rather than taking the larger of the two makes small matrix products
    slower per FLOP than large ones, as they are.
    """

    name: str
    tflops: Mapping[str, float]  # "matmul", "conv", "attention"
    gbs: Mapping[str, float]  # every kind in KINDS
    kernel_us: float
    source: str = ""
    #: The date of the profiles it was fitted to.
    fitted: str = ""
    #: The host's time per kernel-launching operation in an eager call: Python and PyTorch's dispatch, before the
    #: kernel reaches the GPU (`host_us_of`). A call whose launches take longer than its kernels waits on the host.
    host_us: float = 0.0

    def op_ms(self, op: TracedOp) -> float:
        t = op.bytes / (self.gbs.get(op.kind, self.gbs["memory"]) * 1e9)
        rate = self.tflops.get(op.kind)
        if rate is not None:
            t += op.flops / (rate * 1e12)
        return 1e3 * t + op.kernels * self.kernel_us * 1e-3

    def params(self) -> dict[str, float]:
        """The fitted values by name ("tflops.matmul", "gbs.memory", "kernel_us")."""
        out = {f"tflops.{k}": v for k, v in self.tflops.items()}
        out.update({f"gbs.{k}": v for k, v in self.gbs.items()})
        out["kernel_us"] = self.kernel_us
        return out

    def with_params(self, values: Mapping[str, float], source: str | None = None) -> GpuSpec:
        tflops, gbs, kernel_us = dict(self.tflops), dict(self.gbs), self.kernel_us
        for key, value in values.items():
            if key == "kernel_us":
                kernel_us = value
            else:
                table, kind = key.split(".", 1)
                (tflops if table == "tflops" else gbs)[kind] = value
        return dataclasses.replace(self, tflops=tflops, gbs=gbs, kernel_us=kernel_us, source=source or self.source)


@dataclass(frozen=True)
class Estimate:
    """One call on one GPU: estimated GPU work (sum of kernel times), kernels and launching operations."""

    gpu_ms: float
    kernels: int
    launching: int
    flops: float
    by_kind: Mapping[str, float]
    peak_bytes: float = 0.0


def estimate(tr: Trace, gpu: GpuSpec) -> Estimate:
    by_kind: Counter[str] = Counter()
    for op in tr.ops:
        by_kind[op.kind] += gpu.op_ms(op)
    return Estimate(sum(by_kind.values()), tr.kernels, tr.launching, tr.flops, dict(by_kind), tr.peak_bytes)


#: The GPUs the estimate knows, each fitted to the kernel profiles named in its `source`
#: (`python -m tome_bench.calibrate --fit PROFILE...`; the error per profiled call is in docs/benchmarks.md).
GPUS: Mapping[str, GpuSpec] = {
    "h200": GpuSpec(
        name="NVIDIA H200",
        tflops={"matmul": 1679.0, "conv": 626.2, "attention": 338.6},
        gbs=dict(zip(KINDS, (2539.0, 631.5, 5843.0, 2398.0, 326.1, 1746.0, 1795.0, 572.7, 8.2, 1967.0, 687.8))),
        kernel_us=3.34,
        host_us=7.86,
        source="docs/runs/2026-11-27-h200/gpu.json (fp16, eager, SD1.5 at 512/768/1024 and SDXL at 1024/1536 px, the"
        " presets, references and candidates of the --gpu-job run, disturbed and tomesd rows left out: 51 calls,"
        " median error 5.1%, max 9.1%)",
        fitted="2026-11-27",
    ),
    "h100": GpuSpec(
        name="NVIDIA H100",
        tflops={"matmul": 1445.0, "conv": 626.0, "attention": 338.6},
        gbs=dict(zip(KINDS, (2604.0, 557.0, 2241.0, 2116.0, 300.0, 1360.0, 2791.0, 446.0, 8.2, 1244.0, 779.0))),
        kernel_us=2.90,
        source="docs/runs/2026-11-26-h100-e/eager.json (fp16, eager, SD1.5 at 512/768/1024 and SDXL at 1024 px, the"
        " presets of 2026-11-26 fifth session, 20 calls; median error 5.2%, max 10.3%; kinds the run barely had"
        " (gather, scatter, sort, reduce) keep the H200 fit's values)",
        fitted="2026-11-26",
    ),
}


# ---------------------------------------------------------------------------------------------- per preset

#: Where an eager call's launches hide behind its GPU work: the host's launch time at most this share of the GPU
#: time (host and GPU overlap imperfectly: a call starts on the host alone, and syncs make the GPU wait).
HIDDEN = 0.8


@dataclass(frozen=True)
class EstimateRow:
    """One variant of one call (arch, size) on one GPU, against the unpatched UNet."""

    arch: str
    size: int
    variant: str
    gpu: str
    gpu_ms: float
    base_gpu_ms: float
    launching: int
    base_launching: int
    kernels: int
    flops: float
    base_flops: float
    peak_bytes: float = 0.0  # the most memory the call's own tensors held at once (`Trace.peak_bytes`)
    base_peak_bytes: float = 0.0
    host_us: float = 0.0  # the GPU's host time per launching operation (`GpuSpec.host_us`)
    share: float = 1.0  # of a generation's steps this call stands for (a step window's): the others run unpatched

    @property
    def host_ms(self) -> float:
        """The host's time to launch this call's operations eagerly (launching operations x `host_us`)."""
        return self.launching * self.host_us * 1e-3

    @property
    def hidden(self) -> bool:
        """Whether the GPU hides the host's launches (`HIDDEN`): then the launching operations a patch adds cost no
        time in an eager call, whatever their share; else they add to its wall clock."""
        return self.host_ms <= HIDDEN * self.gpu_ms

    @property
    def peak_ratio(self) -> float:
        """Peak memory of the call's tensors over the unpatched call's (estimated from the meta trace)."""
        return self.peak_bytes / self.base_peak_bytes if self.base_peak_bytes else 1.0

    @property
    def speedup(self) -> float:
        """Estimated GPU work of the unpatched call over this one's, over a generation where the patch reduces only
        `share` of the steps."""
        return self.base_gpu_ms / (self.share * self.gpu_ms + (1 - self.share) * self.base_gpu_ms)

    @property
    def ops_added(self) -> float:
        """Kernel-launching operations added, as a share of the unpatched call's (0.05 = +5%)."""
        return self.launching / self.base_launching - 1.0

    @property
    def flops_saved(self) -> float:
        return self.base_flops / self.flops


def meta_unet(arch: str, dtype: torch.dtype = torch.float16) -> torch.nn.Module:
    """The architecture's diffusers UNet on the meta device: no weights, nothing computed, seconds to build."""
    from diffusers import UNet2DConditionModel

    from tome_bench import archs

    with torch.device("meta"):
        unet = UNet2DConditionModel(**archs.get_arch(arch).config)
    return unet.to(dtype).eval().requires_grad_(False)


def trace_call(
    unet: torch.nn.Module,
    arch: str,
    size: int,
    apply: Callable[[torch.nn.Module], Any] | None = None,
    batch: int | None = None,
    remove: Callable[[torch.nn.Module], Any] | None = None,
) -> Trace:
    """The meta trace of one steady-state call of `unet` (`apply` patches it first, `remove` undoes that; default
    `tome_core.remove_patch`): the second call, as the first builds what a patch keeps per grid."""
    from tome_bench import archs

    if remove is None:
        from tome_core import remove_patch as remove
    batch = archs.get_arch(arch).batch if batch is None else batch
    args, kwargs = archs.make_inputs(arch, size, batch=batch, dtype=torch.float16, device="meta")
    if apply is None:
        return trace(lambda: unet(*args, **kwargs))[0]
    apply(unet)
    try:
        trace(lambda: unet(*args, **kwargs), record_ops=False)
        tr, _ = trace(lambda: unet(*args, **kwargs))
    finally:
        remove(unet)
    return tr


def estimate_rows(
    arch: str,
    sizes: Iterable[int],
    variants: Mapping[str, Callable[[torch.nn.Module], Any]],
    gpus: Iterable[str] = ("h200",),
    batch: int | None = None,
    remove: Mapping[str, Callable[[torch.nn.Module], Any]] | None = None,
) -> list[EstimateRow]:
    """Every variant (name -> what patches a UNet) at every size, estimated on every GPU, beside the unpatched UNet.

    A few seconds per call traced (SDXL included): no weights, no arithmetic."""
    unet = meta_unet(arch)
    rows = []
    for size in sizes:
        base = trace_call(unet, arch, size, batch=batch)
        traces = {
            name: trace_call(unet, arch, size, apply, batch, (remove or {}).get(name))
            for name, apply in variants.items()
        }
        for gpu_name in gpus:
            gpu = GPUS[gpu_name]
            eb = estimate(base, gpu)
            for name, tr in traces.items():
                e = estimate(tr, gpu)
                figures = (e.gpu_ms, eb.gpu_ms, e.launching, eb.launching, e.kernels, e.flops, eb.flops)
                rows.append(EstimateRow(arch, size, name, gpu_name, *figures, e.peak_bytes, eb.peak_bytes, gpu.host_us))
    return rows
