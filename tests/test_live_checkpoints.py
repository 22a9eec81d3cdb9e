"""The live suites' checkpoint fix-up (tests/live_checkpoints.py): a shared/tools SDXL checkpoint names its CLIP-L
tensors without `text_model.`, which ComfyUI does not find (NaN images); the rewrite adds it and keeps every byte."""

from __future__ import annotations

from pathlib import Path

import torch
from live_checkpoints import comfy_key, rename_for_comfy
from safetensors.torch import load_file, save_file

MAKER_KEYS = {  # as make_random_sdxl.py names them
    "conditioner.embedders.0.transformer.embeddings.token_embedding.weight": (49408 // 64, 8),
    "conditioner.embedders.0.transformer.encoder.layers.0.mlp.fc1.weight": (4, 3),
    "conditioner.embedders.0.transformer.final_layer_norm.bias": (8,),
    "conditioner.embedders.1.model.transformer.resblocks.0.attn.in_proj_weight": (6, 2),
    "model.diffusion_model.input_blocks.0.0.weight": (5, 4, 3, 3),
    "first_stage_model.decoder.conv_in.bias": (3,),
}


def test_comfy_finds_clip_l_under_text_model_and_every_tensor_is_kept(tmp_path: Path) -> None:
    generator = torch.Generator().manual_seed(0)
    tensors = {key: torch.randn(shape, generator=generator) for key, shape in MAKER_KEYS.items()}
    tensors["first_stage_model.decoder.conv_in.bias"] = tensors["first_stage_model.decoder.conv_in.bias"].half()
    save_file(tensors, tmp_path / "maker.safetensors")

    assert rename_for_comfy(tmp_path / "maker.safetensors", tmp_path / "comfy.safetensors") == 3
    loaded = load_file(tmp_path / "comfy.safetensors")
    assert sorted(loaded) == sorted(comfy_key(key) for key in tensors)
    assert "conditioner.embedders.0.transformer.text_model.encoder.layers.0.mlp.fc1.weight" in loaded
    assert "conditioner.embedders.1.model.transformer.resblocks.0.attn.in_proj_weight" in loaded  # bigG as it was
    for key, tensor in tensors.items():
        assert torch.equal(loaded[comfy_key(key)], tensor) and loaded[comfy_key(key)].dtype == tensor.dtype
    assert comfy_key(comfy_key(next(iter(MAKER_KEYS)))) == comfy_key(next(iter(MAKER_KEYS)))  # idempotent
