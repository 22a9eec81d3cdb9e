"""The diffusion transformers ToMe reduces, each a small description of where its generated tokens sit.

A diffusion transformer (DiT) attends over one joint sequence: text tokens, the generated image's (or video's)
patch tokens, and for editing and image-to-video models the tokens of reference images. Only the generated tokens
form a grid that can be subsampled; text and reference tokens are kept whole, so that every query still sees all
their keys. A `Layout` says, for one model class of one host (diffusers, ComfyUI, Forge Neo), where its
transformer blocks are, which module runs a block's joint self-attention, and how one call's forward arguments
place the generated grid in that sequence (`Tokens`). The algorithm that uses it is `tome_core.dit`'s, the same
for every family.

`find_layout(module)` picks the description for a model, by its class (and the classes it derives from) and the
module that defines it; none matches a model ToMe does not handle, which `tome_core.apply_patch` then names.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True)
class Tokens:
    """Where one call's generated tokens sit in a joint attention sequence: `before` tokens (text, a kept first
    frame), then the `grid` (frames, rows, columns) of generated patch tokens in raster order, then `after` tokens
    (reference images, text placed last); `after` None: whatever follows the grid, its length not known before the
    attention call. `text`: how many of the `before` tokens are text (an image stream without the text starts
    `before - text` tokens ahead of the grid). `mergeable`: whether blocks may run on merged tokens in this call (not
    while a ControlNet adds residuals per token). `shift`: where the samples of a batch have captions of different
    lengths ahead of the grid (Lumina 2), each sample's grid starts `before + shift[i]` tokens in and the batch's
    padding follows it; empty when every sample's grid starts at `before`."""

    before: int
    grid: tuple[int, int, int]
    after: int | None = 0
    text: int = 0
    mergeable: bool = True
    shift: tuple[int, ...] = ()

    @property
    def generated(self) -> int:
        return math.prod(self.grid)

    def after_in(self, length: int) -> int | None:
        """The tokens after the grid in a sequence of `length` tokens; None when such a sequence is not this one
        (another attention in the same block: cross-attention to the text, an image-only refiner)."""
        rest = length - self.before - self.generated
        if rest < max(self.shift, default=0) or (self.after is not None and rest != self.after):
            return None
        return rest


#: How a layout reads one call's `Tokens` from the model's forward arguments. `memo` keeps what was read back from
#: a tensor (position ids), by the tensor's identity: a pipeline passes the same ids at every step.
TokenReader = Callable[[nn.Module, tuple[Any, ...], dict[str, Any], MutableMapping[Any, Any]], "Tokens | None"]


@dataclass(frozen=True)
class Family:
    """A family of diffusion transformers presets resolve for: how users call it, and what it runs at."""

    name: str  # the preset family: "flux", "wan", ...
    label: str  # in users' words
    models: str  # the checkpoints it covers
    video: bool = False


#: The DiT families, in the order the UIs list them.
DIT_FAMILIES: tuple[Family, ...] = (
    Family("flux", "Flux.1", "Flux.1 dev, schnell, Kontext, Krea"),
    Family("chroma", "Chroma", "Chroma (the Flux.1 architecture, pruned, with attention masks)"),
    Family("flux2", "Flux.2", "Flux.2 dev and Klein"),
    Family("qwen", "Qwen-Image", "Qwen-Image and Qwen-Image-Edit"),
    Family("zimage", "Z-Image", "Z-Image and Z-Image Turbo"),
    Family("lumina2", "Lumina 2", "Lumina Image 2.0"),
    Family("sd3", "SD3.5", "Stable Diffusion 3 and 3.5"),
    Family("wan", "Wan", "Wan 2.1 and 2.2, text- and image-to-video", video=True),
    Family("hunyuanvideo", "HunyuanVideo", "HunyuanVideo and HunyuanVideo-I2V", video=True),
    Family("hunyuanvideo15", "HunyuanVideo 1.5", "HunyuanVideo 1.5, text- and image-to-video", video=True),
    Family("ltx", "LTX-Video", "LTX-Video 0.9 2B and 13B, text-, image- and video-to-video", video=True),
    Family("ltx2", "LTX-2", "LTX-2, its video stream (the audio stream is never reduced)", video=True),
)


