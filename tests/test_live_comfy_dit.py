"""Live checks of the ToMe nodes on diffusion transformers (issue 43) against a running ComfyUI, through its HTTP API.

Not run by `make test` (marker `comfy`); skipped unless `TOME_COMFY_URL` is set (the environment of
tests/test_live_comfy.py: `TOME_COMFY_URL`, `TOME_COMFY_LOG`). Setup, once per ComfyUI checkout:

    python tests/live_checkpoints.py dit ComfyUI      # random Flux, Wan, Qwen-Image, SD3.5, Lumina 2, HunyuanVideo,
                                                      # LTX-Video, Wan 2.2 (14B's two experts, TI2V 5B)
                                                      # + conditioning

then start ComfyUI with this repository in custom_nodes (`python main.py --cpu --cache-none ...`). The checkpoints
have random weights (nothing is downloaded): Flux.1 dev's layout at one double and one single block (ComfyUI fixes
the hidden size at 3072), Wan 2.1 text-to-video at dim 256 and two blocks, Lumina 2 at two blocks (width 2304 fixed
by ComfyUI), Qwen-Image at four blocks (width 3072), SD3.5 at four blocks (width 256, SD3.5 Medium's image-only attention in the
first), HunyuanVideo at two double and two single blocks (width 256), LTX-Video at four blocks (width 256); the text
encoders (T5-XXL, UMT5-XXL, Gemma 2, Qwen2.5-VL, LLaMA) are replaced by `tome_live_Conditioning`
(tests/comfy_live_node), conditioning of the right shape from a seed (Lumina 2's with an attention mask). Latents
are saved with SaveLatent and compared bitwise; sizes are tiny (128 px, 9 frames for the video models, 4 steps: the
diffusion-transformer presets reduce in a window of the later steps only, and ComfyUI's node follows the steps of each
sampling, `tome_comfy.sampling.follow_steps`; at 2 steps Quality's window, from 0.75, holds none).

Wan 2.2 (same setup, three more random checkpoints): 14B's two experts (Wan 2.1's layout, as ComfyUI loads them), each
through its own ToMe node and KSamplerAdvanced on its part of one schedule, and TI2V 5B (48 latent channels, ComfyUI's
`WAN22_T2V`), whose log line gives the 5B's speed figure (`tome_core.families.figures_family`).

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
#: Steps of each sampling unless a check says otherwise: enough that every preset's step window holds one
#: (`test_each_preset_changes_the_latent_and_logs_what_ran` asserts it from the presets' configs).
STEPS = 4
#: Custom settings that reduce every step (no step window), where a check needs ToMe to run whatever steps it gets.
EVERY_STEP = {"mode": "kv", "sx": 2, "sy": 2, "block_start": 0.0}
#: Blocks of the checkpoints that have four (tests/live_checkpoints.py: made four when these families' presets started
#: past half the depth; HunyuanVideo's are two double and two single blocks); the others have two. The block counts
#: the log should give follow from each preset's block window on these (`expected_blocks`).
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


def graph_for(family: str, steps: int = STEPS, seed: int = 1, size: int | None = None) -> dict[str, Any]:
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


def preset_config(label: str, family: str) -> Any:
    """The config a preset (by its node label) runs on `family` (`tome_core.get_preset(...).config`)."""
    import tome_core

    return tome_core.get_preset(label.lower()).config(family)


def window_steps(config: Any, steps: int) -> list[int]:
    """The steps of a `steps`-step sampling in `config`'s step window (as the node follows them: step i at i/steps)."""
    return [i for i in range(steps) if config.active_at(i / steps)]


def expected_blocks(config: Any, blocks: int) -> str:
    """What the log says ran in a checkpoint of `blocks` blocks, from the config: merged in the block window in merge
    mode (keys/values subsampled 2x2 in the other blocks with `pool_kv`: Flux.1's merged setting), else keys/values
    subsampled in the block window; each query's own key kept where keys/values are subsampled (PyTorch attention)."""
    selected = sum(config.block_selected(i, blocks) for i in range(blocks))
    merged, kv = (selected, blocks - selected if config.pool_kv else 0) if config.mode == "merge" else (0, selected)
    parts = [f"generated tokens merged in {merged}"] if merged else []
    parts += [f"keys/values subsampled{OWN} in {kv}"] if kv else []
    return rf"{' and '.join(parts)} of {blocks} blocks, text and reference tokens whole, attention by PyTorch; "


