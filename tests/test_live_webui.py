"""Against a running WebUI (A1111 1.10, Forge 2, Forge Neo, reForge, Forge Classic, SD.Next) with the extension.

Not run by `make test` (marker `webui`); skipped unless `TOME_WEBUI_URL` is set. Environment:

    TOME_WEBUI_URL       the server, e.g. http://127.0.0.1:7860 (started with --api)
    TOME_WEBUI_HOST      "a1111" (default) or "forge": Forge 2's API needs `hr_additional_modules` for hires
                         requests and answers HTTP 500 to any `infotext` request field (a host bug); or "neo":
                         Forge Neo, with Forge 2's two API bugs (`hires`, `API_INFOTEXT_MISSING`), no StyleAlign
                         (its ControlNet's reference_only replaces the self-attention instead), its built-in
                         Torch Compile Integrated and epsilon scaling; or "sdnext": a latent hires upscaler with a
                         resize mode, its built-in is `token_merging_method` plus `tome_ratio` (infotext
                         `ToMe: <ratio>`), its API has no `infotext` request field
    TOME_WEBUI_ARCH      "sd15" (default: 256 px, 3 steps: Fast's 8x8 cells fit the level-4 grid) or "sdxl"
                         (256 px, 2 steps, live previews off): also the model family the speed presets must
                         resolve for ("sd" for SD1.x/SD2.x checkpoints)
    TOME_WEBUI_CHECKPOINT  optional: a checkpoint title every request selects (`sd_model_checkpoint`)
    TOME_WEBUI_BASELINE  optional: a PNG the same server made for `plain_request()` with the extension absent
                         (`extensions/` without it); ToMe off must give bitwise the same pixels
    TOME_WEBUI_EVIDENCE  optional: a folder that receives each response's `info` as JSON (and, for Neo's compile
                         check, a summary per preset: seconds and recompiles per generation, pixel differences)
    TOME_WEBUI_SERVER_LOG  optional: the server's stdout/stderr as a file, the server started with
                         `TORCH_LOGS=recompiles`: Neo's compile check then counts dynamo's recompiles per generation
                         and asserts none in a second ToMe generation or in the generation without ToMe after it

Run: `TOME_WEBUI_URL=http://127.0.0.1:7860 python -m pytest -m webui tests/test_live_webui.py -v`.
How each host was built and started here: docs/hosts.md (Forge Neo, SD.Next) and the README's compatibility table.
"""

from __future__ import annotations

import base64
import io
import json
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

pytestmark = [
    pytest.mark.webui,
    pytest.mark.skipif(not os.environ.get("TOME_WEBUI_URL"), reason="TOME_WEBUI_URL is not set"),
]

URL = os.environ.get("TOME_WEBUI_URL", "").rstrip("/")
HOST = os.environ.get("TOME_WEBUI_HOST", "a1111")
ARCH = os.environ.get("TOME_WEBUI_ARCH", "sd15")
# 256 px for SD1/SD2 too: Fast and Fastest merge level 4 in 8x8 cells, a 32x32 latent's level-4 grid (8x8) is the
# smallest that holds one (at 128 px the infotext rightly notes those blocks ran unmerged).
SIZE, STEPS = (256, 2) if ARCH == "sdxl" else (256, 3)
FAMILY = "sdxl" if ARCH == "sdxl" else "sd"
#: Forge 2 and Forge Neo: the `backend/` API, whose hires requests need `hr_additional_modules`.
FORGE_API = HOST in ("forge", "neo")

#: What each host's API answers to a request with an `infotext` field, in its own words (a host bug, or no field).
API_INFOTEXT_MISSING = {
    "forge": "Forge 2's API answers HTTP 500 to any `infotext` field (TypeError in its apply_infotext)",
    "neo": (
        "Forge Neo's API answers HTTP 500 to any `infotext` field: TypeError: isinstance() argument 2 cannot be a "
        "parameterized generic (modules/api/api.py: apply_infotext, get_field_value)"
    ),
    "sdnext": "SD.Next's API has no `infotext` request field (modules/api/models.py)",
}


