"""Tiny diffusion transformers shaped like ComfyUI's Flux (comfy/ldm/flux/model.py, layers.py, math.py), Wan 2.1
(comfy/ldm/wan/model.py), SD3 (comfy/ldm/modules/diffusionmodules/mmdit.py) and Lumina 2 (comfy/ldm/lumina/model.py) at
a125cd84, written from docs/comfyui-contract.md ("Diffusion transformers"), no ComfyUI
code: the same class names, forward signatures, token order, `transformer_options` plumbing and attention call
(`optimized_attention`, through a stand-in of `comfy.ldm.modules.attention.wrap_attn`).

The classes say they live in ComfyUI's modules (`__module__`), because that is how `tome_core`'s layouts recognise a
ComfyUI model (`tome_core.families.Layout.module`). Weights are seeded, so outputs are bitwise repeatable.

    Flux     text tokens, then the image's patch tokens, then reference images' (`ref_latents`, Kontext); double
             blocks attend over txt+img with `skip_reshape=True` ([B, H, L, D]), single blocks over the joint stream
    WanModel video patch tokens alone in self-attention (`skip_reshape` unset: [B, L, H*D]), cross-attention to the
             text through the same attention function, `time_dim_concat` frames appended
    MMDiT    SD3: register tokens and the text, then the image's patch tokens ([B, L, H*D]); SD3.5 Medium's second,
             image-only attention in its first block
    NextDiT  per sample the caption's kept tokens (its attention mask, else `num_tokens`), then the image's patch
             tokens, then padding to the batch's longest; `skip_reshape=True`, an additive mask
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import attention_kernels as kernels
from .patcher import DIFFUSION_MODEL, WrapperExecutor, get_all_wrappers

CONTEXT_DIM = 32  # the text conditioning's width (the tiny stand-in of T5's 4096)
OVERRIDE = "optimized_attention_override"


def wrap_attn(func: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """`attention.wrap_attn`: an attention function called with `transformer_options` holding an override calls
    `override(func, *args, **kwargs)` instead, with `_inside_attn_wrapper` set in kwargs so that the override's own
    call of `func` runs the function itself."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> torch.Tensor:
        inside = "_inside_attn_wrapper" in kwargs
        try:
            if not inside:
                kwargs["_inside_attn_wrapper"] = True
                options = kwargs.get("transformer_options")
                if options is not None and OVERRIDE in options:
                    return options[OVERRIDE](func, *args, **kwargs)
            return func(*args, **kwargs)
        finally:
            if not inside:
                del kwargs["_inside_attn_wrapper"]

    return wrapper