def latent_size(family: str) -> tuple[int, ...]:
    """The size the log names for a family's sampling at the default latent (width, height[, frames])."""
    inputs = MODELS[family][2][1]
    frames = (inputs["length"],) if "length" in inputs else ()
    return (inputs["width"], inputs["height"], *frames)


@pytest.mark.parametrize("preset", PRESETS)
def test_each_preset_changes_the_latent_and_logs_what_ran(family: str, reference: bytes, preset: str) -> None:
    """At `STEPS` steps every preset's window holds a step: the latent changes, the log names the blocks the config
    selects on this checkpoint and the preset's figure for the size sampled, "over a generation" for a windowed
    preset."""
    from tome_core.words import speed_words

    config = preset_config(preset, family)
    assert window_steps(config, STEPS), f"{preset}'s step window holds none of {STEPS} steps: raise STEPS"
    mark = log_mark()
    graph = graph_for(family)
    save(graph, "p", sampler(graph, "k", tome(graph, "t", preset)))
    assert run(graph)["p"] != reference
    if LOG:
        line = next(line for line in log_after(mark).splitlines() if f"{head()} ({preset} for {family})" in line)
        assert re.search(rf"\): {expected_blocks(config, BLOCKS.get(family, 2))}", line), line
        per = "over a generation" if config.step_start > 0 or config.step_end < 1 else "per step"
        assert re.search(rf"\d\.\d\d\u00d7 (faster|slower) {per} at ", line), line
        words = speed_words(preset.lower(), family, latent_size(family))
        assert words and line.endswith(f"; {words}"), (line, words)
    graph = graph_for(family)  # the next prompt without the node
    save(graph, "ref", sampler(graph, "k", ["unet", 0]))
    assert run(graph)["ref"] == reference


def test_a_step_window_that_holds_no_step_leaves_the_latent_bitwise_and_says_so(family: str) -> None:
    """At 2 steps a preset whose window starts past the second step's fraction (Quality's 0.75) reduces nothing: the
    latent is ComfyUI's own, bitwise, and the log says why."""
    steps = 2
    empty = [p for p in PRESETS if not window_steps(preset_config(p, family), steps)]
    if not empty:
        pytest.skip(f"every preset's step window holds one of {steps} steps on {family}")
    preset = empty[0]
    mark = log_mark()
    graph = graph_for(family, steps=steps)
    save(graph, "ref", sampler(graph, "k0", ["unet", 0]))
    save(graph, "p", sampler(graph, "k1", tome(graph, "t", preset)))
    out = run(graph)
    assert out["p"] == out["ref"]
    if LOG:
        line = next(line for line in log_after(mark).splitlines() if f"{head()} ({preset} for {family})" in line)
        assert "the step window excluded every step; the model ran unchanged" in line, line


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
    # Every step reduced (a preset's window would start at step 100 or later: the interrupt would land before it).
    save(graph, "long", sampler(graph, "k", tome_advanced(graph, "t", **EVERY_STEP)))
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
        assert re.search(
            rf"{re.escape(head())} \(custom settings\): sampling interrupted after \d+ model calls?; keys/values subsampled",
            log_after(mark),
        ), log_after(mark)
    graph = graph_for(family)
    save(graph, "ref", sampler(graph, "k", ["unet", 0]))
    assert run(graph)["ref"] == reference


