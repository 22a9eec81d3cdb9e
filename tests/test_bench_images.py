"""`python -m tome_bench images --checkpoint FILE` (issue 38): a user's checkpoint, unpatched and at each preset,
decoded by its own VAE into a labelled grid with the numbers beside it. On a tiny random-weight checkpoint in the
single-file (LDM) layout, built here: the original `ldm` UNet and VAE (stable-diffusion-sdkit) and a CLIP text encoder,
64 px, 2 Euler steps, one thread; nothing is downloaded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from PIL import Image

import tome_bench
import tome_core
from tome_bench import archs, images

TINY_VOCAB = 514  # CLIP's byte-level vocabulary without merges: 2 x 256 symbols and the two special tokens
PRESETS = [p.name for p in tome_core.presets()]


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _byte_symbols() -> list[str]:
    """CLIP's byte-to-unicode table (the BPE alphabet), as openai/CLIP and transformers build it."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = [b for b in range(256) if b not in printable]
    return [chr(c) for c in printable] + [chr(256 + i) for i in range(len(extra))]


def make_tokenizer(folder: Path) -> Path:
    """A CLIP tokenizer folder with the byte-level vocabulary only: real CLIP tokenization, 514 ids."""
    folder.mkdir(parents=True, exist_ok=True)
    symbols = _byte_symbols()
    vocab = [*symbols, *(s + "</w>" for s in symbols), "<|startoftext|>", "<|endoftext|>"]
    assert len(vocab) == TINY_VOCAB
    (folder / "vocab.json").write_text(json.dumps({token: i for i, token in enumerate(vocab)}))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    special = {"bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"}
    config = {"tokenizer_class": "CLIPTokenizer", "model_max_length": 77, "pad_token": "<|endoftext|>", **special}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def make_checkpoint(path: Path) -> Path:
    """A tiny SD1-like single-file checkpoint with the real key layout: `model.diffusion_model.*` (an ldm
    `UNetModel` shaped like `archs.TINY_CONFIG`), `first_stage_model.*` (ldm's VAE encoder/decoder, 8x downsampling)
    and `cond_stage_model.transformer.text_model.*` (a 2-layer CLIP text encoder, 32 wide like the UNet's context)."""
    from ldm.modules.diffusionmodules.model import Decoder, Encoder
    from ldm.modules.diffusionmodules.openaimodel import UNetModel
    from safetensors.torch import save_file
    from transformers import CLIPTextConfig, CLIPTextModel

    torch.manual_seed(0)
    unet = UNetModel(
        image_size=16,
        in_channels=4,
        out_channels=4,
        model_channels=32,
        attention_resolutions=(1,),
        num_res_blocks=1,
        channel_mult=(1, 2),
        num_heads=4,
        use_spatial_transformer=True,
        transformer_depth=1,
        context_dim=32,
        use_checkpoint=False,
        legacy=False,
    )
    archs.randomize_(unet, seed=1)  # the ldm UNet zero-initialises its output layers: random, as the maker's are
    ddconfig = {"double_z": True, "z_channels": 4, "resolution": 64, "in_channels": 3, "out_ch": 3, "ch": 32}
    ddconfig.update(ch_mult=(1, 1, 1, 1), num_res_blocks=1, attn_resolutions=(), dropout=0.0)
    encoder, decoder = Encoder(**ddconfig), Decoder(**ddconfig)
    text = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=TINY_VOCAB,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=1,
            max_position_embeddings=77,
            bos_token_id=512,
            eos_token_id=513,
        )
    )
    state = {f"model.diffusion_model.{k}": v for k, v in unet.state_dict().items()}
    state |= {f"first_stage_model.encoder.{k}": v for k, v in encoder.state_dict().items()}
    state |= {f"first_stage_model.decoder.{k}": v for k, v in decoder.state_dict().items()}
    state["first_stage_model.quant_conv.weight"] = torch.randn(8, 8, 1, 1) * 0.3
    state["first_stage_model.quant_conv.bias"] = torch.zeros(8)
    state["first_stage_model.post_quant_conv.weight"] = torch.randn(4, 4, 1, 1) * 0.3
    state["first_stage_model.post_quant_conv.bias"] = torch.zeros(4)
    prefix = "cond_stage_model.transformer.text_model."
    state |= {prefix + k.removeprefix("text_model."): v for k, v in text.state_dict().items()}
    save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    return path


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-sd1.safetensors")


ARGV = ["--arch", "tiny", "--sizes", "64", "--steps", "2", "--device", "cpu", "--threads", "1"]


