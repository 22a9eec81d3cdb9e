"""A test-only ComfyUI custom node for the live diffusion-transformer checks (tests/test_live_comfy_dit.py): text
conditioning of the right shape from a seed, standing in for the T5-XXL / UMT5-XXL text encoders, which are far too
large for the CPU machines the live checks run on. Never shipped: `python tests/live_checkpoints.py dit COMFYUI_DIR`
copies this folder into that ComfyUI's custom_nodes as `tome_live_conditioning`."""

from __future__ import annotations

from typing import Any


class TomeLiveConditioning:
    """CONDITIONING of `tokens` text tokens of `width` channels (and a pooled vector of `pooled` channels when
    above 0: Flux's CLIP-L vector; with `kept` above 0, an attention mask keeping the first `kept` tokens, as
    Lumina 2's Gemma encoder gives), normal values from a generator seeded with `seed`: the same seed, the same
    conditioning, bitwise."""

    RETURN_TYPES = ("CONDITIONING",)
    FUNCTION = "make"
    CATEGORY = "_for_testing/tome"

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "noise_seed": ("INT", {"default": 0, "min": 0, "max": 2**31 - 1}),
                "tokens": ("INT", {"default": 8, "min": 1, "max": 512}),
                "width": ("INT", {"default": 4096, "min": 1, "max": 8192}),
                "pooled": ("INT", {"default": 768, "min": 0, "max": 8192}),
            },
            "optional": {"kept": ("INT", {"default": 0, "min": 0, "max": 512})},
        }

    def make(self, noise_seed: int, tokens: int, width: int, pooled: int, kept: int = 0) -> tuple[Any]:
        import torch

        generator = torch.Generator().manual_seed(noise_seed)
        cond = torch.randn(1, tokens, width, generator=generator)
        extra = {"pooled_output": torch.randn(1, pooled, generator=generator)} if pooled else {}
        if kept:
            extra["attention_mask"] = (torch.arange(tokens) < kept).to(torch.int64)[None]
        return ([[cond, extra]],)


NODE_CLASS_MAPPINGS = {"tome_live_Conditioning": TomeLiveConditioning}
NODE_DISPLAY_NAME_MAPPINGS = {"tome_live_Conditioning": "ToMe live test: random conditioning"}