@dataclass(frozen=True)
class BlockIO:
    """How the blocks of one stack take and return the tokens, for running them on merged generated tokens: the
    argument holding the tokens (a keyword, or a position), whether those hold the text ahead of the image (a joint
    stream) or the image stream alone, the keyword of the rotary embedding of the joint sequence and its sequence
    dimension, and where the tokens are in the block's output (an index into its tuple, None: the output itself)."""

    tokens: str | int
    joint: bool
    rope: str
    rope_dim: int
    output: int | None


@dataclass(frozen=True)
class Layout:
    """One DiT family as one host implements it."""

    family: str  # `Family.name`
    host: str  # "diffusers", "ComfyUI", "Forge Neo"
    module: str  # where the class is defined: a prefix of its `__module__`
    classes: tuple[str, ...]  # the class, or a class it derives from
    stacks: tuple[str, ...]  # attributes holding its transformer blocks (ModuleLists), in forward order
    attention: str | None  # the block's submodule whose forward runs its joint self-attention; None: the block's own
    tokens: TokenReader
    timestep_max: float = 1.0  # the timestep it gets at the start of sampling (1: a sigma, 1000: a DDPM-style step)
    rising: bool = False  # its timestep counts up from 0 to `timestep_max` (diffusers' Lumina 2, Z-Image)
    io: tuple[BlockIO, ...] = ()  # per stack: how its blocks run on merged tokens (none: keys/values only)
    when: Callable[[nn.Module], bool] | None = None  # where one host class serves two families: which is this one

    def io_of(self, index: int, model: nn.Module) -> BlockIO | None:
        """The `BlockIO` of the `index`-th block (forward order), or None when its stack cannot merge."""
        if not self.io:
            return None
        for stack, io in zip(self.stacks, self.io):
            count = len(getattr(model, stack, None) or ())
            if index < count:
                return io
            index -= count
        return None

    def matches(self, module: nn.Module) -> bool:
        if self.when is not None and not self.when(module):
            return False
        return any(
            cls.__name__ in self.classes and cls.__module__.startswith(self.module) for cls in type(module).__mro__
        )

    def blocks(self, model: nn.Module) -> list[nn.Module]:
        """The transformer blocks in forward order."""
        return [block for name in self.stacks for block in getattr(model, name, None) or ()]

    def attention_of(self, block: nn.Module) -> nn.Module:
        return block if self.attention is None else getattr(block, self.attention)


# ---------------------------------------------------------------------------------------------- reading the inputs


def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], index: int, name: str) -> Any:
    return args[index] if len(args) > index else kwargs.get(name)


def _patch(model: nn.Module, default: int | Sequence[int]) -> tuple[int, ...]:
    """The model's patch size: its own `patch_size` (an int, or (t, h, w)), diffusers' config, else `default`."""
    config = getattr(model, "config", None)  # diffusers: its config (the attribute warns)
    size = config.get("patch_size") if isinstance(config, dict) else None
    if size is None:
        size = getattr(model, "patch_size", None)
    if size is None:
        size = default
    return tuple(size) if isinstance(size, (tuple, list)) else (size,)


def _image_grid(x: Any, patch: int) -> tuple[int, int, int] | None:
    """The patch grid of an image latent [B, C, H, W], or [B, C, F, H, W] with F frames patched one by one (Qwen-Image
    in ComfyUI and Forge Neo takes the Wan VAE's latent of one frame); a ragged edge is padded to whole patches."""
    if not isinstance(x, torch.Tensor) or x.dim() not in (4, 5):
        return None
    frames = int(x.shape[2]) if x.dim() == 5 else 1
    return frames, -(-int(x.shape[-2]) // patch), -(-int(x.shape[-1]) // patch)


def _length(x: Any) -> int | None:
    return int(x.shape[1]) if isinstance(x, torch.Tensor) and x.dim() == 3 else None


def _text_first_image(patch: int, context: str, context_index: int) -> TokenReader:
    """Text tokens, then the image's, then any reference images' (Flux, Chroma, Qwen-Image in ComfyUI and Forge
    Neo): an image latent [B, C, H, W] as the first argument, the text as `context`."""

    def read(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], memo: Any) -> Tokens | None:
        grid = _image_grid(_arg(args, kwargs, 0, "x"), _patch(model, patch)[-1])
        text = _length(_arg(args, kwargs, context_index, context))
        if grid is None or text is None:
            return None
        return Tokens(text, grid, None, text, kwargs.get("control") is None)

    return read