def overrides(**extra: Any) -> dict[str, Any]:
    """`override_settings`: live previews off (SDXL's would download a decoder), the checkpoint if one is named."""
    checkpoint = os.environ.get("TOME_WEBUI_CHECKPOINT")
    return {"live_previews_enable": False, **({"sd_model_checkpoint": checkpoint} if checkpoint else {}), **extra}


def plain_request(**extra: Any) -> dict[str, Any]:
    """The txt2img request every test starts from (also the one to record `TOME_WEBUI_BASELINE` with)."""
    body: dict[str, Any] = {
        "prompt": "a red apple on a table",
        "negative_prompt": "blurry",
        "steps": STEPS,
        "width": SIZE,
        "height": SIZE,
        "sampler_name": "Euler a",
        "seed": 1234,
        "override_settings": overrides(),
    }
    body.update(extra)
    return body


def hires(**extra: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "enable_hr": True,
        "hr_scale": 1.5,
        "hr_upscaler": "Latent Nearest" if HOST == "sdnext" else "Latent",
        "denoising_strength": 0.5,
        "hr_second_pass_steps": 2,
        "hr_sampler_name": "Euler a",
    }
    if FORGE_API:
        # Without it: HTTP 500, "argument of type 'NoneType' is not iterable" (Neo: processing.py, `sample`);
        # and both hosts default `hr_cfg` to 1.0 (the hires pass would run without guidance).
        fields["hr_additional_modules"] = ["Use same choices"]
        fields["hr_cfg"] = 7.0
    if HOST == "sdnext":
        fields["hr_resize_mode"] = 1  # SD.Next's 0 runs the second pass without the upscale
    return {**fields, **extra}


def post(path: str, body: dict[str, Any], *, name: str | None = None) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        f"{URL}{path}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=900) as response:
            status, payload = response.status, json.loads(response.read() or b"{}")  # SD.Next's interrupt: 204
    except urllib.error.HTTPError as error:
        status, payload = error.code, json.loads(error.read() or b"{}")
    evidence = os.environ.get("TOME_WEBUI_EVIDENCE")
    if evidence and name:
        record = {"status": status, "request": body, "info": payload.get("info"), "detail": payload.get("detail")}
        Path(evidence).mkdir(parents=True, exist_ok=True)
        Path(evidence, f"{HOST}-{ARCH}-{name}.json").write_text(json.dumps(record, indent=1))
    return status, payload


def get(path: str) -> Any:
    with urllib.request.urlopen(f"{URL}{path}", timeout=60) as response:
        return json.loads(response.read())


def info_of(payload: dict[str, Any]) -> dict[str, Any]:
    return json.loads(payload["info"])


def extra_params(payload: dict[str, Any]) -> dict[str, Any]:
    return info_of(payload)["extra_generation_params"]


def pixels(b64: str) -> bytes:
    from PIL import Image

    return Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB").tobytes()


def tome(*args: Any) -> dict[str, Any]:
    return {"tome": {"args": list(args)}}


def test_script_info_lists_the_script_in_both_tabs() -> None:
    entries = [e for e in get("/sdapi/v1/script-info") if e["name"] == "tome"]
    assert sorted(e["is_img2img"] for e in entries) == [False, True]
    assert all(e["is_alwayson"] for e in entries)


def test_txt2img_merges_every_selected_block() -> None:
    status, payload = post("/sdapi/v1/txt2img", plain_request(alwayson_scripts=tome(True, 0.5)), name="txt2img")
    assert status == 200, payload
    extra = extra_params(payload)
    assert extra["ToMe ratio"] == "0.5" and extra["ToMe max downsample"] == "auto"
    assert "ToMe note" not in extra and "ToMe error" not in extra


