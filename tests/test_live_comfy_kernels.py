"""Live checks of each query's own key under SageAttention (issue 58) against a running ComfyUI started with
`--use-sage-attention`, through its HTTP API.

Not run by `make test` (marker `comfy`); skipped unless `TOME_COMFY_URL` and `TOME_COMFY_SAGE=1` are set, with the
environment of tests/test_live_comfy_dit.py (its checkpoints and `tome_live_Conditioning` node, `TOME_COMFY_LOG`).
The server runs the stand-in `sageattention` package (tests/kernel_standins: SageAttention 2.x's signature, INT8 q/k,
smooth_k, fp16/bf16 only) under its real module name:

    PYTHONPATH=<this checkout>/tests/kernel_standins python main.py --cpu --cache-none --use-sage-attention ...

ComfyUI computes in float32 on a CPU; ComfyUI's own ModelComputeDtype node (bf16) makes the model run in 16 bits,
as on a GPU, where SageAttention runs.
"""

from __future__ import annotations

import os
import re
from typing import Any

import pytest
from test_live_comfy import LOG, head, log_after, log_mark
from test_live_comfy_dit import KEPT, MODELS, graph_for, request_info, run, sampler, save, tome

pytestmark = [
    pytest.mark.comfy,
    pytest.mark.skipif(
        not (os.environ.get("TOME_COMFY_URL") and os.environ.get("TOME_COMFY_SAGE")),
        reason="TOME_COMFY_URL and TOME_COMFY_SAGE (a server started with --use-sage-attention) are not set",
    ),
]

#: The families whose attention calls hold no mask (Lumina 2's captions have one: below).
PLAIN = ("flux", "wan", "qwen", "sd3")


def bf16(graph: dict[str, Any], model: list[Any]) -> list[Any]:
    graph["dtype"] = {"class_type": "ModelComputeDtype", "inputs": {"model": model, "dtype": "bf16"}}
    return ["dtype", 0]


def masked_graph(family: str) -> dict[str, Any]:
    """`graph_for(family)`, Lumina 2's positive prompt masked as its negative one is: at cfg 1 ComfyUI runs the
    positive prompt only, and Lumina 2 passes no mask that keeps every token (model_base.Lumina2.extra_conds)."""
    graph = graph_for(family)
    if family in KEPT:
        graph["pos"]["inputs"]["kept"] = KEPT[family][1]
    return graph


def line_of(mark: int, family: str) -> str:
    return next(line for line in log_after(mark).splitlines() if f"{head()} (Balanced for {family})" in line)


@pytest.fixture(scope="module", params=[*PLAIN, "lumina2"])
def family(request: Any) -> str:
    name = request.param
    _, info = request_info("UNETLoader")
    if MODELS[name][0] not in info["UNETLoader"]["input"]["required"]["unet_name"][0]:
        pytest.skip(f"no {MODELS[name][0]}: run `python tests/live_checkpoints.py dit COMFYUI_DIR` and restart")
    return name


@pytest.mark.skipif(not LOG, reason="TOME_COMFY_LOG is not set")
def test_in_16_bits_queries_keep_their_own_key_through_sageattn(family: str) -> None:
    """The server's attention function is attention_sage; ToMe runs its `sageattn` on the kept keys with
    `return_lse=True` and joins each query's own key, and the log names SageAttention. Lumina 2's calls hold a mask,
    which SageAttention cannot take: there ComfyUI's function runs them with the reduced keys, and the log says so.
    Without the node the latent repeats bitwise."""
    assert "Using sage attention" in log_after(0)
    graph = masked_graph(family)
    save(graph, "ref", sampler(graph, "k", bf16(graph, ["unet", 0])))
    reference = run(graph)["ref"]
    mark = log_mark()
    graph = masked_graph(family)
    save(graph, "p", sampler(graph, "k", tome(graph, "t", "Balanced", bf16(graph, ["unet", 0]))))
    assert run(graph)["p"] != reference
    line, after = line_of(mark, family), log_after(mark)
    if family in PLAIN:
        assert re.search(
            r": keys/values subsampled \(each query's own key kept\) in \d+ of \d+ blocks, text and reference tokens"
            r" whole, attention by SageAttention; ",
            line,
        ), line
        assert "tome stand-in sageattn: return_lse=True, torch.bfloat16" in after
    else:
        assert re.search(
            r", attention by attention_sage; each query's own key off in (\d+) of \1: SageAttention takes no attention"
            r" mask; ",
            line,
        ), line
    graph = masked_graph(family)
    save(graph, "ref", sampler(graph, "k", bf16(graph, ["unet", 0])))
    assert run(graph)["ref"] == reference


@pytest.mark.skipif(not LOG, reason="TOME_COMFY_LOG is not set")
def test_in_float32_comfyuis_function_runs_the_calls_and_the_log_says_why(family: str) -> None:
    """On a CPU ComfyUI computes in float32, which SageAttention does not run: ComfyUI's attention_sage takes the
    calls (and falls back to PyTorch's attention, as it does without ToMe), and the log says the own key was off."""
    if family not in PLAIN:
        pytest.skip("Lumina 2's mask decides first (the check above)")
    mark = log_mark()
    graph = graph_for(family)
    save(graph, "p", sampler(graph, "k", tome(graph, "t", "Balanced")))
    run(graph)
    assert re.search(
        r", attention by attention_sage; each query's own key off in (\d+) of \1: SageAttention does not run float32;",
        line_of(mark, family),
    )
