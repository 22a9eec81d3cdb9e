"""Live checks of the ToMe nodes on diffusion transformers (issue 43) against a running ComfyUI, through its HTTP API.

Not run by `make test` (marker `comfy`); skipped unless `TOME_COMFY_URL` is set (the environment of
tests/test_live_comfy.py: `TOME_COMFY_URL`, `TOME_COMFY_LOG`). Setup, once per ComfyUI checkout:

    python tests/live_checkpoints.py dit ComfyUI      # random Flux, Wan, Qwen-Image, SD3.5, Lumina 2, HunyuanVideo,
                                                      # LTX-Video + conditioning

then start ComfyUI with this repository in custom_nodes (`python main.py --cpu --cache-none ...`). The checkpoints
have random weights (nothing is downloaded): Flux.1 dev's layout at one double and one single block (ComfyUI fixes
the hidden size at 3072), Wan 2.1 text-to-video at dim 256 and two blocks, Lumina 2 at two blocks (width 2304 fixed
by ComfyUI), Qwen-Image at four blocks (width 3072), SD3.5 at four blocks (width 256, SD3.5 Medium's image-only attention in the
first), HunyuanVideo at two double and two single blocks (width 256), LTX-Video at four blocks (width 256); the text
encoders (T5-XXL, UMT5-XXL, Gemma 2, Qwen2.5-VL, LLaMA) are replaced by `tome_live_Conditioning`
(tests/comfy_live_node), conditioning of the right shape from a seed (Lumina 2's with an attention mask). Latents
are saved with SaveLatent and compared bitwise; sizes are tiny (128 px, 9 frames for the video models, 2-6 steps).

`TOME_COMFY_COMPILE=1` adds the TorchCompileModel checks (start ComfyUI with `--use-pytorch-cross-attention`: on a
CPU it otherwise picks sub-quadratic attention, which breaks the graph; docs/comfyui-contract.md).
"""

from __future__ import annotations

import os
import re
import threading
import time
import urllib.parse
from typing import Any

import pytest
from test_live_comfy import LOG, advanced_defaults, head, log_after, log_mark, queue, wait
from test_live_comfy import request as api

pytestmark = [
    pytest.mark.comfy,
    pytest.mark.skipif(not os.environ.get("TOME_COMFY_URL"), reason="TOME_COMFY_URL is not set"),
]

PRESETS = ("Quality", "Balanced", "Fast", "Fastest")
#: Blocks of the checkpoints that have four (tests/live_checkpoints.py: Qwen-Image's, SD3.5's and HunyuanVideo's
#: Quality and Balanced start past half the depth, so with two they would reduce none; HunyuanVideo's are two double
#: and two single blocks; LTX-Video's Quality starts at 0.35); the others have two.
BLOCKS = {"sd3": 4, "qwen": 4, "hunyuanvideo": 4, "ltx": 4}
#: family -> (checkpoint, conditioning (tokens, width, pooled), empty latent node and inputs)
MODELS: dict[str, tuple[str, tuple[int, int, int], tuple[str, dict[str, Any]]]] = {
    # SD3.5: T5-width conditioning and CLIP-L+G's pooled vector, four blocks.
    "sd3": (
        "random-sd35.safetensors",
        (8, 4096, 2048),
        ("EmptySD3LatentImage", {"width": 128, "height": 128, "batch_size": 1}),
    ),
    # Qwen-Image: Qwen2.5-VL-width conditioning, four blocks.
    "qwen": (
        "random-qwen-image.safetensors",
        (8, 3584, 0),
        ("EmptySD3LatentImage", {"width": 128, "height": 128, "batch_size": 1}),
    ),
    # Lumina 2: Gemma-width conditioning; the negative prompt keeps 5 of its 8 tokens (`KEPT`).
    "lumina2": (
        "random-lumina2.safetensors",
        (8, 2304, 0),
        ("EmptySD3LatentImage", {"width": 128, "height": 128, "batch_size": 1}),
    ),
    "flux": (
        "random-flux.safetensors",
        (8, 4096, 768),
        ("EmptySD3LatentImage", {"width": 128, "height": 128, "batch_size": 1}),
    ),
    "wan": (
        "random-wan21.safetensors",
        (16, 4096, 0),
        ("EmptyHunyuanLatentVideo", {"width": 128, "height": 128, "length": 9, "batch_size": 1}),
    ),
    # HunyuanVideo: LLaMA-width conditioning and CLIP-L's pooled vector (its `encode_adm`; the guidance embedding
    # takes model_base's default, 6.0), two double and two single blocks; 9 frames: 3 latent frames.
    "hunyuanvideo": (
        "random-hunyuanvideo.safetensors",
        (8, 4096, 768),
        ("EmptyHunyuanLatentVideo", {"width": 128, "height": 128, "length": 9, "batch_size": 1}),
    ),
    # LTX-Video: T5-XXL-width conditioning with its attention mask (`KEPT`: LTXVModel.forward takes one, as ComfyUI's
    # LTXV text encoder always gives), four blocks; 9 frames (8k + 1): 2 latent frames of 4x4 tokens.
    "ltx": (
        "random-ltxv.safetensors",
        (8, 4096, 0),
        ("EmptyLTXVLatentVideo", {"width": 128, "height": 128, "length": 9, "batch_size": 1}),
    ),
}