def test_off_is_the_image_without_the_extension() -> None:
    status, on = post("/sdapi/v1/txt2img", plain_request(alwayson_scripts=tome(True, 0.5)))
    status_off, off = post("/sdapi/v1/txt2img", plain_request(alwayson_scripts=tome(False)), name="off")
    status_none, none = post("/sdapi/v1/txt2img", plain_request())
    assert (status, status_off, status_none) == (200, 200, 200)
    assert pixels(off["images"][0]) == pixels(none["images"][0])  # right after a ToMe run: nothing leaked
    assert pixels(on["images"][0]) != pixels(off["images"][0])
    assert not any(key.startswith("ToMe") for key in extra_params(off))
    baseline = os.environ.get("TOME_WEBUI_BASELINE")
    if baseline:
        assert pixels(off["images"][0]) == pixels(base64.b64encode(Path(baseline).read_bytes()).decode())


def test_hires_own_settings() -> None:
    body = plain_request(**hires(), alwayson_scripts={"tome": {"args": [{"ratio": 0.5, "hires": {"ratio": 0.7}}]}})
    status, payload = post("/sdapi/v1/txt2img", body, name="hires")
    assert status == 200, payload
    extra = extra_params(payload)
    assert extra["ToMe hires"] == "own" and extra["ToMe hires ratio"] == "0.7"
    assert "ToMe note" not in extra and "ToMe error" not in extra


def test_hires_with_batch_count_2() -> None:
    body = plain_request(**hires(), n_iter=2, alwayson_scripts=tome(True, 0.5))
    status, payload = post("/sdapi/v1/txt2img", body, name="hires-n2")
    assert status == 200, payload
    assert len(payload["images"]) == 2
    assert all("ToMe ratio: 0.5" in text and "ToMe note" not in text for text in info_of(payload)["infotexts"])


def test_interrupted_generation_leaves_nothing_behind() -> None:
    import threading
    import time

    result: dict[str, Any] = {}
    long = plain_request(steps=40, alwayson_scripts=tome(True, 0.5))
    worker = threading.Thread(target=lambda: result.update(zip(("status", "payload"), post("/sdapi/v1/txt2img", long))))
    worker.start()
    time.sleep(3)
    post("/sdapi/v1/interrupt", {})
    worker.join(timeout=900)
    assert result.get("status") == 200
    _, off = post("/sdapi/v1/txt2img", plain_request(alwayson_scripts=tome(False)))
    _, none = post("/sdapi/v1/txt2img", plain_request())
    assert pixels(off["images"][0]) == pixels(none["images"][0])
    baseline = os.environ.get("TOME_WEBUI_BASELINE")
    if baseline:
        assert pixels(off["images"][0]) == pixels(base64.b64encode(Path(baseline).read_bytes()).decode())


def test_img2img() -> None:
    _, first = post("/sdapi/v1/txt2img", plain_request())
    body = plain_request(init_images=[first["images"][0]], denoising_strength=0.6, alwayson_scripts=tome(True, 0.5))
    status, payload = post("/sdapi/v1/img2img", body, name="img2img")
    assert status == 200, payload
    extra = extra_params(payload)
    assert extra["ToMe ratio"] == "0.5" and "ToMe note" not in extra


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ([True, 5], "ratio (args[1]) must be a number in [0, 0.95], got 5"),
        ([{"ratio": 0.5, "nope": 1}], "nope"),
    ],
)
def test_bad_input_is_refused_with_422(args: list[Any], needle: str) -> None:
    status, payload = post("/sdapi/v1/txt2img", plain_request(alwayson_scripts={"tome": {"args": args}}), name="422")
    assert status == 422, payload
    assert needle in json.dumps(payload)


#: The host's built-in token merging at ratio 0.5 (`override_settings`), what its infotext writes, and its key.
BUILTIN, BUILTIN_WRITTEN, BUILTIN_KEY = (
    ({"token_merging_method": "ToMe", "tome_ratio": 0.5}, "ToMe: 0.5", "ToMe: ")
    if HOST == "sdnext"
    else ({"token_merging_ratio": 0.5}, "Token merging ratio: 0.5", "Token merging ratio")
)


