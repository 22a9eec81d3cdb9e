"""Random-weight checkpoints for the live ComfyUI suites, made or fixed here (nothing is downloaded).

    python tests/live_checkpoints.py MADE.safetensors ComfyUI/models/checkpoints/random-sdxl.safetensors
    python tests/live_checkpoints.py dit ComfyUI

Run the `dit` form with the Python that runs ComfyUI (it imports ComfyUI's model classes, which import psutil and
the rest of ComfyUI's requirements; .venv lacks some).

The second form sets up the diffusion-transformer checks (tests/test_live_comfy_dit.py): it writes
`models/diffusion_models/random-flux.safetensors` (Flux.1 dev's layout at one double and one single block: ComfyUI
fixes the hidden size at 3072 and finds the family from the `double_blocks.*` keys) and `random-wan21.safetensors`
(Wan 2.1 text-to-video with dim 256, two heads, two blocks: ComfyUI reads the dim from `head.modulation`), SD3.5,
Qwen-Image, Lumina 2, `random-hunyuanvideo.safetensors` (HunyuanVideo text-to-video, width 256, two double and two
single blocks), `random-ltxv.safetensors` (LTX-Video, width 256 in 32 heads, four blocks), Wan 2.2 14B's two
experts (`random-wan22-14b-high.safetensors`, `random-wan22-14b-low.safetensors`: Wan 2.1's layout and dims, their
own seeds) and Wan 2.2 TI2V 5B (`random-wan22-5b.safetensors`: 48 latent channels, dim 256, two blocks), and copies
tests/comfy_live_node (conditioning of the right shape from a seed, in place of the T5 text encoders) into
`custom_nodes/tome_live_conditioning`. The tensor names and shapes are those of ComfyUI's own model classes, built
on the meta device from the given ComfyUI checkout; the values are seeded normal weights (std 0.02), zero biases
and unit norm scales, stored in bfloat16.

The first form fixes a checkpoint from shared/tools:

Run with transformers 5.x, `make_random_sdxl.py` writes the CLIP ViT-L text encoder as
`conditioner.embedders.0.transformer.encoder...`, without the `text_model.` level that SDXL checkpoints and ComfyUI's
key map have (5.x's `CLIPTextModel` names start at `embeddings.`). ComfyUI then finds no CLIP-L weights ("clip
missing: ['clip_l...']"), runs that encoder with weights it never set, and every SDXL image is NaN, with or without
ToMe. This rewrites the safetensors header only (the names gain `text_model.`; a checkpoint that has the level
passes unchanged); the tensor bytes are copied as they are, so it needs no memory for the weights:

    python tests/live_checkpoints.py random-sdxl-sgm.safetensors ComfyUI/models/checkpoints/random-sdxl.safetensors
"""

from __future__ import annotations

import json
import shutil
import struct
import sys
from pathlib import Path
from typing import Any

CLIP_L_PREFIXES = ("conditioner.embedders.0.transformer.", "cond_stage_model.transformer.")
TEXT_MODEL_PARTS = ("embeddings.", "encoder.", "final_layer_norm.")


def comfy_key(key: str) -> str:
    """The name ComfyUI looks for: the CLIP-L text model's tensors under `...transformer.text_model.`."""
    for prefix in CLIP_L_PREFIXES:
        if key.startswith(prefix) and key[len(prefix) :].startswith(TEXT_MODEL_PARTS):
            return prefix + "text_model." + key[len(prefix) :]
    return key


def rename_for_comfy(source: Path, target: Path) -> int:
    """Copy `source` to `target` with `comfy_key` names; returns how many names changed."""
    with source.open("rb") as src:
        (size,) = struct.unpack("<Q", src.read(8))
        header = json.loads(src.read(size))
        names = {key: comfy_key(key) for key in header}
        renamed = {names[key]: value for key, value in header.items()}
        if len(renamed) != len(header):
            raise ValueError(f"{source}: renaming would merge two tensors into one name")
        text = json.dumps(renamed, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)  # safetensors pads the header to 8 bytes with spaces
        with target.open("wb") as dst:
            dst.write(struct.pack("<Q", len(text)))
            dst.write(text)
            shutil.copyfileobj(src, dst, 64 << 20)
    return sum(new != old for old, new in names.items())