#: Tokens each prompt's attention mask keeps (0: no mask), positive and negative. LTX-Video's mask is its text
#: cross-attention's only: the self-attention ToMe reduces holds none.
KEPT = {"lumina2": (8, 5), "ltx": (8, 5)}
#: What the log adds where each query also attends to its own key (ComfyUI's PyTorch attention, no other override:
#: `tome_comfy.sampling.TORCH_ATTENTION`), in regex.
OWN = r" \(each query's own key kept\)"


def graph_for(family: str, steps: int = 2, seed: int = 1, size: int | None = None) -> dict[str, Any]:
    """Model, conditioning and empty latent; samplers and their outputs are added by the checks."""
    checkpoint, (tokens, width, pooled), (latent_node, latent_inputs) = MODELS[family]
    if size is not None:
        latent_inputs = {**latent_inputs, "width": size, "height": size}
    condition = {"tokens": tokens, "width": width, "pooled": pooled}
    pos, neg = KEPT.get(family, (0, 0))
    return {
        "unet": {"class_type": "UNETLoader", "inputs": {"unet_name": checkpoint, "weight_dtype": "default"}},
        "pos": {"class_type": "tome_live_Conditioning", "inputs": {"noise_seed": 7, **condition, "kept": pos}},
        "neg": {"class_type": "tome_live_Conditioning", "inputs": {"noise_seed": 8, **condition, "kept": neg}},
        "latent": {"class_type": latent_node, "inputs": latent_inputs},
        "_steps": steps,
        "_seed": seed,
    }


def sampler(graph: dict[str, Any], name: str, model: list[Any], cfg: float = 1.0) -> list[Any]:
    graph[name] = {
        "class_type": "KSampler",
        "inputs": {
            "model": model,
            "seed": graph["_seed"],
            "steps": graph["_steps"],
            "cfg": cfg,
            "sampler_name": "euler",
            "scheduler": "simple",
            "positive": ["pos", 0],
            "negative": ["neg", 0],
            "latent_image": ["latent", 0],
            "denoise": 1.0,
        },
    }
    return [name, 0]


def save(graph: dict[str, Any], name: str, samples: list[Any]) -> None:
    graph[f"{name}_save"] = {
        "class_type": "SaveLatent",
        "inputs": {"samples": samples, "filename_prefix": f"latents/tome_live_dit_{name}"},
    }


def tome(graph: dict[str, Any], name: str, preset: str, model: list[Any] | None = None) -> list[Any]:
    graph[name] = {"class_type": "tome_ToMe", "inputs": {"model": model or ["unet", 0], "preset": preset}}
    return [name, 0]


def tome_advanced(graph: dict[str, Any], name: str, model: list[Any] | None = None, **changes: Any) -> list[Any]:
    graph[name] = {
        "class_type": "tome_ToMeAdvanced",
        "inputs": {"model": model or ["unet", 0], **advanced_defaults(), **changes},
    }
    return [name, 0]


def easycache(graph: dict[str, Any], name: str, model: list[Any], node: str = "EasyCache") -> list[Any]:
    """ComfyUI's EasyCache (or LazyCache) node with a threshold high enough that it reuses steps even in a short
    sampling."""
    graph[name] = {
        "class_type": node,
        "inputs": {
            "model": model,
            "reuse_threshold": 3.0,
            "start_percent": 0.15,
            "end_percent": 0.95,
            "verbose": False,
        },
    }
    return [name, 0]


def run(graph: dict[str, Any], timeout: float = 1800) -> dict[str, bytes]:
    """Queue, wait, and return each saved latent's file (safetensors bytes) by its save node's name."""
    status, body = queue(graph)
    assert status == 200, body
    entry = wait(body["prompt_id"], timeout)
    assert entry["status"]["status_str"] == "success", entry["status"]
    out = {}
    for node, output in entry["outputs"].items():
        for latent in output.get("latents", []):
            query = urllib.parse.urlencode({k: latent[k] for k in ("filename", "subfolder", "type")})
            _, raw = api(f"/view?{query}")
            out[node.removesuffix("_save")] = latent_tensor(raw)
    return out