def test_builtin_is_switched_off_while_ours_runs() -> None:
    builtin = overrides(**BUILTIN)
    status, payload = post(
        "/sdapi/v1/txt2img",
        plain_request(override_settings=builtin, alwayson_scripts=tome(True, 0.3)),
        name="builtin",
    )
    assert status == 200, payload
    extra = extra_params(payload)
    assert extra["ToMe builtin"] == "disabled" and "ToMe note" not in extra
    assert BUILTIN_KEY not in info_of(payload)["infotexts"][0]
    status, alone = post("/sdapi/v1/txt2img", plain_request(override_settings=builtin))
    assert status == 200 and BUILTIN_WRITTEN in info_of(alone)["infotexts"][0]  # as without ours


def test_paste_through_the_api_infotext_field() -> None:
    if HOST in API_INFOTEXT_MISSING:
        pytest.skip(API_INFOTEXT_MISSING[HOST])
    status, source = post(
        "/sdapi/v1/txt2img", plain_request(alwayson_scripts=tome(True, 0.6, "auto", 2, 2, False)), name="source"
    )
    assert status == 200
    infotext = info_of(source)["infotexts"][0]
    status, pasted = post("/sdapi/v1/txt2img", plain_request(infotext=infotext), name="pasted")
    assert status == 200, pasted
    extra = extra_params(pasted)
    assert extra["ToMe ratio"] == "0.6" and extra["ToMe random partitions"] == "False"
    assert pixels(pasted["images"][0]) == pixels(source["images"][0])


def test_note_when_no_block_sits_at_the_selected_levels() -> None:
    """max downsample 1 selects level 1, where SDXL has no attention (tomesd's default does nothing there)."""
    if ARCH != "sdxl":
        pytest.skip("SD1.x/SD2.x have attention at level 1")
    status, payload = post(
        "/sdapi/v1/txt2img", plain_request(alwayson_scripts=tome(True, 0.5, "1")), name="sdxl-level1"
    )
    assert status == 200
    assert extra_params(payload)["ToMe note"].startswith("merged in 0 of 0 blocks (no transformer block at the")


def attention_replacer() -> dict[str, Any]:
    """A built-in always-on script that replaces every self-attention with a patch (the attention module is skipped).

    Forge 2: StyleAlign Integrated. Forge Neo has no StyleAlign; its ControlNet's `reference_only` preprocessor needs
    no model file and calls `unet.set_model_replace_all(attn1_proc, 'attn1')`
    (extensions-builtin/forge_preprocessor_reference). A1111 and SD.Next ship no such built-in.
    """
    if HOST == "forge":
        return {"StyleAlign Integrated": {"args": [True, 1.0]}}
    if HOST == "neo":
        _, reference = post("/sdapi/v1/txt2img", plain_request())
        unit = {"enabled": True, "module": "reference_only", "model": "None", "image": reference["images"][0]}
        return {"ControlNet": {"args": [unit]}}
    pytest.skip(f"{HOST} ships no built-in that replaces the self-attention (Forge: StyleAlign, Neo: reference_only)")


def test_note_when_another_extension_replaces_the_attention() -> None:
    scripts = {**tome(True, 0.5), **attention_replacer()}
    status, payload = post("/sdapi/v1/txt2img", plain_request(alwayson_scripts=scripts), name="replaced-attention")
    assert status == 200, payload
    note = extra_params(payload)["ToMe note"]
    assert note.startswith("merged in 0 of ") and note.endswith("blocks (attention replaced by another extension)")


# ---------------------------------------------------------------------------------------------- Forge Neo only


def neo_only() -> None:
    if HOST != "neo":
        pytest.skip("a Forge Neo built-in")


def test_neo_is_the_host_that_ran() -> None:
    neo_only()
    status, payload = post("/sdapi/v1/txt2img", plain_request(alwayson_scripts=tome(True, 0.5)))
    assert status == 200 and info_of(payload)["infotexts"][0].endswith("Version: neo")