def _ids_grid(ids: torch.Tensor, memo: MutableMapping[Any, Any]) -> tuple[int, int, int, int] | None:
    """(offset, rows, columns, tokens) of the generated image among the packed tokens whose position ids are `ids`
    ([L, A] or [B, L, A]; column 0 is 0 for the generated image and positive for references; the last two
    columns before any extra axis are row and column).

    The ids live on the device: this reads four numbers back once per ids tensor, which a pipeline makes once per
    generation and passes at every step (`memo`), never once per call.
    """
    return _read_once(memo, ids, _read_ids_grid)


def _read_once(memo: MutableMapping[Any, Any], tensor: torch.Tensor, read: Callable[[torch.Tensor], Any]) -> Any:
    """`read(tensor)`, kept in `memo` by the tensor's identity (tensors compare elementwise), so that what a
    pipeline passes at every step is read back once; `memo` forgets earlier generations' tensors."""
    seen = memo.get(id(tensor))
    if seen is not None and seen[0]() is tensor:
        return seen[1]
    found = read(tensor)
    if len(memo) > 8:
        memo.clear()
    memo[id(tensor)] = (weakref.ref(tensor), found)
    return found


def _read_ids_grid(ids: torch.Tensor) -> tuple[int, int, int, int] | None:
    flat = ids[0] if ids.dim() == 3 else ids
    rows_col, cols_col = (1, 2) if flat.shape[-1] == 3 else (flat.shape[-1] - 3, flat.shape[-1] - 2)
    generated = flat[:, 0] == 0
    first = torch.argmax(generated.to(torch.int32))
    h = flat[:, rows_col].masked_fill(~generated, 0).amax() + 1
    w = flat[:, cols_col].masked_fill(~generated, 0).amax() + 1
    offset, rows, cols, count = (int(v) for v in torch.stack([first, h, w, generated.sum()]).to("cpu"))
    return (offset, rows, cols, count) if rows * cols == count else None


def _packed_with_ids(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], memo: Any) -> Tokens | None:
    """diffusers' Flux.1, Chroma and Flux.2: packed tokens [B, L, C] of the image (and of reference images, before
    or after it), text first, the grid read from `img_ids`."""
    hidden = _arg(args, kwargs, 0, "hidden_states")
    text = _length(kwargs.get("encoder_hidden_states"))
    ids = kwargs.get("img_ids")
    if _length(hidden) is None or text is None or not isinstance(ids, torch.Tensor):
        return None
    if kwargs.get("kv_cache_mode") == "cached":
        return None  # Flux.2 injects cached reference keys between text and image: another sequence
    found = _ids_grid(ids, memo)
    if found is None:
        return None
    offset, rows, cols, count = found
    control = any(kwargs.get(k) is not None for k in ("controlnet_block_samples", "controlnet_single_block_samples"))
    return Tokens(text + offset, (1, rows, cols), _length(hidden) - offset - count, text, not control)


def _packed_with_shapes(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], memo: Any) -> Tokens | None:
    """diffusers' Qwen-Image: text first, then the packed image, then reference images; `img_shapes` lists each
    sample's images as (frames, rows, columns) of patches, the generated one first."""
    hidden = _arg(args, kwargs, 0, "hidden_states")
    text = _length(kwargs.get("encoder_hidden_states"))
    shapes = kwargs.get("img_shapes")
    if _length(hidden) is None or text is None or not shapes:
        return None
    first = shapes[0][0] if isinstance(shapes[0], (list, tuple)) and isinstance(shapes[0][0], (list, tuple)) else None
    if first is None or len(first) != 3:
        return None
    grid = (int(first[0]), int(first[1]), int(first[2]))
    return Tokens(text, grid, _length(hidden) - math.prod(grid), text)


def _image_then_text(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], memo: Any) -> Tokens | None:
    """diffusers' SD3/SD3.5: the image latent [B, C, H, W], patch tokens first, the text after them."""
    grid = _image_grid(_arg(args, kwargs, 0, "hidden_states"), _patch(model, 2)[-1])
    text = _length(kwargs.get("encoder_hidden_states"))
    return None if grid is None or text is None else Tokens(0, grid, text)


def _caption_lengths(mask: torch.Tensor, memo: MutableMapping[Any, Any]) -> tuple[int, ...]:
    """Each sample's caption tokens: the ones its attention mask [B, L] keeps. Read back once per mask tensor (the
    model reads them back itself to lay out its sequence)."""
    return _read_once(memo, mask, lambda m: tuple(int(n) for n in (m != 0).sum(dim=1).to("cpu")))