def latent_tensor(raw: bytes) -> bytes:
    """The saved latent's values (SaveLatent's safetensors file also holds metadata: the prompt, which differs)."""
    from safetensors.torch import load

    tensor = load(raw)["latent_tensor"]
    assert tensor.isfinite().all(), "the latent holds NaN or inf: the checkpoint or conditioning is broken"
    return tensor.numpy().tobytes()


@pytest.fixture(scope="module", params=list(MODELS))
def family(request: Any) -> str:
    name = request.param
    _, info = request_info("UNETLoader")
    names = info["UNETLoader"]["input"]["required"]["unet_name"][0]
    if MODELS[name][0] not in names:
        pytest.skip(f"no {MODELS[name][0]}: run `python tests/live_checkpoints.py dit COMFYUI_DIR` and restart")
    if request_info("tome_live_Conditioning")[0] != 200:
        pytest.skip("no tome_live_Conditioning node: run `python tests/live_checkpoints.py dit COMFYUI_DIR`")
    return name


def request_info(node: str) -> tuple[int, Any]:
    status, info = api(f"/object_info/{node}")
    return (status if info else 404), info


@pytest.fixture(scope="module")
def reference(family: str) -> bytes:
    graph = graph_for(family)
    save(graph, "ref", sampler(graph, "k", ["unet", 0]))
    return run(graph)["ref"]


def test_without_the_node_the_latent_repeats_bitwise(family: str, reference: bytes) -> None:
    graph = graph_for(family)
    save(graph, "ref", sampler(graph, "k", ["unet", 0]))
    assert run(graph)["ref"] == reference


@pytest.mark.parametrize("preset", PRESETS)
def test_each_preset_changes_the_latent_and_logs_what_ran(family: str, reference: bytes, preset: str) -> None:
    mark = log_mark()
    graph = graph_for(family)
    save(graph, "p", sampler(graph, "k", tome(graph, "t", preset)))
    assert run(graph)["p"] != reference
    if LOG:
        line = next(line for line in log_after(mark).splitlines() if f"{head()} ({preset} for {family})" in line)
        assert re.search(
            rf": keys/values subsampled{OWN} in \d+ of \d+ blocks, text and reference tokens whole, attention by PyTorch; ",
            line,
        )
    graph = graph_for(family)  # the next prompt without the node
    save(graph, "ref", sampler(graph, "k", ["unet", 0]))
    assert run(graph)["ref"] == reference


def test_custom_settings_run_and_unet_only_values_are_refused_naming_the_field(family: str, reference: bytes) -> None:
    mark = log_mark()
    graph = graph_for(family)
    save(graph, "c", sampler(graph, "k", tome_advanced(graph, "t", mode="kv", sx=4, sy=4, block_start=0.5)))
    assert run(graph)["c"] != reference
    if LOG:  # from half the depth on: the second half of the checkpoint's blocks (two or four, `BLOCKS`)
        blocks = BLOCKS.get(family, 2)
        kv = f"keys/values subsampled{OWN}"
        assert re.search(
            rf"{re.escape(head())} \(custom settings\): {kv} in {blocks // 2} of {blocks} blocks", log_after(mark)
        )
    # The advanced node's defaults (merge at ratio 0.5, a UNet's settings) and a UNet-only field: refused by the node,
    # naming the field (which field for the defaults is the core's rule for the model).
    for changes, named in (({}, r"TomeConfig\.\w+"), ({"mode": "kv", "merge_mlp": True}, r"TomeConfig\.merge_mlp")):
        graph = graph_for(family)
        save(graph, "bad", sampler(graph, "k", tome_advanced(graph, "t", **changes)))
        status, body = queue(graph)
        assert status == 200, body
        entry = wait(body["prompt_id"])
        assert entry["status"]["status_str"] == "error"
        text = str(entry["status"]["messages"])
        assert re.search(named, text) and "tome_ToMeAdvanced" in text, text
    graph = graph_for(family)
    save(graph, "bad", sampler(graph, "k", tome_advanced(graph, "t", mode="kv", ratio=2.0)))
    status, body = queue(graph)
    assert status == 400
    assert any("ratio" in (e.get("details", "") + e.get("message", "")) for e in body["node_errors"]["t"]["errors"])