def test_neo_epsilon_scaling_survives_the_builtin_taken_off() -> None:
    """Neo's `apply_token_merging` adds its epsilon scaling (a post-CFG function) on the patcher that holds the
    built-in's patches; ours takes the built-in off a clone and must keep the scaling."""
    neo_only()
    images = {}
    for factor in (1.0, 1.05):
        settings = overrides(token_merging_ratio=0.5, scaling_factor=factor)
        body = plain_request(override_settings=settings, alwayson_scripts=tome(True, 0.3))
        status, payload = post("/sdapi/v1/txt2img", body, name=f"neo-eps-{factor}")
        assert status == 200, payload
        assert extra_params(payload)["ToMe builtin"] == "disabled"
        images[factor] = pixels(payload["images"][0])
    assert images[1.0] != images[1.05]


#: Torch Compile Integrated's presets (extensions-builtin/sd_forge_compile/scripts/compile.py). "cudagraphs" is the
#: cudagraphs backend with fullgraph=True: on a CPU its graphs run without CUDA graphs (dynamo still traces them).
NEO_COMPILE_PRESETS = ("guard_filter_fn", "dynamic", "cudagraphs")
#: Why the cudagraphs preset may fail without ToMe (HTTP 500), seen here: on a CPU Neo picks `attention_basic`, whose
#: `get_attn_precision` reaches `platform.mac_ver()` (backend/memory_management.py: `mac_version`), an `os.stat` that
#: dynamo cannot trace; with fullgraph=True that is an error instead of a graph break. Neo's `--use-pytorch-cross-
#: attention` (its default on NVIDIA GPUs) runs SDPA instead, which traces.
NEO_CUDAGRAPHS_ON_CPU = (
    "Neo's cudagraphs preset fails without ToMe (HTTP 500: fullgraph=True cannot trace posix.stat in Neo's "
    "attention_basic on a CPU); start Neo with --use-pytorch-cross-attention to run it"
)
#: How far a compiled image may be from the eager one, in 0-255 levels (largest, mean over the pixels): inductor's
#: kernels round differently from eager; a few steps of a random-weight model carry that into the pixels.
COMPILE_LARGEST_DIFF, COMPILE_MEAN_DIFF = 2, 0.05


class ServerLog:
    """What the server logged during each request (`TOME_WEBUI_SERVER_LOG`: its stdout/stderr, written to a file,
    started with `TORCH_LOGS=recompiles`): dynamo's recompiles, one "Recompiling function" line each."""

    def __init__(self) -> None:
        path = os.environ.get("TOME_WEBUI_SERVER_LOG")
        self.path = Path(path) if path else None
        self.offset = self.path.stat().st_size if self.path else 0

    def recompiles(self) -> int | None:
        """Recompiles logged since the last call (None without a log)."""
        if self.path is None:
            return None
        with self.path.open("rb") as log:
            log.seek(self.offset)
            text = log.read().decode(errors="replace")
        self.offset += len(text.encode(errors="replace"))
        return text.count("Recompiling function")


def pixel_diff(a: bytes, b: bytes) -> tuple[int, float]:
    """(largest, mean) absolute difference of two RGB images of one size, in 0-255 levels."""
    assert len(a) == len(b)
    diffs = [abs(x - y) for x, y in zip(a, b, strict=True)]
    return max(diffs), sum(diffs) / len(diffs)