@pytest.mark.parametrize("cache", ["EasyCache", "LazyCache"])
def test_with_easycache_or_lazycache_in_either_order_the_latent_is_the_same(family: str, cache: str) -> None:
    if (family, cache) == ("sd3", "EasyCache"):
        pytest.skip("EasyCache reuses no step of the random SD3.5 in 6 steps (0/6, 2026-11-28): nothing to compose")
    # Keys/values subsampled in every step (custom settings, no step window): the presets' windows lie in the last
    # steps, which these caches reuse at this threshold (the random Wan's: EasyCache 3/6, LazyCache 4/6, steps 3-5 of
    # Fast's window all reused: ToMe then reduced nothing and both orders gave the cache's latent, 2026-12-06).
    mark = log_mark()
    graph = graph_for(family, steps=6)
    save(graph, "cache", sampler(graph, "k0", easycache(graph, "e0", ["unet", 0], cache)))
    first = easycache(graph, "e1", tome_advanced(graph, "t1", **EVERY_STEP), cache)
    save(graph, "first", sampler(graph, "k1", first))
    second = tome_advanced(graph, "t2", easycache(graph, "e2", ["unet", 0], cache), **EVERY_STEP)
    save(graph, "second", sampler(graph, "k2", second))
    out = run(graph)
    assert out["first"] == out["second"] != out["cache"]
    if LOG:
        text = log_after(mark)
        skipped = [int(n) for n in re.findall(rf"{cache} - skipped (\d+)/6 steps", text)]
        assert len(skipped) == 3 and min(skipped) > 0, text  # the cache reused steps in each sampling
        assert text.count(f"{head()} (custom settings): keys/values subsampled") == 2


@pytest.mark.parametrize("cache", ["EasyCache", "LazyCache"])
def test_a_step_cache_reusing_windowed_steps_is_named_in_the_log(cache: str) -> None:
    """Fast on the random Wan, 6 steps, with the cache after ToMe: the caches reuse steps of Fast's window (the later
    half) at this threshold. The log line never blames the step window for it ("the step window excluded every
    step", its words for a window that holds none of the sampling's steps): where the cache reused all of the
    window's steps it names the cache, as a warning, and the latent is the cache's own; where only some, it says in
    how many of the window's steps ToMe ran."""
    need(MODELS["wan"][0])
    if not LOG:
        pytest.skip("TOME_COMFY_LOG is not set: the check reads ComfyUI's log")
    mark = log_mark()
    graph = graph_for("wan", steps=6)
    save(graph, "cache", sampler(graph, "k0", easycache(graph, "e0", ["unet", 0], cache)))
    save(graph, "both", sampler(graph, "k1", easycache(graph, "e1", tome(graph, "t1", "Fast"), cache)))
    out = run(graph)
    text = log_after(mark)
    skipped = [int(n) for n in re.findall(rf"{cache} - skipped (\d+)/6 steps", text)]
    (line,) = [ln for ln in text.splitlines() if f"{head()} (Fast for wan" in ln]
    window = len(window_steps(preset_config("Fast", "wan"), 6))
    assert skipped and max(skipped) > 0, text  # the cache reused steps
    assert "the step window excluded every step" not in line, line
    if out["both"] == out["cache"]:
        assert f"reused the model's output in all {window} steps of the step window" in line, line
    else:
        assert re.search(rf"in \d of the step window's {window} steps \(a step cache", line) or (
            "a step cache" not in line
        ), line


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


# ---------------------------------------------------------------------------------------------------- Wan 2.2

#: Wan 2.2 14B's two experts (tests/live_checkpoints.py: Wan 2.1's layout, their own seeds) and TI2V 5B.
WAN22_14B = ("random-wan22-14b-high.safetensors", "random-wan22-14b-low.safetensors")
WAN22_5B = "random-wan22-5b.safetensors"
#: A float as the log writes a sigma (`tome_comfy.sampling._sigma_text`: three significant digits).
SIGMA = r"[0-9.e+-]+"


def need(*files: str) -> None:
    _, info = request_info("UNETLoader")
    names = info["UNETLoader"]["input"]["required"]["unet_name"][0]
    missing = [f for f in files if f not in names]
    if missing:
        pytest.skip(f"no {', '.join(missing)}: run `python tests/live_checkpoints.py dit COMFYUI_DIR`")
    if request_info("tome_live_Conditioning")[0] != 200:
        pytest.skip("no tome_live_Conditioning node: run `python tests/live_checkpoints.py dit COMFYUI_DIR`")


