"""Write a random-weight, reduced Flux.1-dev checkpoint that Forge Neo loads as Flux, for the live WebUI checks.

No download and no weights of anyone's: Neo's own classes (its checkout at `$NEO`, run with Neo's venv) are built with
random weights and saved in the single-file layout Neo's loader splits (`backend/loader.py: split_state_dict`):

* `model.diffusion_model.*`: Neo's `IntegratedFluxTransformer2DModel`, Flux.1-dev's layout (guidance embedding,
  CLIP-L pooled vector, T5 context of 4096, 2x2 patches, 16 latent channels) at a reduced width and depth:
  `--width` (a multiple of 128; Neo reads it from `img_in.weight`, the heads as width / 128), `--double` and
  `--single` blocks (Neo counts them from the keys). The QK norms are saved as `*.scale`, as Black Forest Labs' files
  hold them (Neo detects Flux from `double_blocks.0.img_attn.norm.key_norm.scale`);
* `text_encoders.clip_l.*`: Neo's `IntegratedCLIP` around `transformers.CLIPTextModel` (its local FLUX.1-dev
  config: 12 layers, 768 wide);
* `text_encoders.t5xxl.*`: Neo's `IntegratedT5` (T5-XXL's width, 4096) with `--t5-layers` layers. Neo builds T5 from
  its local `backend/huggingface/black-forest-labs/FLUX.1-dev/text_encoder_2/config.json` (24 layers, 4.7 B
  parameters, 19 GB in float32 on a CPU): for a CPU run set `num_layers` there to the same number (a local edit of
  the Neo checkout, outside this repository);
* `vae.*`: Neo's `IntegratedAutoencoderKL` with FLUX.1-dev's VAE config.

Images are noise; the same seed gives the same file (every weight is drawn from it). Usage (from Neo's root, with its venv):

    NEO=$PWD venv/bin/python <repo>/tests/webui_stub/make_random_flux.py models/Stable-diffusion/random-flux.safetensors
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--double", type=int, default=1)
    parser.add_argument("--single", type=int, default=2)
    parser.add_argument("--t5-layers", type=int, default=2)  # Neo refuses a T5 of 16 tensors or fewer (1 layer)
    parser.add_argument("--seed", type=int, default=1234)
    options = parser.parse_args()
    if options.width % 128:
        parser.error("--width must be a multiple of 128 (Neo's heads are width / 128)")

    neo = Path(os.environ["NEO"])
    # Neo's `backend` is a namespace package: the stand-in's `backend` beside this file would win over it.
    here = Path(__file__).resolve().parent
    packages = neo / "modules_forge" / "packages"  # Neo's launcher puts its vendored packages (gguf, ...) there
    sys.path[:] = [str(neo), str(packages), *(entry for entry in sys.path if Path(entry or ".").resolve() != here)]
    sys.argv = [sys.argv[0], "--cpu"]  # Neo's backend parses the command line when imported
    import torch
    from backend.nn.clip import IntegratedCLIP
    from backend.nn.flux import IntegratedFluxTransformer2DModel
    from backend.nn.t5 import IntegratedT5
    from backend.nn.vae import IntegratedAutoencoderKL
    from safetensors.torch import save_file
    from transformers import CLIPTextConfig, CLIPTextModel

    repo = neo / "backend" / "huggingface" / "black-forest-labs" / "FLUX.1-dev"
    torch.manual_seed(options.seed)
    flux = IntegratedFluxTransformer2DModel(
        in_channels=16,
        out_channels=16,
        vec_in_dim=768,
        context_in_dim=4096,
        hidden_size=options.width,
        mlp_ratio=4.0,
        num_heads=options.width // 128,
        depth=options.double,
        depth_single_blocks=options.single,
        axes_dim=[16, 56, 56],
        theta=10000,
        patch_size=2,
        qkv_bias=True,
        guidance_embed=True,
    )
    clip = IntegratedCLIP(
        CLIPTextModel, CLIPTextConfig.from_json_file(repo / "text_encoder" / "config.json"), add_text_projection=True
    )
    t5_config = json.loads((repo / "text_encoder_2" / "config.json").read_text())
    t5 = IntegratedT5({**t5_config, "num_layers": options.t5_layers})
    vae = IntegratedAutoencoderKL.from_config(IntegratedAutoencoderKL.load_config(repo / "vae"))

    # Some of Neo's layers leave their weights to the checkpoint (`torch.empty`: T5's norms read as zeros, and its
    # output with them): every parameter gets a seeded value. Matrices ~ N(0, 1/fan_in), scales 1, biases 0.
    generator = torch.Generator().manual_seed(options.seed)
    with torch.no_grad():
        for module in (flux, clip, t5, vae):
            for name, param in module.named_parameters():
                if param.dim() >= 2:
                    fan_in = param[0].numel()
                    param.copy_(torch.randn(param.shape, generator=generator) * fan_in**-0.5)
                elif param.dim() == 1:
                    param.fill_(1.0 if name.endswith(("weight", "scale")) else 0.0)

    def norm_scale(key: str) -> str:
        return key[: -len(".weight")] + ".scale" if key.endswith(("query_norm.weight", "key_norm.weight")) else key

    state: dict[str, torch.Tensor] = {}
    for prefix, module, rename in (
        ("model.diffusion_model.", flux, norm_scale),
        ("text_encoders.clip_l.", clip, str),
        ("text_encoders.t5xxl.", t5, str),
        ("vae.", vae, str),
    ):
        for key, value in module.state_dict().items():
            state[prefix + rename(key)] = value.detach().to(torch.float16).contiguous()
    options.out.parent.mkdir(parents=True, exist_ok=True)
    save_file(dict(sorted(state.items())), str(options.out))
    sizes = {name: sum(p.numel() for p in m.parameters()) for name, m in (("flux", flux), ("clip", clip), ("t5", t5))}
    print(f"wrote {options.out}: {len(state)} tensors, parameters {sizes}")


if __name__ == "__main__":
    main()