@pytest.mark.parametrize("preset", NEO_COMPILE_PRESETS)
def test_neo_torch_compile_runs_tome_merged(preset: str) -> None:
    """Neo's Torch Compile Integrated puts `torch.compile(unet, **preset)` at `forge_objects.unet.model.
    diffusion_model` in its `process_batch`, before ours patches; the patch goes on the module it wraps, whose
    compiled graph traces again with ToMe in it. So, with the wrapper kept ("Automatic", as for any request that
    does not name the script): ToMe's image is the eager ToMe image (float tolerance), not the compiled image without
    ToMe, with no note; a second ToMe generation recompiles nothing (`TOME_WEBUI_SERVER_LOG`) and gives the same
    pixels; the next generation without ToMe is the compiled image without ToMe again (nothing leaked).

    The first compiled generation is a warm-up: its pixels need not be those of later compiled generations (seen
    without ToMe too). The test ends with "Disable" (the wrapper would stay for later requests).
    """
    import time

    neo_only()

    def compile_as(value: str) -> dict[str, Any]:
        return {"Torch Compile Integrated": {"args": [value]}}

    log = ServerLog()
    record: dict[str, Any] = {"preset": preset, "arch": ARCH, "size": SIZE, "steps": STEPS, "generations": {}}

    def run(name: str, scripts: dict[str, Any], *, check: bool = True) -> dict[str, Any]:
        log.recompiles()
        start = time.monotonic()
        status, payload = post("/sdapi/v1/txt2img", plain_request(alwayson_scripts=scripts), name=f"{name}-{preset}")
        record["generations"][name] = {"seconds": round(time.monotonic() - start, 1), "recompiles": log.recompiles()}
        assert status == 200 or not check, payload
        payload["status"] = status
        return payload

    tome_on = tome(True, 0.5)
    try:
        eager_off = pixels(run("eager-off", compile_as("Disable"))["images"][0])
        eager_tome = run("eager-tome", {**tome_on, **compile_as("Disable")})
        warm = run("compile-warm", compile_as(preset), check=False)
        if warm["status"] != 200 and preset == "cudagraphs":
            pytest.skip(NEO_CUDAGRAPHS_ON_CPU)
        assert warm["status"] == 200, warm
        compiled_off = pixels(run("compiled-off", {})["images"][0])
        first = run("compiled-tome", tome_on)
        second = run("compiled-tome-again", tome_on)
        after = pixels(run("compiled-off-after", {})["images"][0])
    finally:
        run("disable", compile_as("Disable"))
    merged, eager = pixels(first["images"][0]), pixels(eager_tome["images"][0])
    record["diff"] = {
        "compiled ToMe vs eager ToMe": pixel_diff(merged, eager),
        "compiled off vs eager off": pixel_diff(compiled_off, eager_off),
        "compiled off vs eager ToMe": pixel_diff(compiled_off, eager),
        "compiled ToMe vs compiled off": pixel_diff(merged, compiled_off),
    }
    evidence = os.environ.get("TOME_WEBUI_EVIDENCE")
    if evidence:
        Path(evidence, f"{HOST}-{ARCH}-compile-{preset}-summary.json").write_text(json.dumps(record, indent=1))
    for payload in (first, second):
        extra = extra_params(payload)
        assert extra["ToMe ratio"] == "0.5" and "ToMe note" not in extra, extra
    assert extra_params(eager_tome).get("ToMe note") is None
    assert merged != compiled_off  # merged: not the compiled image without ToMe
    largest, mean = record["diff"]["compiled ToMe vs eager ToMe"]
    assert largest <= COMPILE_LARGEST_DIFF and mean <= COMPILE_MEAN_DIFF, record["diff"]
    assert mean < record["diff"]["compiled off vs eager ToMe"][1] / 4, record["diff"]
    assert pixels(second["images"][0]) == merged
    assert after == compiled_off  # no leak: the graph without ToMe is valid again
    if log.path is not None:
        generations = record["generations"]
        assert generations["compiled-tome-again"]["recompiles"] == 0, record
        assert generations["compiled-off-after"]["recompiles"] == 0, record


# ---------------------------------------------------------------------------------------------- speed presets


def expected_entries(args: list[Any], *, with_hires: bool) -> dict[str, str]:
    """Our infotext entries for `args` run on the loaded model's family (the values each pass resolved to)."""
    from tome_webui import infotext
    from tome_webui.params import resolve

    job = resolve(args)
    assert job is not None
    return infotext.entries(job, with_hires=with_hires, families={False: FAMILY, True: FAMILY})