#: The diffusion transformers the DiT checks load: file name -> (ComfyUI's module, class, constructor keywords).
DIT_CHECKPOINTS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "random-flux.safetensors": (
        "comfy.ldm.flux.model",
        "Flux",
        {
            "in_channels": 16,
            "out_channels": 16,
            "vec_in_dim": 768,
            "context_in_dim": 4096,
            "hidden_size": 3072,
            "mlp_ratio": 4.0,
            "num_heads": 24,
            "depth": 1,
            "depth_single_blocks": 1,
            "axes_dim": [16, 56, 56],
            "theta": 10000,
            "patch_size": 2,
            "qkv_bias": True,
            "guidance_embed": True,
        },
    ),
    "random-wan21.safetensors": (
        "comfy.ldm.wan.model",
        "WanModel",
        {"model_type": "t2v", "in_dim": 16, "dim": 256, "ffn_dim": 512, "out_dim": 16, "num_heads": 2, "num_layers": 2},
    ),
    # Wan 2.2 14B text-to-video's two experts (high noise, low noise): Wan 2.1's layout, which ComfyUI detects them as
    # (`WAN21_T2V`), at Wan 2.1's dims here; two files of their own seeds, as the two experts differ.
    "random-wan22-14b-high.safetensors": (
        "comfy.ldm.wan.model",
        "WanModel",
        {"model_type": "t2v", "in_dim": 16, "dim": 256, "ffn_dim": 512, "out_dim": 16, "num_heads": 2, "num_layers": 2},
    ),
    "random-wan22-14b-low.safetensors": (
        "comfy.ldm.wan.model",
        "WanModel",
        {"model_type": "t2v", "in_dim": 16, "dim": 256, "ffn_dim": 512, "out_dim": 16, "num_heads": 2, "num_layers": 2},
    ),
    # Wan 2.2 TI2V 5B as ComfyUI detects it (`head.head` out 48 x 4 patch values: out_dim 48, `WAN22_T2V`, the Wan22
    # latent format of 48 channels at 16x spatial compression; in_dim 48 from `patch_embedding`), at dim 256, two
    # blocks.
    "random-wan22-5b.safetensors": (
        "comfy.ldm.wan.model",
        "WanModel",
        {"model_type": "t2v", "in_dim": 48, "dim": 256, "ffn_dim": 512, "out_dim": 48, "num_heads": 2, "num_layers": 2},
    ),
    # SD3.5 as ComfyUI detects it (width 64 x depth: 256 at four blocks, 4 heads; four: its Quality and Balanced start
    # past half the depth), the first block with SD3.5 Medium's second, image-only attention.
    "random-sd35.safetensors": (
        "comfy.ldm.modules.diffusionmodules.mmdit",
        "OpenAISignatureMMDITWrapper",
        {
            "input_size": None,
            "patch_size": 2,
            "in_channels": 16,
            "out_channels": 16,
            "depth": 4,
            "adm_in_channels": 2048,
            "context_embedder_config": {
                "target": "torch.nn.Linear",
                "params": {"in_features": 4096, "out_features": 256},
            },
            "num_patches": 96 * 96,
            "pos_embed_max_size": 96,
            "pos_embed_scaling_factor": None,
            "qk_norm": "rms",
            "x_block_self_attn_layers": [0],
        },
    ),
    # Qwen-Image as ComfyUI detects it (`txt_norm.weight`; width 3072 by the class's defaults), four blocks (its Quality
    # and Balanced start past half the depth).
    "random-qwen-image.safetensors": (
        "comfy.ldm.qwen_image.model",
        "QwenImageTransformer2DModel",
        {"in_channels": 64, "out_channels": 16, "num_layers": 4},
    ),
    # Lumina 2 as ComfyUI detects it (`cap_embedder.1.weight`: width 2304, 24 heads, 8 key/value heads), two blocks.
    "random-lumina2.safetensors": (
        "comfy.ldm.lumina.model",
        "NextDiT",
        {
            "patch_size": 2,
            "in_channels": 16,
            "dim": 2304,
            "n_layers": 2,
            "n_heads": 24,
            "n_kv_heads": 8,
            "qk_norm": True,
            "cap_feat_dim": 2304,
            "axes_dims": [32, 32, 32],
            "axes_lens": [300, 512, 512],
        },
    ),
    # HunyuanVideo text-to-video as ComfyUI detects it (`txt_in.individual_token_refiner...`: the width from
    # `img_in.proj`, one head per 128 channels, depth from each stack; `vector_in` for CLIP-L's pooled vector,
    # `guidance_in` for the guidance embedding): width 256 (two heads), two double and two single blocks (four: its
    # Quality starts at 0.65 of the depth, both stacks counted).
    "random-hunyuanvideo.safetensors": (
        "comfy.ldm.hunyuan_video.model",
        "HunyuanVideo",
        {
            "in_channels": 16,
            "out_channels": 16,
            "vec_in_dim": 768,
            "context_in_dim": 4096,
            "hidden_size": 256,
            "mlp_ratio": 4.0,
            "num_heads": 2,
            "depth": 2,
            "depth_single_blocks": 2,
            "axes_dim": [16, 56, 56],
            "theta": 256,
            "patch_size": [1, 2, 2],
            "qkv_bias": True,
            "guidance_embed": True,
            "byt5": False,
            "meanflow": False,
        },
    ),
    # LTX-Video as ComfyUI detects it (`adaln_single...`: 32 heads, the head width from `attn2.to_k`, whose input
    # width is the cross-attention width, the model's own width after `caption_projection`): head width 8 (width 256),
    # T5-XXL's 4096 in, four blocks.
    "random-ltxv.safetensors": (
        "comfy.ldm.lightricks.model",
        "LTXVModel",
        {
            "in_channels": 128,
            "cross_attention_dim": 256,
            "attention_head_dim": 8,
            "num_attention_heads": 32,
            "caption_channels": 4096,
            "num_layers": 4,
        },
    ),
}

