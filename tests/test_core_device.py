"""Hazards of a patched call on a GPU that a CPU can still catch.

* The random-partition key must not depend on the timestep's dtype (an fp16 timestep x 1000 overflows).
* A host timestep must reach the device without a blocking copy (on CUDA a blocking copy waits for the stream),
  and nothing may be read back. The CPU has one device only, so the key is derived for the `meta` device, which
  any build has, and the copies it issues are recorded with a `TorchDispatchMode`.
* A low-precision merge must not convert its count tensor on every call.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import tome_core
from tome_core import patch
from tome_core.merge import grid_layout, match, partition, plan, random2d_slots

from tiny_models import Inputs, build_unet, forward, make_inputs

TIMESTEP_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int64)


@dataclasses.dataclass(frozen=True)
class _Copy:
    src: torch.device
    dst: torch.device
    src_dtype: torch.dtype
    dst_dtype: torch.dtype
    shape: tuple[int, ...]
    non_blocking: bool


class _Recorder(TorchDispatchMode):
    """Records every copy (`_to_copy`, `copy_`) and every read of a value back to the host."""

    def __init__(self) -> None:
        super().__init__()
        self.copies: list[_Copy] = []
        self.reads: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if name == "_to_copy":
            src = args[0]
            self.copies.append(
                _Copy(
                    src.device,
                    torch.device(kwargs.get("device") or src.device),
                    src.dtype,
                    kwargs.get("dtype") or src.dtype,
                    tuple(src.shape),
                    bool(kwargs.get("non_blocking", False)),
                )
            )
        elif name == "copy_":
            dst, src = args[0], args[1]
            non_blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
            self.copies.append(
                _Copy(src.device, dst.device, src.dtype, dst.dtype, tuple(src.shape), bool(non_blocking))
            )
        elif name in ("_local_scalar_dense", "item"):
            self.reads.append(name)
        return func(*args, **kwargs)


def _key(timestep: Any, device: str = "cpu") -> torch.Tensor:
    """The partition key the patch derives for `timestep` on `device` (a fresh call: nothing cached)."""
    return patch.timestep_key(timestep, torch.device(device))


def _exact(value: float, dtype: torch.dtype) -> bool:
    return torch.tensor(value, dtype=torch.float64).to(dtype).double().item() == value


def _with_timestep(inputs: Inputs, timestep: torch.Tensor) -> Inputs:
    return dataclasses.replace(inputs, t=timestep)


# ---------------------------------------------------------------------------------------------- key dtype


@pytest.mark.parametrize("value", [0, 1, 500, 512, 999, 999.5, 0.25])
def test_one_timestep_value_gives_one_key_in_every_dtype_that_holds_it(value: float) -> None:
    dtypes = [d for d in TIMESTEP_DTYPES if _exact(value, d)]
    keys = {str(dtype): int(_key(torch.tensor([value], dtype=dtype))) for dtype in dtypes}
    assert keys == dict.fromkeys(keys, int(value * 1000))
    assert int(_key(value)) == int(value * 1000)  # a Python number, as some hosts pass
    assert len(dtypes) >= 3


def test_a_bf16_timestep_keys_as_the_value_bf16_rounded_it_to() -> None:
    # bf16 holds 8 significant bits: 999 becomes 1000 when the host makes the tensor, before the patch sees it.
    assert not _exact(999, torch.bfloat16)
    assert int(_key(torch.tensor([999], dtype=torch.bfloat16))) == int(_key(torch.tensor([1000.0]))) == 1_000_000


def test_distinct_fp16_timesteps_near_999_give_distinct_keys() -> None:
    steps = range(980, 1000)
    keys = [int(_key(torch.tensor([t], dtype=torch.float16))) for t in steps]
    assert keys == [t * 1000 for t in steps]


@pytest.mark.parametrize("value", [500, 999])
def test_patched_output_is_bitwise_the_same_for_a_timestep_in_every_dtype(value: int) -> None:
    unet = build_unet("diffusers_sd1")
    inputs = make_inputs(2, 16, 16)
    dtypes = [d for d in TIMESTEP_DTYPES if _exact(value, d)]
    timesteps = {str(d): torch.full((2,), value, dtype=d) for d in dtypes}
    # The model itself embeds each of them as the same float32 value: only the patch could tell them apart.
    plain = {d: forward(unet, _with_timestep(inputs, t)) for d, t in timesteps.items()}
    assert all(torch.equal(out, plain["torch.float32"]) for out in plain.values())
    tome_core.apply_patch(unet, ratio=0.5, max_downsample=8, use_rand=True, seed=3)
    outs = {d: forward(unet, _with_timestep(inputs, t)) for d, t in timesteps.items()}
    assert tome_core.stats(unet).applied > 0
    tome_core.remove_patch(unet)
    reference = outs["torch.float32"]
    assert not torch.equal(reference, plain["torch.float32"])
    assert {d: torch.equal(out, reference) for d, out in outs.items()} == dict.fromkeys(outs, True)


# ---------------------------------------------------------------------------------------------- host copies


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.int64])
def test_a_host_timestep_reaches_the_device_without_a_blocking_copy_or_a_read(dtype: torch.dtype) -> None:
    with _Recorder() as rec:
        key = _key(torch.tensor([999, 1], dtype=dtype), "meta")
    assert (key.device.type, key.dtype, tuple(key.shape)) == ("meta", torch.int64, (1,))
    crossing = [c for c in rec.copies if c.src != c.dst]
    assert crossing, rec.copies  # the timestep has to cross once
    assert [c for c in crossing if not c.non_blocking] == []
    assert rec.reads == []


@pytest.mark.parametrize("timestep", [999, 999.5, None], ids=["int", "float", "none"])
def test_a_python_timestep_is_filled_on_the_device_without_any_copy(timestep: object) -> None:
    with _Recorder() as rec:
        key = _key(timestep, "meta")
    assert (key.device.type, key.dtype) == ("meta", torch.int64)
    assert [c for c in rec.copies if c.src != c.dst] == []
    assert rec.reads == []


def test_a_device_timestep_is_keyed_on_the_device_without_a_read() -> None:
    with _Recorder() as rec:
        key = _key(torch.tensor([999.0, 999.0], dtype=torch.float16, device="meta"), "meta")
    assert key.device.type == "meta"
    assert [c for c in rec.copies if c.src != c.dst] == []
    assert rec.reads == []  # .item() on a meta tensor would raise anyway; a read on CUDA would wait for the stream


# ---------------------------------------------------------------------------------------------- count tensor


def _cast(inputs: Inputs, dtype: torch.dtype) -> Inputs:
    floats = {f.name: getattr(inputs, f.name).to(dtype) for f in dataclasses.fields(inputs) if f.name != "t"}
    return dataclasses.replace(inputs, **floats)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_merges_convert_no_count_tensor(dtype: torch.dtype) -> None:
    layout = grid_layout(8, 8, 2, 2)
    x = torch.randn(2, 64, 16, generator=torch.Generator().manual_seed(0))
    part = partition(layout, random2d_slots(4, 4, 2, 2, no_rand=False, generator=None, device=x.device))
    merge, _ = plan(match(x, part), 24)
    low = x.to(dtype)
    with _Recorder() as rec:
        first, second = merge(low), merge(low)
    assert [c for c in rec.copies if c.dst_dtype == dtype] == []
    assert first.dtype == dtype and torch.equal(first, second)
    tolerance = {torch.float16: 5e-3, torch.bfloat16: 3e-2}[dtype]
    torch.testing.assert_close(first.float(), merge(low.float()), rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_low_precision_patched_call_adds_no_copy_or_conversion(dtype: torch.dtype) -> None:
    unet = build_unet("diffusers_sd1").to(dtype)
    inputs = _cast(make_inputs(2, 16, 16), dtype)
    with _Recorder() as plain:
        forward(unet, inputs)
    # Fixed partitions: no timestep key, so every conversion a patched call made would be the merges'.
    tome_core.apply_patch(unet, ratio=0.5, max_downsample=8, use_rand=False, merge_crossattn=True, merge_mlp=True)
    forward(unet, inputs)  # the first call builds the per-grid layouts
    with _Recorder() as ours:
        forward(unet, inputs)
    assert tome_core.stats(unet).applied > 0
    tome_core.remove_patch(unet)
    # A merge plan's 0/1 matrices are made from a comparison (bool) in the tokens' dtype: a cast, not a round trip
    # of the tokens through another precision.
    built = [c for c in ours.copies if c.src_dtype == torch.bool and c.dst_dtype == dtype and c.src == c.dst]
    assert built, "no merge plan was built"
    others = [c for c in ours.copies if c not in built]
    assert len(others) == len(plain.copies), [c for c in others if c not in plain.copies]