def test_flux_blocks_run_on_merged_tokens_in_merge_mode(family: str, reference: bytes) -> None:
    """The core's merge mode on ComfyUI's Flux (every generated token merged into one per 2x2 cell, ratio 0.75):
    runs, changes the latent, says so, and leaves the next prompt bitwise."""
    if family != "flux":
        pytest.skip("merge mode runs on Flux's blocks only")
    mark = log_mark()
    graph = graph_for(family)
    save(graph, "m", sampler(graph, "k", tome_advanced(graph, "t", mode="merge", ratio=0.75)))
    assert run(graph)["m"] != reference
    if LOG:
        assert f"{head()} (custom settings): generated tokens merged in 2 of 2 blocks" in log_after(mark)
    graph = graph_for(family)
    save(graph, "ref", sampler(graph, "k", ["unet", 0]))
    assert run(graph)["ref"] == reference


def test_an_interrupted_prompt_leaves_nothing_behind(family: str, reference: bytes) -> None:
    mark = log_mark()
    # Steps enough that the interrupt lands while sampling on the fastest model here (the Wan one runs ~15 steps a
    # second); tqdm's line may skip "1/N" when steps are that fast, so any step counts.
    graph = graph_for(family, steps=400)
    save(graph, "long", sampler(graph, "k", tome(graph, "t", "Fastest")))
    status, body = queue(graph)
    assert status == 200, body
    started = time.time()
    if LOG:  # until the sampler has done a step
        while time.time() - started < 600 and not re.search(r" [1-9]\d*/400 \[", log_after(mark)):
            time.sleep(0.5)
    else:
        time.sleep(20)
    threading.Thread(target=api, args=("/interrupt", {})).start()
    entry = wait(body["prompt_id"])
    assert entry["status"]["status_str"] == "error"
    if LOG:
        assert f"{head()} (Fastest for {family}): sampling interrupted after" in log_after(mark)
    graph = graph_for(family)
    save(graph, "ref", sampler(graph, "k", ["unet", 0]))
    assert run(graph)["ref"] == reference


@pytest.mark.parametrize("cache", ["EasyCache", "LazyCache"])
def test_with_easycache_or_lazycache_in_either_order_the_latent_is_the_same(family: str, cache: str) -> None:
    if (family, cache) == ("sd3", "EasyCache"):
        pytest.skip("EasyCache reuses no step of the random SD3.5 in 6 steps (0/6, 2026-11-28): nothing to compose")
    mark = log_mark()
    graph = graph_for(family, steps=6)
    save(graph, "cache", sampler(graph, "k0", easycache(graph, "e0", ["unet", 0], cache)))
    save(graph, "first", sampler(graph, "k1", easycache(graph, "e1", tome(graph, "t1", "Fast"), cache)))
    save(graph, "second", sampler(graph, "k2", tome(graph, "t2", "Fast", easycache(graph, "e2", ["unet", 0], cache))))
    out = run(graph)
    assert out["first"] == out["second"] != out["cache"]
    if LOG:
        text = log_after(mark)
        skipped = [int(n) for n in re.findall(rf"{cache} - skipped (\d+)/6 steps", text)]
        assert len(skipped) == 3 and min(skipped) > 0, text  # the cache reused steps in each sampling
        assert text.count(f"{head()} (Fast for {family}): keys/values subsampled") == 2


@pytest.mark.skipif(not os.environ.get("TOME_COMFY_COMPILE"), reason="TOME_COMFY_COMPILE is not set")
@pytest.mark.parametrize("order", ["ToMe, then TorchCompileModel", "TorchCompileModel, then ToMe"])
def test_under_torch_compile_model_in_either_order(family: str, order: str) -> None:
    mark = log_mark()
    graph = graph_for(family, size=64)
    save(graph, "eager", sampler(graph, "k0", tome(graph, "t0", "Fast")))
    compile_node = {"class_type": "TorchCompileModel", "inputs": {"backend": "inductor"}}
    if order.startswith("ToMe"):
        graph["c"] = {**compile_node, "inputs": {**compile_node["inputs"], "model": tome(graph, "t1", "Fast")}}
        model = ["c", 0]
    else:
        graph["c"] = {**compile_node, "inputs": {**compile_node["inputs"], "model": ["unet", 0]}}
        model = tome(graph, "t1", "Fast", ["c", 0])
    save(graph, "compiled", sampler(graph, "k1", model))
    out = run(graph, timeout=3600)
    import numpy as np

    eager, compiled = (np.frombuffer(out[k], dtype=np.float32) for k in ("eager", "compiled"))
    assert np.abs(eager - compiled).max() <= 1e-3 * max(1.0, float(np.abs(eager).max()))
    if LOG:
        assert "under torch.compile (backend inductor)" in log_after(mark)
