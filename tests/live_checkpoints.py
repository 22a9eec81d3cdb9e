"""Make a random-weight checkpoint from shared/tools loadable by ComfyUI, for the live suites.

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


def main(argv: list[str]) -> int:
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