def ours(extra: dict[str, Any]) -> dict[str, Any]:
    """Our entries of the settings and what ran (not the built-in's switch-off, not the version)."""
    records = ("ToMe builtin", "ToMe version")
    return {key: value for key, value in extra.items() if key.startswith("ToMe ") and key not in records}


def test_preset_records_the_preset_and_the_values_that_ran() -> None:
    args = [{"preset": "fastest"}]
    status, payload = post("/sdapi/v1/txt2img", plain_request(alwayson_scripts={"tome": {"args": args}}), name="preset")
    assert status == 200, payload
    extra = extra_params(payload)
    assert extra["ToMe preset"] == "fastest"
    assert ours(extra) == expected_entries(args, with_hires=False)  # no note, no error: every selected block merged
    import tome_core  # the server runs this checkout

    assert extra["ToMe version"] == tome_core.__version__
    assert "ToMe preset: fastest" in info_of(payload)["infotexts"][0]


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("preset-hires-same", [{"preset": "fast"}]),
        ("preset-hires-own", [{"preset": "balanced", "hires": {"preset": "fastest"}}]),
        ("preset-hires-own-custom", [{"preset": "quality", "hires": {"ratio": 0.7}}]),
    ],
)
def test_preset_with_hires(name: str, args: list[Any]) -> None:
    status, payload = post(
        "/sdapi/v1/txt2img", plain_request(**hires(), alwayson_scripts={"tome": {"args": args}}), name=name
    )
    assert status == 200, payload
    assert ours(extra_params(payload)) == expected_entries(args, with_hires=True)


def test_positional_args_from_before_presets_keep_their_meaning() -> None:
    """The WebUI fills missing args with the UI defaults (a preset); the extension's API check sends "custom"."""
    status, payload = post(
        "/sdapi/v1/txt2img", plain_request(alwayson_scripts=tome(True, 0.4, "auto", 2, 2)), name="old-args"
    )
    assert status == 200, payload
    extra = extra_params(payload)
    assert "ToMe preset" not in extra and extra["ToMe ratio"] == "0.4"
    assert ours(extra) == expected_entries([True, 0.4, "auto", 2, 2], with_hires=False)


def test_img2img_with_a_preset() -> None:
    _, first = post("/sdapi/v1/txt2img", plain_request())
    args = [{"preset": "fast"}]
    body = plain_request(
        init_images=[first["images"][0]], denoising_strength=0.6, alwayson_scripts={"tome": {"args": args}}
    )
    status, payload = post("/sdapi/v1/img2img", body, name="img2img-preset")
    assert status == 200, payload
    assert ours(extra_params(payload)) == expected_entries(args, with_hires=False)


def test_bad_preset_is_refused_with_422() -> None:
    body = plain_request(alwayson_scripts={"tome": {"args": [{"preset": "turbo"}]}})
    status, payload = post("/sdapi/v1/txt2img", body, name="422-preset")
    assert status == 422, payload
    assert "preset must be one of 'quality', 'balanced', 'fast', 'fastest', 'custom', got 'turbo'" in json.dumps(
        payload
    )


@pytest.mark.parametrize("with_hires", [False, True])
def test_preset_pastes_back_through_the_api_infotext_field(with_hires: bool) -> None:
    if HOST in API_INFOTEXT_MISSING:
        pytest.skip(API_INFOTEXT_MISSING[HOST])
    extra_fields = hires() if with_hires else {}
    args = [{"preset": "fast", "hires": {"preset": "fastest"}}] if with_hires else [{"preset": "fast"}]
    status, source = post(
        "/sdapi/v1/txt2img",
        plain_request(**extra_fields, alwayson_scripts={"tome": {"args": args}}),
        name="preset-source",
    )
    assert status == 200, source
    infotext = info_of(source)["infotexts"][0]
    status, pasted = post("/sdapi/v1/txt2img", plain_request(**extra_fields, infotext=infotext), name="preset-pasted")
    assert status == 200, pasted
    assert ours(extra_params(pasted)) == ours(extra_params(source))
    assert pixels(pasted["images"][0]) == pixels(source["images"][0])