def _captions_ahead(captions: Sequence[int], grid: tuple[int, int, int]) -> Tokens:
    """Each sample's caption, then its generated grid, then padding to the batch's longest sequence (Lumina 2):
    the grid starts after the shortest caption, later in samples with longer ones."""
    first = min(captions)
    shift = tuple(n - first for n in captions) if any(n != first for n in captions) else ()
    return Tokens(first, grid, None, first, True, shift)


def _lumina2_diffusers(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], memo: Any) -> Tokens | None:
    """diffusers' Lumina 2: [caption, image, padding] per sample, the caption as long as its attention mask keeps."""
    grid = _image_grid(_arg(args, kwargs, 0, "hidden_states"), _patch(model, 2)[-1])
    mask = _arg(args, kwargs, 3, "encoder_attention_mask")
    if grid is None or not isinstance(mask, torch.Tensor) or mask.dim() != 2:
        return None
    return _captions_ahead(_caption_lengths(mask, memo), grid)


def _zimage_diffusers(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], memo: Any) -> Tokens | None:
    """diffusers' Z-Image: a list of latents [C, F, H, W], one per sample; each sample's sequence is its image's
    patch tokens first (padded to a multiple of 32), then its caption's. An omni call (lists of images per sample)
    is not read."""
    images = _arg(args, kwargs, 0, "x")
    if not isinstance(images, (list, tuple)) or not images or not all(isinstance(x, torch.Tensor) for x in images):
        return None
    if any(x.dim() != 4 or x.shape != images[0].shape for x in images):
        return None
    p, fp = int(kwargs.get("patch_size", 2)), int(kwargs.get("f_patch_size", 1))
    _c, f, h, w = (int(n) for n in images[0].shape)
    return Tokens(0, (f // fp, h // p, w // p), None)


def _nextdit(per_sample: bool) -> TokenReader:
    """ComfyUI's and Forge Neo's `NextDiT` (Lumina 2, Z-Image): the caption, then the image latent's patch tokens
    (x [B, C, H, W], padded to whole patches), then padding. Z-Image pads the caption to a multiple of
    `pad_tokens_multiple` and keeps all of it; Forge Neo's Lumina 2 keeps the whole caption too; ComfyUI's Lumina 2
    (`per_sample`) keeps per sample the tokens its attention mask keeps (else `num_tokens`)."""

    def read(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], memo: Any) -> Tokens | None:
        grid = _image_grid(_arg(args, kwargs, 0, "x"), _patch(model, 2)[-1])
        text = _length(_arg(args, kwargs, 2, "context"))
        if grid is None or text is None:
            return None
        multiple = getattr(model, "pad_tokens_multiple", None)
        if isinstance(multiple, int) and multiple > 0:
            text = -(-text // multiple) * multiple
        elif per_sample:
            mask = _arg(args, kwargs, 4, "attention_mask")
            if isinstance(mask, torch.Tensor) and mask.dim() == 2:
                return _captions_ahead(_caption_lengths(mask, memo), grid)
            count = _arg(args, kwargs, 3, "num_tokens")
            text = int(count) if isinstance(count, (int, float)) else text
        return Tokens(text, grid, None, text)

    return read


def _comfy_mmdit(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], memo: Any) -> Tokens | None:
    """ComfyUI's SD3 / SD3.5 (`MMDiT`): the model's register tokens and the text first, then the image latent's patch
    tokens (x [B, C, H, W], padded to whole patches)."""
    grid = _image_grid(_arg(args, kwargs, 0, "x"), _patch(model, 2)[-1])
    context = _arg(args, kwargs, 2, "context")
    if grid is None:
        return None
    text = (_length(context) or 0) + int(getattr(model, "register_length", 0) or 0)
    return Tokens(text, grid, 0, text)


def _zimage_nextdit(model: nn.Module) -> bool:
    """ComfyUI and Forge Neo build Z-Image and Lumina 2 with one class; Z-Image pads its tokens."""
    return getattr(model, "pad_tokens_multiple", None) is not None


def _video(keep_first: bool, x_name: str, extra: Callable[[dict[str, Any], int], tuple[int, int]]) -> TokenReader:
    """A video latent [B, C, F, H, W]: its patch tokens alone (Wan's self-attention); with `keep_first`, the first
    latent frame is kept whole (it holds the reference image of image-to-video, and Wan's VAE encodes it from one
    frame where the others hold four). `extra(kwargs, frame)` gives the tokens of frames a host adds before and after
    the latent's (a reference frame, frames concatenated in time)."""

    def read(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], memo: Any) -> Tokens | None:
        x = _arg(args, kwargs, 0, x_name)
        if not isinstance(x, torch.Tensor) or x.dim() != 5:
            return None
        pt, ph, pw = (_patch(model, (1, 2, 2)) * 3)[-3:]
        t, h, w = (-(-int(n) // p) for n, p in zip(x.shape[-3:], (pt, ph, pw)))
        before, after = extra(kwargs, h * w)
        if keep_first and t > 1:
            return Tokens(before + h * w, (t - 1, h, w), after)
        return Tokens(before, (t, h, w), after)

    return read


def _no_extra(kwargs: dict[str, Any], frame: int) -> tuple[int, int]:
    return 0, 0


def _comfy_wan_extra(kwargs: dict[str, Any], frame: int) -> tuple[int, int]:
    """ComfyUI's Wan: a reference latent becomes one frame ahead; `time_dim_concat` frames follow the video."""
    concat = kwargs.get("time_dim_concat")
    after = int(concat.shape[2]) * frame if isinstance(concat, torch.Tensor) and concat.dim() == 5 else 0
    return (frame if kwargs.get("reference_latent") is not None else 0), after


def _video_patch(model: nn.Module) -> tuple[int, int, int]:
    """(frames, rows, columns) of one patch: a (t, h, w) patch size (Wan, ComfyUI's HunyuanVideo), or a spatial one
    with diffusers' `patch_size_t` beside it (HunyuanVideo, LTX-Video)."""
    size = _patch(model, (1, 2, 2))
    if len(size) == 3:
        return size[0], size[1], size[2]
    config = getattr(model, "config", None)
    frames = config.get("patch_size_t") if isinstance(config, dict) else None
    return int(frames or 1), size[-1], size[-1]


def _video_grid(x: Any, patch: tuple[int, int, int]) -> tuple[int, int, int] | None:
    """The patch grid of a video latent [B, C, F, H, W], a ragged edge padded to whole patches."""
    if not isinstance(x, torch.Tensor) or x.dim() != 5:
        return None
    t, h, w = (-(-int(n) // p) for n, p in zip(x.shape[-3:], patch))
    return t, h, w


def _first_kept(before: int, grid: tuple[int, int, int], after: int | None) -> Tokens:
    """`before` tokens, the grid, `after` tokens, the grid's first frame kept whole with the `before` tokens: a causal
    video VAE encodes it from one frame where the others hold four or eight, and image-to-video puts the reference
    image there (HunyuanVideo-I2V replaces its tokens, LTX's pipelines keep them at timestep 0)."""
    t, h, w = grid
    if t > 1:
        return Tokens(before + h * w, (t - 1, h, w), after)
    return Tokens(before, grid, after)


def _hunyuan_video(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], memo: Any) -> Tokens | None:
    """diffusers' HunyuanVideo: the video latent's patch tokens first, then the refined text (its padding masked
    by the model)."""
    grid = _video_grid(_arg(args, kwargs, 0, "hidden_states"), _video_patch(model))
    text = _length(_arg(args, kwargs, 2, "encoder_hidden_states"))
    return None if grid is None or text is None else _first_kept(0, grid, text)


def _hunyuan_video15(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], memo: Any) -> Tokens | None:
    """diffusers' HunyuanVideo 1.5: the video latent's patch tokens first, then the conditions the model joins per
    sample (the image embedding's tokens, ByT5's, the text's; valid ones first, padding masked)."""
    grid = _video_grid(_arg(args, kwargs, 0, "hidden_states"), _video_patch(model))
    lengths = [_length(_arg(args, kwargs, i, name)) for i, name in _HUNYUAN15_CONDITIONS]
    if grid is None or any(n is None for n in lengths):
        return None
    return _first_kept(0, grid, sum(n for n in lengths if n is not None))


#: diffusers' HunyuanVideo 1.5 forward: (position, keyword) of each condition joined after the video tokens.
_HUNYUAN15_CONDITIONS = ((2, "encoder_hidden_states"), (5, "encoder_hidden_states_2"), (7, "image_embeds"))


def _ltx_diffusers(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], memo: Any) -> Tokens | None:
    """diffusers' LTX-Video and LTX-2: packed video tokens [B, L, C] alone in self-attention (the text is
    cross-attention's; LTX-2's audio is a stream of its own, never reduced). `num_frames`, `height` and `width` (the
    latent's) place the generated grid first; what LTX-2's pipelines append after it (keyframes, IC-LoRA's reference
    video) stays whole. Without them (LTX-Video's condition pipeline) `video_coords` place it after the conditions
    that pipeline puts ahead of it."""
    length = _length(_arg(args, kwargs, 0, "hidden_states"))
    if length is None:
        return None
    sizes = [kwargs.get(name) for name in ("num_frames", "height", "width")]
    if all(isinstance(n, int) for n in sizes):
        grid = tuple(-(-int(n) // p) for n, p in zip(sizes, _video_patch(model)))
        before = 0
    else:
        coords = kwargs.get("video_coords")
        if not isinstance(coords, torch.Tensor) or coords.dim() != 3:
            return None
        found = _read_once(memo, coords, _read_coords_grid)
        if found is None:
            return None
        before, grid = found[0], found[1:]
    t, h, w = grid
    after = length - before - t * h * w
    return None if after < 0 or t * h * w == 0 else _first_kept(before, (t, h, w), after)


def _read_coords_grid(coords: torch.Tensor) -> tuple[int, int, int, int] | None:
    """(offset, frames, rows, columns) of the generated video among tokens at `coords` [B, 3, L] (frame, row,
    column; LTX-Video's condition pipeline): its first token is the last one at the origin (the conditions ahead of
    it start at a later frame), its first frame the tokens from there at frame 0, its first row those at row 0."""
    flat = coords[0]
    length = int(flat.shape[-1])
    index = torch.arange(length, device=flat.device)
    start = torch.where((flat == 0).all(dim=0), index, -1).amax()
    frame = (flat[0] == 0) & (index >= start)
    row = frame & (flat[1] == 0)
    offset, cells, columns = (int(v) for v in torch.stack([start, frame.sum(), row.sum()]).to("cpu"))
    if offset < 0 or columns == 0 or cells % columns or (length - offset) % cells:
        return None
    return offset, (length - offset) // cells, cells // columns, columns


def _comfy_hunyuan(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], memo: Any) -> Tokens | None:
    """ComfyUI's HunyuanVideo: a reference latent's tokens first (`ref_latent`), then the latent's [B, C, T, H, W],
    then the text and, where the model has its ByT5 mapper, the glyph text (`txt_byt5`)."""
    patch = _video_patch(model)
    grid = _video_grid(_arg(args, kwargs, 0, "x"), patch)
    text = _length(_arg(args, kwargs, 2, "context"))
    if grid is None or text is None:
        return None
    if getattr(model, "byt5_in", None) is not None:
        text += _length(_arg(args, kwargs, 4, "txt_byt5")) or 0
    ref = _video_grid(kwargs.get("ref_latent"), patch)
    return _first_kept(math.prod(ref) if ref is not None else 0, grid, text)


def _comfy_ltxv(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], memo: Any) -> Tokens | None:
    """ComfyUI's LTXV: the video latent's [B, C, F, H, W] tokens (patch 1) alone in self-attention; the guide frames
    LTXVAddGuide appends to the latent in time are its last `keyframe_idxs` [B, 3, K] tokens, kept whole."""
    grid = _video_grid(_arg(args, kwargs, 0, "x"), (1, 1, 1))
    if grid is None:
        return None
    t, h, w = grid
    keyframes = kwargs.get("keyframe_idxs")
    after = int(keyframes.shape[2]) if isinstance(keyframes, torch.Tensor) and keyframes.dim() == 3 else 0
    if after % (h * w) or after >= t * h * w:
        return None
    return _first_kept(0, (t - after // (h * w), h, w), after)


# ---------------------------------------------------------------------------------------------- the layouts

_FLUX_STACKS_DIFFUSERS = ("transformer_blocks", "single_transformer_blocks")
_FLUX_STACKS = ("double_blocks", "single_blocks")
#: diffusers' Flux blocks take the image stream as `hidden_states` and return (text, image); the rotary embedding of
#: the joint sequence is a (cos, sin) pair, sequence first.
_FLUX_IO_DIFFUSERS = (BlockIO("hidden_states", False, "image_rotary_emb", 0, 1),) * 2
#: ComfyUI's and Forge Neo's: the double blocks take `img` and return (img, txt); the single blocks take the joint
#: stream [text, image, references] first and return it; `pe` is [B, 1, L, ...].
_FLUX_IO = (BlockIO("img", False, "pe", 2, 0), BlockIO(0, True, "pe", 2, None))

#: Every model class ToMe reduces, per host.
LAYOUTS: tuple[Layout, ...] = (
    # diffusers (the library's own host): joint attention in each block's `attn`, SDPA inside.
    Layout(
        "flux",
        "diffusers",
        "diffusers.",
        ("FluxTransformer2DModel",),
        _FLUX_STACKS_DIFFUSERS,
        "attn",
        _packed_with_ids,
        io=_FLUX_IO_DIFFUSERS,
    ),
    Layout(
        "chroma",
        "diffusers",
        "diffusers.",
        ("ChromaTransformer2DModel",),
        _FLUX_STACKS_DIFFUSERS,
        "attn",
        _packed_with_ids,
    ),
    Layout(
        "flux2",
        "diffusers",
        "diffusers.",
        ("Flux2Transformer2DModel",),
        _FLUX_STACKS_DIFFUSERS,
        "attn",
        _packed_with_ids,
    ),
    Layout(
        "qwen",
        "diffusers",
        "diffusers.",
        ("QwenImageTransformer2DModel",),
        ("transformer_blocks",),
        "attn",
        _packed_with_shapes,
    ),
    Layout(
        "zimage",
        "diffusers",
        "diffusers.",
        ("ZImageTransformer2DModel",),
        ("layers",),
        "attention",
        _zimage_diffusers,
        rising=True,
    ),
    Layout(
        "lumina2",
        "diffusers",
        "diffusers.",
        ("Lumina2Transformer2DModel",),
        ("layers",),
        "attn",
        _lumina2_diffusers,
        rising=True,
    ),
    Layout(
        "sd3",
        "diffusers",
        "diffusers.",
        ("SD3Transformer2DModel",),
        ("transformer_blocks",),
        "attn",
        _image_then_text,
        1000.0,
    ),
    Layout(
        "wan",
        "diffusers",
        "diffusers.",
        ("WanTransformer3DModel",),
        ("blocks",),
        "attn1",
        _video(True, "hidden_states", _no_extra),
        1000.0,
    ),
    # HunyuanVideo: the video first, the text last; double-stream blocks, then (1.0) single-stream ones.
    Layout(
        "hunyuanvideo",
        "diffusers",
        "diffusers.",
        ("HunyuanVideoTransformer3DModel",),
        _FLUX_STACKS_DIFFUSERS,
        "attn",
        _hunyuan_video,
        1000.0,
    ),
    Layout(
        "hunyuanvideo15",
        "diffusers",
        "diffusers.",
        ("HunyuanVideo15Transformer3DModel",),
        ("transformer_blocks",),
        "attn",
        _hunyuan_video15,
        1000.0,
    ),
    # LTX: self-attention over the video tokens in `attn1` (cross-attention to the text in `attn2`, and LTX-2's audio
    # in modules of their own, never hooked).
    Layout(
        "ltx",
        "diffusers",
        "diffusers.",
        ("LTXVideoTransformer3DModel",),
        ("transformer_blocks",),
        "attn1",
        _ltx_diffusers,
        1000.0,
    ),
    Layout(
        "ltx2",
        "diffusers",
        "diffusers.",
        ("LTX2VideoTransformer3DModel",),
        ("transformer_blocks",),
        "attn1",
        _ltx_diffusers,
        1000.0,
    ),
    # ComfyUI: the attention function reads transformer_options' attention override (the adapter's).
    Layout(
        "flux",
        "ComfyUI",
        "comfy.ldm.flux",
        ("Flux",),
        _FLUX_STACKS,
        None,
        _text_first_image(2, "context", 2),
        io=_FLUX_IO,
    ),
    Layout(
        "chroma", "ComfyUI", "comfy.ldm.chroma", ("Chroma",), _FLUX_STACKS, None, _text_first_image(2, "context", 2)
    ),
    Layout(
        "qwen",
        "ComfyUI",
        "comfy.ldm.qwen_image",
        ("QwenImageTransformer2DModel",),
        ("transformer_blocks",),
        "attn",
        _text_first_image(2, "context", 2),
    ),
    Layout(
        "sd3",
        "ComfyUI",
        "comfy.ldm.modules.diffusionmodules.mmdit",
        ("MMDiT",),
        ("joint_blocks",),
        None,
        _comfy_mmdit,
        1000.0,
    ),
    Layout(
        "zimage",
        "ComfyUI",
        "comfy.ldm.lumina",
        ("NextDiT",),
        ("layers",),
        "attention",
        _nextdit(True),
        when=_zimage_nextdit,
    ),
    Layout("lumina2", "ComfyUI", "comfy.ldm.lumina", ("NextDiT",), ("layers",), "attention", _nextdit(True)),
    Layout(
        "wan",
        "ComfyUI",
        "comfy.ldm.wan",
        ("WanModel",),
        ("blocks",),
        "self_attn",
        _video(True, "x", _comfy_wan_extra),
        1000.0,
    ),
    Layout(
        "hunyuanvideo",
        "ComfyUI",
        "comfy.ldm.hunyuan_video",
        ("HunyuanVideo",),
        _FLUX_STACKS,
        None,
        _comfy_hunyuan,
        1000.0,
        when=lambda model: len(_patch(model, (1, 2, 2))) == 3,  # HunyuanImage 2.1 runs on its blocks in 2-D
    ),
    Layout(
        "ltx",
        "ComfyUI",
        "comfy.ldm.lightricks",
        ("LTXVModel",),
        ("transformer_blocks",),
        "attn1",
        _comfy_ltxv,
    ),
    # Forge Neo: SDPA inside `backend.attention.attention_function`. Its Flux.1 class also builds Flux.2 (with the
    # modulation shared by every block: `global_modulation`).
    Layout(
        "flux2",
        "Forge Neo",
        "backend.nn.flux",
        ("IntegratedFluxTransformer2DModel",),
        _FLUX_STACKS,
        None,
        _text_first_image(2, "context", 2),
        when=lambda model: bool(getattr(model, "global_modulation", False)),
    ),
    Layout(
        "flux",
        "Forge Neo",
        "backend.nn.",
        ("IntegratedFluxTransformer2DModel",),
        _FLUX_STACKS,
        None,
        _text_first_image(2, "context", 2),
        io=_FLUX_IO,
    ),
    Layout(
        "chroma",
        "Forge Neo",
        "backend.nn.chroma",
        ("IntegratedChromaTransformer2DModel",),
        _FLUX_STACKS,
        None,
        _text_first_image(2, "context", 2),
    ),
    Layout(
        "qwen",
        "Forge Neo",
        "backend.nn.qwen",
        ("QwenImageTransformer2DModel",),
        ("transformer_blocks",),
        "attn",
        _text_first_image(2, "context", 2),
    ),
    Layout(
        "zimage",
        "Forge Neo",
        "backend.nn.lumina",
        ("NextDiT",),
        ("layers",),
        "attention",
        _nextdit(False),
        when=_zimage_nextdit,
    ),
    Layout("lumina2", "Forge Neo", "backend.nn.lumina", ("NextDiT",), ("layers",), "attention", _nextdit(False)),
    Layout(
        "wan",
        "Forge Neo",
        "backend.nn.wan",
        ("WanModel",),
        ("blocks",),
        "self_attn",
        _video(True, "x", _comfy_wan_extra),
        1000.0,
    ),
)


def find_layout(module: nn.Module) -> Layout | None:
    """The description of `module`'s class, or None when ToMe does not know it as a diffusion transformer."""
    return next((layout for layout in LAYOUTS if layout.matches(module)), None)


#: Architectures a family's presets cover whose speed-ups are their own (another number of tokens at one pixel
#: size): the key of their rows in the speed table (`tome_core.figures`), by preset family. Wan 2.2 TI2V 5B: a Wan
#: to the presets, but its 16x VAE (48 latent channels) makes a quarter of the 14B's tokens at 3072 channels.
FIGURES_FAMILIES: Mapping[str, str] = MappingProxyType({"wan22-5b": "wan"})


def figures_family(module: nn.Module, family: str) -> str:
    """The speed table's family for `module`, whose presets are `family`'s: "wan22-5b" for a Wan whose patch
    embedding takes 48 channels (diffusers' and ComfyUI's Wan 2.2 TI2V 5B), else `family`."""
    embed = getattr(module, "patch_embedding", None)
    if family == "wan" and getattr(embed, "in_channels", None) == 48:
        return "wan22-5b"
    return family


def family(name: str) -> Family:
    for known in DIT_FAMILIES:
        if known.name == name:
            return known
    raise KeyError(name)


def handled() -> str:
    """The diffusion transformers ToMe reduces, in users' words, for messages."""
    return ", ".join(f"{f.label} ({f.models})" for f in DIT_FAMILIES)