def test_images_writes_a_labelled_grid_and_the_numbers_of_every_preset(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One command: the unpatched model and every preset, one tile each with its label, the grid PNG, the numbers
    (PSNR, HF kept, latent change per preset) in images.json and images.md; without CLIP's tokenizer on this machine
    seeded text states stand in, and the grid, the JSON and the console say so."""
    out = tmp_path / "out"
    assert tome_bench.main(["images", "--checkpoint", str(checkpoint), *ARGV, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    grid = Image.open(out / "images.png")
    tiles = json.loads(grid.text["tiles"])
    labels = ["unpatched", *(p.label for p in tome_core.presets())]
    assert [t[0] for t in tiles] == labels
    assert all(any("speed" in line for line in t) for t in tiles[1:])
    assert grid.width >= len(labels) * images.MIN_TILE  # one tile per variant, side by side
    for variant in ["unpatched", *PRESETS]:
        assert Image.open(out / "images" / f"{variant}.png").size == (64, 64)

    data = json.loads((out / "images.json").read_text())
    assert data["prompt_encoded"] is False and "seeded random text states" in data["text"]
    assert "seeded random text states" in printed and "seeded random text states" in (out / "images.md").read_text()
    rows = {r["variant"]: r for r in data["rows"]}
    assert list(rows) == ["unpatched", *PRESETS]
    assert rows["unpatched"]["fields"] is None and rows["unpatched"]["latent_change"] == 0.0
    for name in PRESETS:
        row = rows[name]
        assert row["error"] is None and row["fields"] is not None, name
        assert row["speed"] > 0 and len(row["times_s"]) == 1, name
        assert {"psnr_db", "hf_kept", "latent_change"} <= set(row), name
        # every preset pools keys/values in the tiny UNet's attention (levels 1 and 2): each changes the image
        assert row["latent_change"] > 0 and row["psnr_db"] > 20 and 0 < row["hf_kept"] < 10, name
    md = (out / "images.md").read_text()
    assert "| Quality |" in md and "HF kept" in md and "![grid](images.png)" in md


def test_images_encode_the_prompt_with_the_checkpoints_text_encoder_when_a_tokenizer_is_local(
    checkpoint: Path, tmp_path: Path
) -> None:
    """With a CLIP tokenizer on the machine the checkpoint's own text encoder encodes --prompt: another prompt gives
    another image, and the grid's caption quotes the prompt."""
    tokenizer = make_tokenizer(tmp_path / "tokenizer")
    finals = []
    for prompt in ("a red lighthouse", "a green forest"):
        out = tmp_path / prompt.replace(" ", "-")
        argv = ["--checkpoint", str(checkpoint), *ARGV, "--presets", "quality", "--prompt", prompt]
        argv += ["--out", str(out)]
        assert images.main(argv, tokenizer_source=str(tokenizer)) == 0
        data = json.loads((out / "images.json").read_text())
        assert data["prompt_encoded"] is True and "text encoder" in data["text"]
        assert prompt in (out / "images.md").read_text()
        finals.append(torch.tensor(list(Image.open(out / "images" / "unpatched.png").getdata()), dtype=torch.float32))
    assert not torch.equal(finals[0], finals[1])


def make_sdxl_checkpoint(path: Path, sd1: Path) -> Path:
    """A tiny SDXL-like checkpoint with SDXL's text-encoder layout: `conditioner.embedders.0.transformer.*` (CLIP,
    16 wide) and `conditioner.embedders.1.model.*` (OpenCLIP's own names: resblocks, in_proj, text_projection; 16
    wide, projecting to 16: the UNet's context 16 + 16 and pooled width), the tiny SD1 VAE, and the UNet in
    diffusers' names under `unet.` (no LDM UNet of SDXL's shape is installed to write its names; that layout's loader
    is `archs.load_checkpoint`'s, tested in test_bench.py)."""
    from safetensors.torch import load_file, save_file
    from transformers import CLIPTextConfig, CLIPTextModel

    state = {k: v for k, v in load_file(str(sd1)).items() if k.startswith("first_stage_model.")}
    state |= {f"unet.{k}": v for k, v in archs.build_unet("tiny-xl", seed=3).state_dict().items()}
    config = CLIPTextConfig(vocab_size=TINY_VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2)
    config.update({"num_attention_heads": 1, "max_position_embeddings": 77, "bos_token_id": 512, "eos_token_id": 513})
    prefix = "conditioner.embedders.0.transformer.text_model."
    state |= {prefix + k.removeprefix("text_model."): v for k, v in CLIPTextModel(config).state_dict().items()}
    gen = torch.Generator().manual_seed(5)
    p, width = "conditioner.embedders.1.model.", 16

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * 0.1

    state |= {f"{p}token_embedding.weight": rand(TINY_VOCAB, width), f"{p}positional_embedding": rand(77, width)}
    state |= {f"{p}ln_final.weight": torch.ones(width), f"{p}ln_final.bias": torch.zeros(width)}
    state[f"{p}text_projection"] = rand(width, 16)
    for i in range(2):
        block = f"{p}transformer.resblocks.{i}."
        for norm in ("ln_1", "ln_2"):
            state |= {f"{block}{norm}.weight": torch.ones(width), f"{block}{norm}.bias": torch.zeros(width)}
        state |= {f"{block}attn.in_proj_weight": rand(3 * width, width), f"{block}attn.in_proj_bias": rand(3 * width)}
        state |= {f"{block}attn.out_proj.weight": rand(width, width), f"{block}attn.out_proj.bias": rand(width)}
        state |= {f"{block}mlp.c_fc.weight": rand(2 * width, width), f"{block}mlp.c_fc.bias": rand(2 * width)}
        state |= {f"{block}mlp.c_proj.weight": rand(width, 2 * width), f"{block}mlp.c_proj.bias": rand(width)}
    save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    return path


def test_images_on_sdxl_encode_the_prompt_with_both_text_encoders(checkpoint: Path, tmp_path: Path) -> None:
    """SDXL: CLIP and OpenCLIP (converted by diffusers' `convert_open_clip_checkpoint`) encode the prompt, the pooled
    embedding and the size conditioning reach the UNet through the SDXL pipeline, every preset gets a tile."""
    xl = make_sdxl_checkpoint(tmp_path / "tiny-xl.safetensors", checkpoint)
    out = tmp_path / "out"
    argv = ["--checkpoint", str(xl), *ARGV, "--out", str(out)]
    argv[argv.index("tiny")] = "tiny-xl"
    assert images.main(argv, tokenizer_source=str(make_tokenizer(tmp_path / "tok"))) == 0
    data = json.loads((out / "images.json").read_text())
    assert data["prompt_encoded"] and "OpenCLIP text encoder" in data["text"] and data["arch"] == "tiny-xl"
    rows = {r["variant"]: r for r in data["rows"]}
    assert list(rows) == ["unpatched", *PRESETS] and all(r["error"] is None for r in rows.values())
    assert rows["fastest"]["latent_change"] > 0


def test_hf_energy_is_detail_above_a_quarter_of_nyquist() -> None:
    """A flat image has none; blurring keeps less; an image against itself keeps all; PSNR is None when equal."""
    sharp = torch.rand(3, 64, 64, generator=torch.Generator().manual_seed(0))
    blurred = torch.nn.functional.avg_pool2d(sharp[None], 3, stride=1, padding=1, count_include_pad=False)[0]
    assert images.hf_energy(torch.full((3, 64, 64), 0.5)) == 0.0
    assert images.hf_kept(blurred, sharp) < 0.5
    assert images.hf_kept(sharp, sharp) == 1.0 and images.psnr(sharp, sharp) is None
    assert images.psnr(blurred, sharp) == pytest.approx(-10 * torch.log10(((blurred - sharp) ** 2).mean()).item())
    # a pattern with a period of 4 px is high frequency, one of 32 px is not
    x = torch.arange(64, dtype=torch.float64)
    fine, coarse = (0.5 + 0.5 * torch.sin(2 * torch.pi * x / p).expand(3, 64, 64) for p in (4, 32))
    assert images.hf_energy(fine) > 0 and images.hf_energy(coarse) == pytest.approx(0.0, abs=1e-6)


def test_images_options_name_what_is_missing_or_not_taken(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    given = ["--checkpoint", str(checkpoint), "--arch", "tiny"]
    for argv, words in (
        ([], "the following arguments are required: --checkpoint"),
        ([*given, "--ratios", "0.3"], "unrecognized arguments: --ratios"),
        ([*given, "--sizes", "64,128"], "one grid of one architecture at one size"),
        (["--checkpoint", str(tmp_path / "none.safetensors")], "must be a .safetensors file"),
    ):
        with pytest.raises(SystemExit) as info:
            images.parse_options(argv)
        assert info.value.code == 2 and words in capsys.readouterr().err
    opts = images.parse_options(given)
    assert opts.job == "images" and opts.steps == 20 and opts.presets == PRESETS and opts.prompt == images.PROMPT
    assert opts.sizes_of("tiny") == [(128, 128)] and opts.repeats == 1 and not opts.main_job
    with pytest.raises(ValueError, match=r"not an SD1\.5 or SDXL checkpoint"):
        archs.checkpoint_arch(checkpoint)  # 32-wide text states: the tiny test model, named with --arch
    # a checkpoint without a VAE: an error that says so, no traceback
    from safetensors.torch import load_file, save_file

    unet_only = tmp_path / "unet-only.safetensors"
    save_file({k: v for k, v in load_file(str(checkpoint)).items() if k.startswith("model.")}, str(unet_only))
    argv = ["images", "--checkpoint", str(unet_only), *ARGV, "--out", str(tmp_path / "o")]
    assert tome_bench.main(argv) == 2 and "holds no VAE (first_stage_model.*" in capsys.readouterr().err


def test_the_readme_shows_the_command_and_the_webui_check() -> None:
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    assert "python -m tome_bench images --checkpoint model.safetensors" in readme
    assert "XYZ plot over **Speed**" in readme and "high-frequency energy" in readme