#: Each checkpoint's seed: the first five by name, as they were seeded before the video ones came (so their files, and
#: the latents they give, stay the same), then the video ones.
DIT_SEEDS = {
    name: seed
    for seed, name in enumerate(
        [
            "random-flux.safetensors",
            "random-lumina2.safetensors",
            "random-qwen-image.safetensors",
            "random-sd35.safetensors",
            "random-wan21.safetensors",
            "random-hunyuanvideo.safetensors",
            "random-ltxv.safetensors",
            "random-wan22-14b-high.safetensors",
            "random-wan22-14b-low.safetensors",
            "random-wan22-5b.safetensors",
        ]
    )
}


def random_state_dict(module: Any, seed: int) -> dict[str, Any]:
    """Seeded values for every tensor of `module` (built on the meta device): biases 0, 1-D weights (norm scales)
    1, the rest normal with std 0.02, in bfloat16."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    out = {}
    for name, meta in module.state_dict().items():
        if name.endswith("bias"):
            value = torch.zeros(meta.shape)
        elif meta.dim() == 1:
            value = torch.ones(meta.shape)
        else:
            value = torch.randn(meta.shape, generator=generator) * 0.02
        out[name] = value.to(torch.bfloat16).contiguous()
    return out


def make_dit_checkpoints(comfy: Path) -> list[Path]:
    """Write the DiT checkpoints into `comfy`'s models/diffusion_models and copy the conditioning node."""
    import importlib

    from safetensors.torch import save_file

    sys.path.insert(0, str(comfy))
    try:
        # ComfyUI's device setup runs on import; CPU, as `main.py --cpu` (its options default to no CLI parsing).
        importlib.import_module("comfy.cli_args").args.cpu = True
        ops = importlib.import_module("comfy.ops").disable_weight_init
        made = []
        for file, (module_name, class_name, kwargs) in sorted(DIT_CHECKPOINTS.items()):
            seed = DIT_SEEDS[file]
            target = comfy / "models" / "diffusion_models" / file
            made_from = json.dumps({"class": class_name, "config": kwargs, "seed": seed}, sort_keys=True)
            if target.exists() and _made_from(target) == made_from:
                continue  # seeded: the file there is the one this would write
            cls = getattr(importlib.import_module(module_name), class_name)
            module = cls(device="meta", operations=ops, **kwargs)
            target.parent.mkdir(parents=True, exist_ok=True)
            save_file(random_state_dict(module, seed), str(target), metadata={"tome_made_from": made_from})
            made.append(target)
    finally:
        sys.path.remove(str(comfy))
    node = comfy / "custom_nodes" / "tome_live_conditioning"
    shutil.rmtree(node, ignore_errors=True)
    shutil.copytree(Path(__file__).with_name("comfy_live_node"), node, ignore=shutil.ignore_patterns("__pycache__"))
    return [*made, node]


def _made_from(path: Path) -> str | None:
    """The class, config and seed a checkpoint here was made from (none for one made before they were recorded)."""
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return (f.metadata() or {}).get("tome_made_from")


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "dit":
        for path in make_dit_checkpoints(Path(argv[1])):
            print(f"wrote {path}")
        return 0
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    source, target = map(Path, argv)
    if source.resolve() == target.resolve():
        print("source and target must differ", file=sys.stderr)
        return 2
    print(f"{rename_for_comfy(source, target)} tensor names now under text_model.: {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