@wrap_attn
def attention_pytorch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    heads: int,
    mask: torch.Tensor | None = None,
    attn_precision: Any = None,
    skip_reshape: bool = False,
    skip_output_reshape: bool = False,
    **kwargs: Any,
) -> torch.Tensor:
    """`attention_pytorch`: q/k/v [B, H, L, D] with `skip_reshape`, else [B, L, H*D]; the output [B, L, H*D]."""
    if not skip_reshape:
        b, _, inner = q.shape
        q, k, v = (t.reshape(b, t.shape[1], heads, inner // heads).transpose(1, 2) for t in (q, k, v))  # v: 3-D or 4-D
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return out.transpose(1, 2).flatten(2)


# The kernel libraries `comfy.ldm.modules.attention` imports (`from sageattention import sageattn`, ...): stand-ins
# (tests/attention_kernels.py), which a test may swap for another build, as a node could.
sageattn = kernels.sageattn
flash_attn_func = kernels.flash_attn_func
xformers = kernels.xformers


def _heads_layout(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, skip_reshape: bool) -> Any:
    """q, k, v as [B, L, H, D] (ComfyUI's `view(b, -1, heads, dim_head)`; v 3-D or 4-D) from [B, H, L, D] or
    [B, L, H*D]."""
    if skip_reshape:
        return tuple(t.transpose(1, 2) for t in (q, k, v))
    b, _, inner = q.shape
    return tuple(t.reshape(b, t.shape[1], heads, inner // heads) for t in (q, k, v))


def _out(out: torch.Tensor, skip_output_reshape: bool) -> torch.Tensor:
    """[B, L, H, D] -> [B, H, L, D] with `skip_output_reshape`, else [B, L, H*D]."""
    return out.transpose(1, 2) if skip_output_reshape else out.flatten(2)


@wrap_attn
def attention_sage(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    heads: int,
    mask: torch.Tensor | None = None,
    attn_precision: Any = None,
    skip_reshape: bool = False,
    skip_output_reshape: bool = False,
    **kwargs: Any,
) -> torch.Tensor:
    """`attention_sage`: `sageattn` in the NHD layout (its mask ignored, as the kernel ignores it); where the kernel
    fails, `attention_pytorch`."""
    q, k, v = _heads_layout(q, k, v, heads, skip_reshape)
    try:
        out = sageattn(q, k, v, attn_mask=mask, is_causal=False, tensor_layout="NHD")
    except (TypeError, ValueError, RuntimeError):  # ComfyUI catches any Exception here and logs it
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        return attention_pytorch(q, k, v, heads, mask=mask, skip_reshape=True, skip_output_reshape=skip_output_reshape)
    return _out(out, skip_output_reshape)


@wrap_attn
def attention_flash(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    heads: int,
    mask: torch.Tensor | None = None,
    attn_precision: Any = None,
    skip_reshape: bool = False,
    skip_output_reshape: bool = False,
    **kwargs: Any,
) -> torch.Tensor:
    """`attention_flash`: `flash_attn_func` on [B, L, H, D]; with a mask, or where it fails, PyTorch's SDPA."""
    q, k, v = _heads_layout(q, k, v, heads, skip_reshape)
    try:
        if mask is not None:
            raise RuntimeError("Mask must not be set for Flash attention")
        out = flash_attn_func(q, k, v, dropout_p=0.0, causal=False)
    except RuntimeError:
        hnd = [t.transpose(1, 2) for t in (q, k, v)]
        out = F.scaled_dot_product_attention(*hnd, attn_mask=mask).transpose(1, 2)
    return _out(out, skip_output_reshape)


@wrap_attn
def attention_xformers(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    heads: int,
    mask: torch.Tensor | None = None,
    attn_precision: Any = None,
    skip_reshape: bool = False,
    skip_output_reshape: bool = False,
    **kwargs: Any,
) -> torch.Tensor:
    """`attention_xformers`: `xformers.ops.memory_efficient_attention` on [B, L, H, D]."""
    q, k, v = _heads_layout(q, k, v, heads, skip_reshape)
    return _out(xformers.ops.memory_efficient_attention(q, k, v, attn_bias=mask), skip_output_reshape)


optimized_attention = attention_pytorch


def rope(ids: torch.Tensor, axes: tuple[int, ...], theta: float = 10000.0) -> torch.Tensor:
    """`EmbedND`: per token rotation matrices [B, 1, L, D/2, 2, 2] from position ids [B, L, len(axes)]."""
    parts = []
    for axis, dim in enumerate(axes):
        scale = torch.arange(0, dim, 2, dtype=torch.float64) / dim
        angles = ids[..., axis : axis + 1].double() * (1.0 / theta**scale)
        parts.append(angles)
    angles = torch.cat(parts, dim=-1)
    cos, sin = torch.cos(angles), torch.sin(angles)
    return torch.stack([cos, -sin, sin, cos], dim=-1).reshape(*angles.shape, 2, 2).unsqueeze(1).float()


def apply_rope(x: torch.Tensor, pe: torch.Tensor) -> torch.Tensor:
    """Rotate pairs of channels of x [B, H, L, D] by pe [B, 1, L, D/2, 2, 2]."""
    pairs = x.float().reshape(*x.shape[:-1], -1, 1, 2)
    return (pe[..., 0] * pairs[..., 0] + pe[..., 1] * pairs[..., 1]).reshape(x.shape).type_as(x)


def _seeded(build: Callable[[], nn.Module], seed: int) -> nn.Module:
    state = torch.get_rng_state()
    torch.manual_seed(seed)
    try:
        module = build()
    finally:
        torch.set_rng_state(state)
    return module.eval().requires_grad_(False)


def _forward_through_wrappers(model: nn.Module, *args: Any) -> torch.Tensor:
    """`forward` of ComfyUI's DiTs: the DIFFUSION_MODEL wrappers from `transformer_options` around `_forward`; the
    options are the last positional argument."""
    options = args[-1] if isinstance(args[-1], dict) else {}
    return WrapperExecutor(model._forward, model, get_all_wrappers(DIFFUSION_MODEL, options)).execute(*args)


# ---------------------------------------------------------------------------------------------- Flux


def flux_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    pe: torch.Tensor,
    mask: Any = None,
    transformer_options: Any = None,
) -> torch.Tensor:
    """`flux.math.attention`: rotary embedding on q and k, then the attention function with `skip_reshape=True`."""
    q, k = apply_rope(q, pe), apply_rope(k, pe)
    return optimized_attention(
        q, k, v, q.shape[1], skip_reshape=True, mask=mask, transformer_options=transformer_options or {}
    )


class Modulation(nn.Module):
    def __init__(self, dim: int, count: int) -> None:
        super().__init__()
        self.lin = nn.Linear(dim, count * dim)
        self.count = count

    def forward(self, vec: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.lin(F.silu(vec))[:, None, :].chunk(self.count, dim=-1)


class DoubleStreamBlock(nn.Module):
    """Image and text streams with their own weights, one attention over cat(txt, img) (`flipped`: cat(img, txt))."""

    flipped = False

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.img_mod, self.txt_mod = Modulation(dim, 6), Modulation(dim, 6)
        self.img_qkv, self.txt_qkv = nn.Linear(dim, 3 * dim), nn.Linear(dim, 3 * dim)
        self.img_proj, self.txt_proj = nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.img_mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(approximate="tanh"), nn.Linear(2 * dim, dim))
        self.txt_mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(approximate="tanh"), nn.Linear(2 * dim, dim))

    def _qkv(self, layer: nn.Linear, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(layer(x).view(x.shape[0], x.shape[1], 3, self.heads, -1).permute(2, 0, 3, 1, 4))

    def forward(
        self,
        img: torch.Tensor,
        txt: torch.Tensor,
        vec: torch.Tensor,
        pe: torch.Tensor,
        attn_mask: Any = None,
        transformer_options: Any = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        i_shift, i_scale, i_gate, i_shift2, i_scale2, i_gate2 = self.img_mod(vec)
        t_shift, t_scale, t_gate, t_shift2, t_scale2, t_gate2 = self.txt_mod(vec)
        img_q, img_k, img_v = self._qkv(self.img_qkv, F.layer_norm(img, img.shape[-1:]) * (1 + i_scale) + i_shift)
        txt_q, txt_k, txt_v = self._qkv(self.txt_qkv, F.layer_norm(txt, txt.shape[-1:]) * (1 + t_scale) + t_shift)
        streams = ((img_q, img_k, img_v), (txt_q, txt_k, txt_v))
        first, second = streams if self.flipped else streams[::-1]
        attn = flux_attention(
            *(torch.cat(pair, dim=2) for pair in zip(first, second)),
            pe=pe,
            mask=attn_mask,
            transformer_options=transformer_options,
        )
        split = (img if self.flipped else txt).shape[1]
        head, tail = attn[:, :split], attn[:, split:]
        img_attn, txt_attn = (head, tail) if self.flipped else (tail, head)
        img = img + i_gate * self.img_proj(img_attn)
        img = img + i_gate2 * self.img_mlp(F.layer_norm(img, img.shape[-1:]) * (1 + i_scale2) + i_shift2)
        txt = txt + t_gate * self.txt_proj(txt_attn)
        txt = txt + t_gate2 * self.txt_mlp(F.layer_norm(txt, txt.shape[-1:]) * (1 + t_scale2) + t_shift2)
        return img, txt


class SingleStreamBlock(nn.Module):
    """One stream of cat(txt, img): attention and MLP in parallel."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads, self.dim = heads, dim
        self.modulation = Modulation(dim, 3)
        self.linear1 = nn.Linear(dim, 3 * dim + 2 * dim)
        self.linear2 = nn.Linear(dim + 2 * dim, dim)

    def forward(
        self,
        x: torch.Tensor,
        vec: torch.Tensor,
        pe: torch.Tensor,
        attn_mask: Any = None,
        transformer_options: Any = None,
    ) -> torch.Tensor:
        shift, scale, gate = self.modulation(vec)
        qkv, mlp = self.linear1(F.layer_norm(x, x.shape[-1:]) * (1 + scale) + shift).split(
            [3 * self.dim, 2 * self.dim], -1
        )
        q, k, v = qkv.view(x.shape[0], x.shape[1], 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        attn = flux_attention(q, k, v, pe=pe, mask=attn_mask, transformer_options=transformer_options)
        return x + gate * self.linear2(torch.cat((attn, F.gelu(mlp, approximate="tanh")), 2))


def timestep_embedding(t: torch.Tensor, dim: int, scale: float = 1000.0) -> torch.Tensor:
    half = dim // 2
    freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32) / half)
    args = (t.float() * scale)[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class _FluxLike(nn.Module):
    """`comfy.ldm.flux.model.Flux` at a toy size: `forward(x, timestep, context, y, guidance, ref_latents, control,
    transformer_options)`, patch size 2, text first, reference latents (Kontext) after the image. ComfyUI's Chroma
    is a class of its own (not derived from Flux) with the same blocks and token order."""

    def __init__(self, in_channels: int = 4, dim: int = 32, heads: int = 2, depth: int = 2, single: int = 2) -> None:
        super().__init__()
        self.patch_size = 2
        self.in_channels = in_channels
        self.axes = (4, 6, 6)  # rotary dims per id axis (index, row, column): head dim 16
        self.img_in = nn.Linear(in_channels * 4, dim)
        self.txt_in = nn.Linear(CONTEXT_DIM, dim)
        self.time_in = nn.Linear(16, dim)
        self.double_blocks = nn.ModuleList(DoubleStreamBlock(dim, heads) for _ in range(depth))
        self.single_blocks = nn.ModuleList(SingleStreamBlock(dim, heads) for _ in range(single))
        self.final_layer = nn.Linear(dim, in_channels * 4)

    def process_img(self, x: torch.Tensor, index: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Patch tokens [B, h*w, C*4] (a ragged edge padded) and their ids (index, row, column)."""
        b, c, h, w = x.shape
        x = F.pad(x, (0, -w % 2, 0, -h % 2))
        hp, wp = x.shape[-2] // 2, x.shape[-1] // 2
        img = x.reshape(b, c, hp, 2, wp, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, hp * wp, c * 4)
        ids = torch.zeros(hp, wp, 3)
        ids[..., 0] = index
        ids[..., 1] = torch.arange(hp, dtype=torch.float32)[:, None]
        ids[..., 2] = torch.arange(wp, dtype=torch.float32)[None, :]
        return img, ids.reshape(1, hp * wp, 3).expand(b, -1, -1)

    def forward(
        self,
        x: torch.Tensor,
        timestep: torch.Tensor,
        context: torch.Tensor,
        y: Any = None,
        guidance: Any = None,
        ref_latents: Any = None,
        control: Any = None,
        transformer_options: Any = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        return _forward_through_wrappers(
            self, x, timestep, context, y, guidance, ref_latents, control, transformer_options or {}
        )

    def _forward(
        self,
        x: torch.Tensor,
        timestep: torch.Tensor,
        context: torch.Tensor,
        y: Any,
        guidance: Any,
        ref_latents: Any,
        control: Any,
        transformer_options: dict[str, Any],
    ) -> torch.Tensor:
        b, c, h, w = x.shape
        img, img_ids = self.process_img(x)
        tokens = img.shape[1]
        for ref in ref_latents or ():
            more, more_ids = self.process_img(ref, index=1)
            img, img_ids = torch.cat([img, more], 1), torch.cat([img_ids, more_ids], 1)
        txt_ids = torch.zeros(b, context.shape[1], 3)
        out = self.forward_orig(img, img_ids, context, txt_ids, timestep, transformer_options)[:, :tokens]
        hp, wp = -(-h // 2), -(-w // 2)
        out = out.reshape(b, hp, wp, c, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(b, c, 2 * hp, 2 * wp)
        return out[:, :, :h, :w]

    def forward_orig(
        self,
        img: torch.Tensor,
        img_ids: torch.Tensor,
        txt: torch.Tensor,
        txt_ids: torch.Tensor,
        timesteps: torch.Tensor,
        transformer_options: dict[str, Any],
    ) -> torch.Tensor:
        """What ComfyUI-TeaCache and MagCache replace (as an object patch of `diffusion_model.forward_orig`)."""
        img = self.img_in(img)
        vec = self.time_in(timestep_embedding(timesteps, 16))
        txt = self.txt_in(txt)
        pe = rope(torch.cat((txt_ids, img_ids), dim=1), self.axes)
        for block in self.double_blocks:
            img, txt = block(img=img, txt=txt, vec=vec, pe=pe, transformer_options=transformer_options)
        x = torch.cat((txt, img), 1)
        for block in self.single_blocks:
            x = block(x, vec=vec, pe=pe, transformer_options=transformer_options)
        return self.final_layer(x[:, txt.shape[1] :])


class Flux(_FluxLike):
    """`comfy.ldm.flux.model.Flux`."""


class Chroma(_FluxLike):
    """`comfy.ldm.chroma.model.Chroma`: Flux's blocks and token order (its modulation differs; not modelled)."""


# ---------------------------------------------------------------------------------------------- Wan


class WanSelfAttention(nn.Module):
    """Rotary q/k over the video tokens; the attention function gets [B, L, H*D] (no `skip_reshape`)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.num_heads, self.head_dim = heads, dim // heads
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))
        self.norm_q, self.norm_k = nn.RMSNorm(dim), nn.RMSNorm(dim)

    def forward(self, x: torch.Tensor, freqs: torch.Tensor, transformer_options: Any = None) -> torch.Tensor:
        b, s, n, d = *x.shape[:2], self.num_heads, self.head_dim
        q = apply_rope(self.norm_q(self.q(x)).view(b, s, n, d).transpose(1, 2), freqs).transpose(1, 2)
        k = apply_rope(self.norm_k(self.k(x)).view(b, s, n, d).transpose(1, 2), freqs).transpose(1, 2)
        x = optimized_attention(
            q.reshape(b, s, n * d),
            k.reshape(b, s, n * d),
            self.v(x).view(b, s, n * d),
            heads=self.num_heads,
            transformer_options=transformer_options or {},
        )
        return self.o(x)


class WanT2VCrossAttention(WanSelfAttention):
    def forward(self, x: torch.Tensor, context: torch.Tensor, transformer_options: Any = None, **kwargs: Any) -> Any:
        q, k, v = self.norm_q(self.q(x)), self.norm_k(self.k(context)), self.v(context)
        return self.o(optimized_attention(q, k, v, heads=self.num_heads, transformer_options=transformer_options or {}))


class WanAttentionBlock(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = (
            nn.LayerNorm(dim, elementwise_affine=False),
            nn.LayerNorm(dim, elementwise_affine=False),
        )
        self.norm3 = nn.LayerNorm(dim)
        self.self_attn = WanSelfAttention(dim, heads)
        self.cross_attn = WanT2VCrossAttention(dim, heads)
        self.ffn = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(approximate="tanh"), nn.Linear(2 * dim, dim))
        self.modulation = nn.Parameter(torch.randn(1, 6, dim) / dim**0.5)

    def forward(
        self,
        x: torch.Tensor,
        e: torch.Tensor,
        freqs: torch.Tensor,
        context: torch.Tensor,
        context_img_len: Any = None,
        transformer_options: Any = None,
    ) -> torch.Tensor:
        e0, e1, e2, e3, e4, e5 = (self.modulation + e).chunk(6, dim=1)
        y = self.self_attn(self.norm1(x) * (1 + e1) + e0, freqs, transformer_options=transformer_options)
        x = x + y * e2
        x = x + self.cross_attn(
            self.norm3(x), context, context_img_len=context_img_len, transformer_options=transformer_options
        )
        return x + self.ffn(self.norm2(x) * (1 + e4) + e3) * e5


class WanModel(nn.Module):
    """`comfy.ldm.wan.model.WanModel` at a toy size: `forward(x, timestep, context, clip_fea, time_dim_concat,
    transformer_options)` on a video latent [B, C, T, H, W], patch (1, 2, 2)."""

    def __init__(self, in_dim: int = 4, dim: int = 32, heads: int = 2, layers: int = 3) -> None:
        super().__init__()
        self.patch_size = (1, 2, 2)
        self.dim, self.out_dim = dim, in_dim
        self.axes = (4, 6, 6)  # rotary dims per id axis (frame, row, column): head dim 16
        self.patch_embedding = nn.Conv3d(in_dim, dim, kernel_size=self.patch_size, stride=self.patch_size)
        self.text_embedding = nn.Sequential(
            nn.Linear(CONTEXT_DIM, dim), nn.GELU(approximate="tanh"), nn.Linear(dim, dim)
        )
        self.time_embedding = nn.Sequential(nn.Linear(16, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.time_projection = nn.Sequential(nn.SiLU(), nn.Linear(dim, dim * 6))
        self.blocks = nn.ModuleList(WanAttentionBlock(dim, heads) for _ in range(layers))
        self.head = nn.Linear(dim, in_dim * 4)

    def forward(
        self,
        x: torch.Tensor,
        timestep: torch.Tensor,
        context: torch.Tensor,
        clip_fea: Any = None,
        time_dim_concat: Any = None,
        transformer_options: Any = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        return _forward_through_wrappers(
            self, x, timestep, context, clip_fea, time_dim_concat, transformer_options or {}
        )

    def _forward(
        self,
        x: torch.Tensor,
        timestep: torch.Tensor,
        context: torch.Tensor,
        clip_fea: Any,
        time_dim_concat: Any,
        transformer_options: dict[str, Any],
    ) -> torch.Tensor:
        t, h, w = x.shape[-3:]
        x = F.pad(x, (0, -w % 2, 0, -h % 2))
        if time_dim_concat is not None:
            x = torch.cat([x, F.pad(time_dim_concat, (0, -w % 2, 0, -h % 2))], dim=2)
        frames, hp, wp = x.shape[2], x.shape[3] // 2, x.shape[4] // 2
        ids = torch.stack(
            torch.meshgrid(torch.arange(frames), torch.arange(hp), torch.arange(wp), indexing="ij"), dim=-1
        ).reshape(1, -1, 3)
        freqs = rope(ids, self.axes)
        return self.forward_orig(x, timestep, context, freqs, transformer_options)[:, :, :t, :h, :w]

    def forward_orig(
        self, x: torch.Tensor, t: torch.Tensor, context: torch.Tensor, freqs: torch.Tensor, transformer_options: Any
    ) -> torch.Tensor:
        x = self.patch_embedding(x)
        b, _, frames, hp, wp = x.shape
        x = x.flatten(2).transpose(1, 2)
        e = self.time_embedding(timestep_embedding(t, 16, scale=1.0))
        e0 = self.time_projection(e).unflatten(1, (6, self.dim))
        context = self.text_embedding(context)
        for block in self.blocks:
            x = block(x, e=e0, freqs=freqs, context=context, transformer_options=transformer_options)
        x = self.head(x).reshape(b, frames, hp, wp, self.out_dim, 2, 2)
        return x.permute(0, 4, 1, 2, 5, 3, 6).reshape(b, self.out_dim, frames, 2 * hp, 2 * wp)


# Where ComfyUI defines them: the module prefix tome_core's layouts recognise a ComfyUI model by.
for _cls in (Modulation, DoubleStreamBlock, SingleStreamBlock, Flux):
    _cls.__module__ = "comfy.ldm.flux.model" if _cls is Flux else "comfy.ldm.flux.layers"
Chroma.__module__ = "comfy.ldm.chroma.model"
for _cls in (WanSelfAttention, WanT2VCrossAttention, WanAttentionBlock, WanModel):
    _cls.__module__ = "comfy.ldm.wan.model"


# ---------------------------------------------------------------------------------------------- Lumina 2


class JointAttention(nn.Module):
    """`comfy.ldm.lumina.model.JointAttention`: rotary embedding on q and k, then the masked attention function with
    [B, H, L, D] (`skip_reshape=True`)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, x_mask: Any, freqs_cis: torch.Tensor, transformer_options: Any = None) -> Any:
        b, n, _ = x.shape
        q, k, v = (t.view(b, n, self.heads, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        q, k = apply_rope(q, freqs_cis), apply_rope(k, freqs_cis)
        out = optimized_attention(
            q, k, v, self.heads, x_mask, skip_reshape=True, transformer_options=transformer_options
        )
        return self.out(out)


class JointTransformerBlock(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.attention = JointAttention(dim, heads)
        self.norm = nn.LayerNorm(dim, elementwise_affine=False)
        self.mod = nn.Linear(dim, dim)
        self.feed_forward = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(approximate="tanh"), nn.Linear(2 * dim, dim))

    def forward(
        self,
        x: torch.Tensor,
        x_mask: Any,
        freqs_cis: torch.Tensor,
        adaln_input: Any = None,
        transformer_options: Any = None,
    ) -> torch.Tensor:
        scale = 0.0 if adaln_input is None else self.mod(F.silu(adaln_input))[:, None]
        x = x + self.attention(self.norm(x) * (1 + scale), x_mask, freqs_cis, transformer_options)
        return x + self.feed_forward(self.norm(x))


class NextDiT(nn.Module):
    """`comfy.ldm.lumina.model.NextDiT` (Lumina 2) at a toy size: `forward(x, timesteps, context, num_tokens,
    attention_mask, transformer_options)`; per sample, the caption's tokens its mask keeps (else `num_tokens`), then
    the image's 2x2 patch tokens, then zeros up to the batch's longest; an additive mask over the captions' span; the
    caption and the image refined alone first; `t = 1 - timesteps`. With `pad_tokens_multiple` (Z-Image, as ComfyUI
    builds it after a125cd84 and Forge Neo does): the caption padded to a multiple of it, every token kept."""

    def __init__(
        self, in_dim: int = 4, dim: int = 32, heads: int = 2, layers: int = 2, pad_tokens_multiple: int | None = None
    ) -> None:
        super().__init__()
        self.patch_size = 2
        self.pad_tokens_multiple = pad_tokens_multiple
        self.dim = dim
        self.axes = (4, 6, 6)  # rotary dims per id axis (caption position, row, column): head dim 16
        self.x_embedder = nn.Linear(in_dim * 4, dim)
        self.cap_embedder = nn.Linear(CONTEXT_DIM, dim)
        self.t_embedder = nn.Linear(16, dim)
        self.context_refiner = nn.ModuleList([JointTransformerBlock(dim, heads)])
        self.noise_refiner = nn.ModuleList([JointTransformerBlock(dim, heads)])
        self.layers = nn.ModuleList(JointTransformerBlock(dim, heads) for _ in range(layers))
        self.final_layer = nn.Linear(dim, in_dim * 4)

    def forward(
        self,
        x: torch.Tensor,
        timesteps: torch.Tensor,
        context: torch.Tensor,
        num_tokens: Any = None,
        attention_mask: Any = None,
        transformer_options: Any = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        return _forward_through_wrappers(
            self, x, timesteps, context, num_tokens, attention_mask, transformer_options or {}
        )

    def _forward(
        self,
        x: torch.Tensor,
        timesteps: torch.Tensor,
        context: torch.Tensor,
        num_tokens: Any,
        attention_mask: Any,
        transformer_options: dict[str, Any],
    ) -> torch.Tensor:
        b, c, h, w = x.shape
        if self.pad_tokens_multiple:
            context = F.pad(context, (0, 0, 0, -context.shape[1] % self.pad_tokens_multiple))
            attention_mask, num_tokens = None, None
        x = F.pad(x, (0, -w % 2, 0, -h % 2))
        hp, wp = x.shape[2] // 2, x.shape[3] // 2
        n = hp * wp
        t = self.t_embedder(timestep_embedding(1.0 - timesteps, 16, scale=1.0))
        caps = (
            attention_mask.sum(dim=1).tolist() if attention_mask is not None else [num_tokens or context.shape[1]] * b
        )
        length = max(caps) + n
        ids = torch.zeros(b, length, 3)
        for i, cap in enumerate(caps):
            ids[i, :cap, 0] = torch.arange(cap)
            ids[i, cap : cap + n, 0] = cap
            ids[i, cap : cap + n, 1] = torch.arange(hp).repeat_interleave(wp)
            ids[i, cap : cap + n, 2] = torch.arange(wp).repeat(hp)
        freqs = rope(ids, self.axes)
        cap_mask = None
        if attention_mask is not None:
            # additive, [B, 1, 1, L]: 0 kept, -max not
            cap_mask = ((attention_mask.float() - 1.0) * torch.finfo(torch.float32).max)[:, None, None, :]
        cap_feats = self.cap_embedder(context)
        for layer in self.context_refiner:
            cap_feats = layer(
                cap_feats, cap_mask, freqs[:, :, : context.shape[1]], transformer_options=transformer_options
            )
        img = self.x_embedder(x.reshape(b, c, hp, 2, wp, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, n, c * 4))
        img_freqs = torch.stack([freqs[i, :, cap : cap + n] for i, cap in enumerate(caps)])
        for layer in self.noise_refiner:
            img = layer(img, None, img_freqs, t, transformer_options=transformer_options)
        joint = torch.zeros(b, length, self.dim)
        for i, cap in enumerate(caps):
            joint[i, :cap] = cap_feats[i, :cap]
            joint[i, cap : cap + n] = img[i]
        mask = None
        if cap_mask is not None:
            mask = torch.zeros(b, 1, 1, length)
            mask[..., : max(caps)] = cap_mask[..., : max(caps)]
        for layer in self.layers:
            joint = layer(joint, mask, freqs, t, transformer_options=transformer_options)
        out = torch.stack([joint[i, cap : cap + n] for i, cap in enumerate(caps)])
        out = self.final_layer(out).reshape(b, hp, wp, c, 2, 2).permute(0, 3, 1, 4, 2, 5)
        return -out.reshape(b, c, 2 * hp, 2 * wp)[:, :, :h, :w]


for _cls in (JointAttention, JointTransformerBlock, NextDiT):
    _cls.__module__ = "comfy.ldm.lumina.model"


# ---------------------------------------------------------------------------------------------- SD3 / SD3.5


class JointBlock(nn.Module):
    """`mmdit.JointBlock` (through `_block_mixing`): the text's and the image's q/k/v, text first, one attention call
    with `transformer_options` ([B, L, H*D]); with `x_block_self_attn` (SD3.5 Medium's first blocks) a second
    attention over the image tokens alone through the same function."""

    def __init__(self, dim: int, heads: int, x_block_self_attn: bool = False) -> None:
        super().__init__()
        self.heads = heads
        self.context_qkv, self.x_qkv = nn.Linear(dim, 3 * dim), nn.Linear(dim, 3 * dim)
        self.context_out, self.x_out = nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.x_qkv2 = nn.Linear(dim, 3 * dim) if x_block_self_attn else None
        self.mod = nn.Linear(dim, dim)

    def forward(
        self, context: torch.Tensor, x: torch.Tensor, c: torch.Tensor, use_checkpoint: bool = False, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        options = kwargs.get("transformer_options", {})
        scale = self.mod(F.silu(c))[:, None]
        cq, ck, cv = self.context_qkv(context).chunk(3, dim=-1)
        xq, xk, xv = self.x_qkv(x * (1 + scale)).chunk(3, dim=-1)
        q, k, v = (torch.cat(pair, dim=1) for pair in ((cq, xq), (ck, xk), (cv, xv)))
        v = v.unflatten(-1, (self.heads, -1))  # as `mmdit.split_qkv` leaves it: [B, L, H, D] beside q, k [B, L, H*D]
        out = optimized_attention(q, k, v, heads=self.heads, transformer_options=options)
        n = context.shape[1]
        attn = self.x_out(out[:, n:])
        if self.x_qkv2 is not None:
            q2, k2, v2 = self.x_qkv2(x).chunk(3, dim=-1)
            attn = attn + optimized_attention(q2, k2, v2, heads=self.heads, transformer_options=options)
        return context + self.context_out(out[:, :n]), x + attn


class MMDiT(nn.Module):
    """`mmdit.MMDiT` at a toy size: 2x2 patches with absolute positions, register tokens ahead of the text."""

    def __init__(self, in_dim: int = 4, dim: int = 32, heads: int = 2, depth: int = 2, registers: int = 0) -> None:
        super().__init__()
        self.patch_size = 2
        self.register_length = registers
        self.x_embedder = nn.Linear(in_dim * 4, dim)
        self.pos_embed = nn.Linear(2, dim)
        self.context_embedder = nn.Linear(CONTEXT_DIM, dim)
        self.t_embedder = nn.Linear(16, dim)
        if registers:
            self.register = nn.Parameter(torch.randn(1, registers, dim))
        self.joint_blocks = nn.ModuleList(JointBlock(dim, heads, x_block_self_attn=i == 0) for i in range(depth))
        self.final_layer = nn.Linear(dim, in_dim * 4)

    def forward(
        self,
        x: torch.Tensor,
        t: torch.Tensor,
        y: Any = None,
        context: Any = None,
        control: Any = None,
        transformer_options: Any = None,
    ) -> torch.Tensor:
        b, c, h, w = x.shape
        x = F.pad(x, (0, -w % 2, 0, -h % 2))
        hp, wp = x.shape[2] // 2, x.shape[3] // 2
        ids = torch.stack(torch.meshgrid(torch.arange(hp), torch.arange(wp), indexing="ij"), dim=-1).reshape(-1, 2)
        tokens = self.x_embedder(x.reshape(b, c, hp, 2, wp, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, hp * wp, c * 4))
        tokens = tokens + self.pos_embed(ids.float() / max(hp, wp))
        vec = self.t_embedder(timestep_embedding(t, 16, scale=1.0))
        text = self.context_embedder(context)
        if self.register_length:
            text = torch.cat([self.register.expand(b, -1, -1), text], dim=1)
        for block in self.joint_blocks:
            text, tokens = block(
                text, tokens, c=vec, use_checkpoint=False, transformer_options=transformer_options or {}
            )
        out = self.final_layer(tokens).reshape(b, hp, wp, c, 2, 2).permute(0, 3, 1, 4, 2, 5)
        return out.reshape(b, c, 2 * hp, 2 * wp)[:, :, :h, :w]


class OpenAISignatureMMDITWrapper(MMDiT):
    """ComfyUI's SD3 model class: `forward(x, timesteps, context, y, control, transformer_options)`."""

    def forward(  # type: ignore[override]
        self,
        x: torch.Tensor,
        timesteps: torch.Tensor,
        context: Any = None,
        y: Any = None,
        control: Any = None,
        transformer_options: Any = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        return super().forward(
            x, timesteps, context=context, y=y, control=control, transformer_options=transformer_options
        )


for _cls in (JointBlock, MMDiT, OpenAISignatureMMDITWrapper):
    _cls.__module__ = "comfy.ldm.modules.diffusionmodules.mmdit"


class UnknownDiT(nn.Module):
    """A diffusion transformer ToMe does not reduce (HiDream): attention over its tokens
    through the same attention function, in a class no layout describes."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(
        self, x: torch.Tensor, timesteps: torch.Tensor, context: Any = None, transformer_options: Any = None, **kw: Any
    ) -> torch.Tensor:
        tokens = self.proj(x.flatten(2).transpose(1, 2))
        out = optimized_attention(tokens, tokens, tokens, 2, transformer_options=transformer_options or {})
        return out.transpose(1, 2).reshape(x.shape)


UnknownDiT.__module__ = "comfy.ldm.hidream.model"


def build_dit(kind: str, seed: int = 0) -> nn.Module:
    """ "flux", "chroma", "wan", "lumina2", "zimage", "sd3" or "unknown": a seeded tiny model."""
    kinds = {
        "flux": Flux,
        "chroma": Chroma,
        "wan": WanModel,
        "lumina2": NextDiT,
        "zimage": lambda: NextDiT(pad_tokens_multiple=32),
        "sd3": lambda: OpenAISignatureMMDITWrapper(registers=2, depth=4),  # presets start past half the depth
        "unknown": UnknownDiT,
    }
    return _seeded(kinds[kind], seed)


# ---------------------------------------------------------------------------------------------- HunyuanVideo, LTXV
# comfy/ldm/hunyuan_video/model.py and comfy/ldm/lightricks/model.py at a125cd84.


class HunyuanDoubleStreamBlock(DoubleStreamBlock):
    """Flux's double block as HunyuanVideo builds it (`flipped_img_txt=True`): one attention over cat(img, txt)."""

    flipped = True


class HunyuanVideo(nn.Module):
    """`comfy.ldm.hunyuan_video.model.HunyuanVideo` at a toy size: `forward(x, timestep, context, y, txt_byt5,
    guidance, attention_mask, guiding_frame_index, ref_latent, disable_time_r, control, transformer_options)` on a
    video latent [B, C, T, H, W], patch (1, 2, 2): a reference latent's tokens (`ref_latent`), the video's, then the
    text (its padding masked by an additive [1, 1, L] mask from `attention_mask`); double blocks, then single blocks
    over the joint stream. `patch_size` (1, 2) builds HunyuanImage 2.1's 2-D model on the same class."""

    def __init__(
        self, in_channels: int = 4, dim: int = 32, heads: int = 2, depth: int = 2, single: int = 2, patch: Any = None
    ) -> None:
        super().__init__()
        self.patch_size = list(patch or (1, 2, 2))
        self.in_channels = in_channels
        self.byt5_in = None
        self.axes = (4, 6, 6)  # rotary dims per id axis (frame, row, column): head dim 16
        self.img_in = nn.Linear(in_channels * 4, dim)
        self.txt_in = nn.Linear(CONTEXT_DIM, dim)
        self.time_in = nn.Linear(16, dim)
        self.double_blocks = nn.ModuleList(HunyuanDoubleStreamBlock(dim, heads) for _ in range(depth))
        self.single_blocks = nn.ModuleList(SingleStreamBlock(dim, heads) for _ in range(single))
        self.final_layer = nn.Linear(dim, in_channels * 4)

    def forward(
        self,
        x: torch.Tensor,
        timestep: torch.Tensor,
        context: torch.Tensor,
        y: Any = None,
        txt_byt5: Any = None,
        guidance: Any = None,
        attention_mask: Any = None,
        guiding_frame_index: Any = None,
        ref_latent: Any = None,
        disable_time_r: bool = False,
        control: Any = None,
        transformer_options: Any = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        return _forward_through_wrappers(
            self, x, timestep, context, attention_mask, ref_latent, transformer_options or {}
        )

    def _patches(self, x: torch.Tensor, frame: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
        """Patch tokens [B, T*h*w, C*4] of a latent [B, C, T, H, W] and their ids (frame, row, column)."""
        b, c, t, h, w = x.shape
        x = F.pad(x, (0, -w % 2, 0, -h % 2))
        hp, wp = x.shape[-2] // 2, x.shape[-1] // 2
        tokens = x.reshape(b, c, t, hp, 2, wp, 2).permute(0, 2, 3, 5, 1, 4, 6).reshape(b, t * hp * wp, c * 4)
        ids = torch.stack(torch.meshgrid(torch.arange(t), torch.arange(hp), torch.arange(wp), indexing="ij"), -1)
        ids = ids.reshape(1, -1, 3).float()
        ids[..., 0] += frame
        return tokens, ids.expand(b, -1, -1)

    def _forward(
        self,
        x: torch.Tensor,
        timestep: torch.Tensor,
        context: torch.Tensor,
        attention_mask: Any,
        ref_latent: Any,
        transformer_options: dict[str, Any],
    ) -> torch.Tensor:
        b, c, t, h, w = x.shape
        img, img_ids = self._patches(x)
        tokens = img.shape[1]
        if ref_latent is not None:
            ref, ref_ids = self._patches(ref_latent.expand(b, -1, -1, -1, -1), frame=-1.0)
            img, img_ids = torch.cat([ref, img], 1), torch.cat([ref_ids, img_ids], 1)
        img = self.img_in(img)
        txt = self.txt_in(context)
        vec = self.time_in(timestep_embedding(timestep, 16, scale=1.0))
        pe = rope(torch.cat((img_ids, torch.zeros(b, txt.shape[1], 3)), dim=1), self.axes)
        mask = None
        if attention_mask is not None:
            mask = torch.zeros(1, 1, img.shape[1] + txt.shape[1])
            mask[:, 0, img.shape[1] :] = (attention_mask[:1].float() - 1) * torch.finfo(torch.float32).max
        for block in self.double_blocks:
            img, txt = block(img=img, txt=txt, vec=vec, pe=pe, attn_mask=mask, transformer_options=transformer_options)
        joint = torch.cat((img, txt), 1)
        for block in self.single_blocks:
            joint = block(joint, vec=vec, pe=pe, attn_mask=mask, transformer_options=transformer_options)
        out = self.final_layer(joint[:, img.shape[1] - tokens : img.shape[1]])
        hp, wp = -(-h // 2), -(-w // 2)
        out = out.reshape(b, t, hp, wp, c, 2, 2).permute(0, 4, 1, 2, 5, 3, 6).reshape(b, c, t, 2 * hp, 2 * wp)
        return out[..., :h, :w]


class LTXVCrossAttention(nn.Module):
    """`lightricks.model.CrossAttention`: q/k RMS-normed, rotary on both in self-attention, the attention function
    with [B, L, H*D]."""

    def __init__(self, dim: int, heads: int, context_dim: int | None = None) -> None:
        super().__init__()
        self.heads = heads
        self.to_q, self.to_out = nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.to_k, self.to_v = nn.Linear(context_dim or dim, dim), nn.Linear(context_dim or dim, dim)
        self.q_norm, self.k_norm = nn.RMSNorm(dim), nn.RMSNorm(dim)

    def forward(
        self, x: torch.Tensor, context: Any = None, mask: Any = None, pe: Any = None, transformer_options: Any = None
    ) -> Any:
        context = x if context is None else context
        q, k, v = self.q_norm(self.to_q(x)), self.k_norm(self.to_k(context)), self.to_v(context)
        if pe is not None:
            b, n, inner = q.shape
            q, k = (
                apply_rope(t.view(b, n, self.heads, -1).transpose(1, 2), pe).transpose(1, 2).reshape(b, n, inner)
                for t in (q, k)
            )
        out = optimized_attention(q, k, v, self.heads, mask, transformer_options=transformer_options or {})
        return self.to_out(out)


class LTXVBlock(nn.Module):
    """`lightricks.model.BasicTransformerBlock`: self-attention (`attn1`), cross-attention to the text (`attn2`)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.attn1 = LTXVCrossAttention(dim, heads)
        self.attn2 = LTXVCrossAttention(dim, heads, dim)
        self.ff = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(approximate="tanh"), nn.Linear(2 * dim, dim))
        self.scale_shift_table = nn.Parameter(torch.randn(6, dim) / dim**0.5)

    def forward(
        self, x: torch.Tensor, context: Any, attention_mask: Any, timestep: Any, pe: Any, transformer_options: Any
    ) -> torch.Tensor:
        shift, scale, gate, shift2, scale2, gate2 = (self.scale_shift_table[None] + timestep[:, :, None]).unbind(2)
        normed = F.rms_norm(x, x.shape[-1:]) * (1 + scale) + shift
        x = x + self.attn1(normed, pe=pe, transformer_options=transformer_options) * gate
        x = x + self.attn2(x, context=context, mask=attention_mask, transformer_options=transformer_options)
        return x + self.ff(F.rms_norm(x, x.shape[-1:]) * (1 + scale2) + shift2) * gate2


class LTXVModel(nn.Module):
    """`comfy.ldm.lightricks.model.LTXVModel` at a toy size: `forward(x, timestep, context, attention_mask,
    frame_rate, transformer_options, keyframe_idxs)` on a video latent [B, C, F, H, W], patch 1: one token per latent
    cell; the guide frames LTXVAddGuide appends in time are the last tokens, placed by `keyframe_idxs` [B, 3, K]."""

    def __init__(self, in_channels: int = 4, dim: int = 32, heads: int = 2, layers: int = 2) -> None:
        super().__init__()
        self.dim = dim
        self.axes = (4, 6, 6)  # rotary dims per coordinate (frame, row, column): head dim 16
        self.patchify_proj = nn.Linear(in_channels, dim)
        self.caption_projection = nn.Linear(CONTEXT_DIM, dim)
        self.adaln_single = nn.Linear(16, dim)
        self.transformer_blocks = nn.ModuleList(LTXVBlock(dim, heads) for _ in range(layers))
        self.proj_out = nn.Linear(dim, in_channels)

    def forward(
        self,
        x: torch.Tensor,
        timestep: torch.Tensor,
        context: torch.Tensor,
        attention_mask: Any = None,
        frame_rate: float = 25,
        transformer_options: Any = None,
        keyframe_idxs: Any = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        return _forward_through_wrappers(self, x, timestep, context, keyframe_idxs, transformer_options or {})

    def _forward(
        self, x: torch.Tensor, timestep: torch.Tensor, context: torch.Tensor, keyframe_idxs: Any, options: dict
    ) -> torch.Tensor:
        b, c, f, h, w = x.shape
        tokens = x.flatten(2).transpose(1, 2)
        coords = torch.stack(torch.meshgrid(torch.arange(f), torch.arange(h), torch.arange(w), indexing="ij"), -1)
        coords = coords.reshape(1, -1, 3).float().expand(b, -1, -1).clone()
        if keyframe_idxs is not None:
            coords[:, -keyframe_idxs.shape[2] :] = keyframe_idxs[:1].transpose(1, 2).float()
        pe = rope(coords, self.axes)
        # One timestep per sample, or per token (ComfyUI's per-token timesteps under a denoise mask): [B, 1 or L, C].
        t = self.adaln_single(timestep_embedding(timestep.flatten(), 16, scale=1000.0)).view(b, -1, self.dim)
        y = self.patchify_proj(tokens)
        text = self.caption_projection(context)
        for block in self.transformer_blocks:
            y = block(y, context=text, attention_mask=None, timestep=t, pe=pe, transformer_options=options)
        return self.proj_out(y).transpose(1, 2).reshape(b, c, f, h, w)


for _cls in (HunyuanDoubleStreamBlock,):
    _cls.__module__ = "comfy.ldm.flux.layers"
HunyuanVideo.__module__ = "comfy.ldm.hunyuan_video.model"
for _cls in (LTXVCrossAttention, LTXVBlock, LTXVModel):
    _cls.__module__ = "comfy.ldm.lightricks.model"