def advanced(
    graph: dict[str, Any], name: str, model: list[Any], latent: list[Any], start: int, end: int, leftover: bool
) -> list[Any]:
    """KSamplerAdvanced on steps `start` to `end` of one schedule of `graph["_steps"]`, as Wan 2.2 14B's workflow
    runs each expert: noise added by the first, its leftover noise returned to the second."""
    graph[name] = {
        "class_type": "KSamplerAdvanced",
        "inputs": {
            "model": model,
            "add_noise": "enable" if start == 0 else "disable",
            "noise_seed": graph["_seed"],
            "steps": graph["_steps"],
            "cfg": 1.0,
            "sampler_name": "euler",
            "scheduler": "simple",
            "positive": ["pos", 0],
            "negative": ["neg", 0],
            "latent_image": latent,
            "start_at_step": start,
            "end_at_step": end,
            "return_with_leftover_noise": "enable" if leftover else "disable",
        },
    }
    return [name, 0]


def wan22_14b_graph(steps: int, presets: tuple[str, str] | None) -> dict[str, Any]:
    """The two experts on one `steps`-step schedule split at half, each model through its own ToMe node (`presets`:
    the high-noise expert's, the low-noise one's) or none; saves the high-noise part's latent ("high") and the
    generation's ("low")."""
    graph = graph_for("wan", steps=steps)
    del graph["unet"]
    for part, file in zip(("high", "low"), WAN22_14B):
        graph[f"unet_{part}"] = {"class_type": "UNETLoader", "inputs": {"unet_name": file, "weight_dtype": "default"}}
    high, low = ["unet_high", 0], ["unet_low", 0]
    if presets is not None:
        high = tome(graph, "t_high", presets[0], high)
        low = tome(graph, "t_low", presets[1], low)
    first = advanced(graph, "k_high", high, ["latent", 0], 0, steps // 2, True)
    save(graph, "high", first)
    save(graph, "low", advanced(graph, "k_low", low, first, steps // 2, steps, False))
    return graph


@pytest.fixture(scope="module")
def wan22_14b_reference() -> dict[str, bytes]:
    need(*WAN22_14B)
    return run(wan22_14b_graph(8, None))


def test_wan22_14b_experts_without_the_node_repeat_bitwise(wan22_14b_reference: dict[str, bytes]) -> None:
    out = run(wan22_14b_graph(8, None))
    assert out == wan22_14b_reference
    assert out["high"] != out["low"]


@pytest.mark.parametrize("preset", PRESETS)
def test_wan22_14b_experts_each_reduce_and_log_their_part(wan22_14b_reference: dict[str, bytes], preset: str) -> None:
    """Wan 2.2 14B's workflow at 8 steps (4 + 4), each expert through its own ToMe node: one line per sampling naming
    its part (the high-noise one ends at the sigma the low-noise one starts from), and the next prompt without the
    nodes is ComfyUI's own, bitwise. The step window lies over the whole schedule, each step placed by its sigma
    (`schedule_places`: ComfyUI's percent_to_sigma), as a diffusers pipeline running both experts counts it: the
    high-noise part (steps 0-3 of 8) is reduced only where the window opens before half of the steps (Fastest), else
    it is ComfyUI's own, bitwise, and its line says the window excluded every step."""
    steps, part_steps = 8, 4
    config = preset_config(preset, "wan")
    high_reduced = any(step / steps >= config.step_start for step in range(part_steps))
    mark = log_mark()
    out = run(wan22_14b_graph(steps, (preset, preset)))
    # A bool, not the bytes: pytest's diff of two 49 kB latents under -v takes minutes.
    high_changed = out["high"] != wan22_14b_reference["high"]
    assert high_changed == high_reduced, (
        f"high-noise part changed: {high_changed}, window holds its steps: {high_reduced}"
    )
    assert out["low"] != wan22_14b_reference["low"]
    if LOG:
        lines = [line for line in log_after(mark).splitlines() if f"{head()} ({preset} for wan)" in line]
        assert len(lines) == 2, lines
        blocks = expected_blocks(config, 2)
        high_head = rf"\) on the high-noise part of the noise schedule, {part_steps} steps from sigma 1 to ({SIGMA}): "
        high = re.search(high_head + (blocks if high_reduced else "could not apply"), lines[0])
        low = re.search(
            rf"\) on the low-noise part of the noise schedule, {part_steps} steps from sigma ({SIGMA}) to 0: {blocks}",
            lines[1],
        )
        assert high and low, lines
        assert high.group(1) == low.group(1), lines
        assert high_reduced or "the step window excluded every step" in lines[0], lines
        assert "faster over a generation" in lines[1] or "slower over a generation" in lines[1], lines
    assert run(wan22_14b_graph(steps, None)) == wan22_14b_reference


def test_wan22_14b_quality_window_lies_in_the_low_noise_part_as_in_diffusers(
    wan22_14b_reference: dict[str, bytes],
) -> None:
    """Quality's window (from 0.75 of the steps) over the whole 8-step schedule holds steps 6 and 7, both in the
    low-noise expert's part (steps 4-7): as in diffusers' two-expert pipeline, the high-noise part stays ComfyUI's
    own, bitwise (before `schedule_places`, the node counted each part's steps on their own and reduced the
    high-noise expert's last step: docs/runs/2026-12-06-live-comfy-redecided, run 3)."""
    out = run(wan22_14b_graph(8, ("Quality", "Quality")))
    assert out["low"] != wan22_14b_reference["low"]
    # A bool, not the bytes: pytest's diff of two 49 kB latents under -v takes minutes.
    high_unchanged = out["high"] == wan22_14b_reference["high"]
    assert high_unchanged, "the high-noise part's latent differs from ComfyUI's own: its sampling was reduced"


def test_wan22_14b_tome_on_the_low_noise_expert_only_leaves_the_high_noise_part_bitwise(
    wan22_14b_reference: dict[str, bytes],
) -> None:
    """One ToMe node, on the low-noise expert: the high-noise part is ComfyUI's own, bitwise, and only the
    low-noise sampling logs a line."""
    graph = wan22_14b_graph(8, None)
    graph["k_low"]["inputs"]["model"] = tome(graph, "t_low", "Fast", ["unet_low", 0])
    mark = log_mark()
    out = run(graph)
    assert out["high"] == wan22_14b_reference["high"]
    assert out["low"] != wan22_14b_reference["low"]
    if LOG:
        lines = [line for line in log_after(mark).splitlines() if head() in line]
        assert len(lines) == 1 and "on the low-noise part of the noise schedule" in lines[0], lines


def test_wan22_5b_runs_reduced_and_logs_the_5bs_figure() -> None:
    """Wan 2.2 TI2V 5B (48 latent channels, 16x spatial compression): an empty 16-channel latent of 128 px, which
    ComfyUI widens to the model's 48 channels (`comfy.sample.fix_empty_latent_channels`), samples 16x16 latent cells:
    the log names 256x256, 9 frames, and the 5B's figure there, not the 14B's."""
    from tome_core.words import speed_words

    need(WAN22_5B)
    preset = "Balanced"
    size = (256, 256, 9)
    words = speed_words(preset.lower(), "wan22-5b", size)
    assert words and words != speed_words(preset.lower(), "wan", size)  # else the check could not tell them apart

    def graph_5b(with_tome: bool) -> dict[str, Any]:
        graph = graph_for("wan")
        graph["unet"]["inputs"]["unet_name"] = WAN22_5B
        save(graph, "out", sampler(graph, "k", tome(graph, "t", preset) if with_tome else ["unet", 0]))
        return graph

    reference = run(graph_5b(False))["out"]
    mark = log_mark()
    assert run(graph_5b(True))["out"] != reference
    if LOG:
        line = next(line for line in log_after(mark).splitlines() if f"{head()} ({preset} for wan)" in line)
        assert re.search(rf"\): {expected_blocks(preset_config(preset, 'wan'), 2)}", line), line
        assert line.endswith(f"; {words}"), (line, words)
    assert run(graph_5b(False))["out"] == reference
