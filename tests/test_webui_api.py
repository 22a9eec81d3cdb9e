"""The API check: invalid ToMe args in /sdapi/v1/txt2img|img2img get HTTP 422 before generation."""

from __future__ import annotations

import json
from typing import Any

import pytest
import webui_stub  # noqa: F401  (puts the stand-in WebUI's modules on sys.path)
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient
from webui_stub.harness import tome_args

from tome_webui import api
from tome_webui.params import ARG_NAMES, IMG2IMG_ARG_NAMES, resolve


def make_app() -> tuple[FastAPI, list[Any]]:
    app = FastAPI()
    seen: list[Any] = []

    @app.post("/sdapi/v1/txt2img")
    @app.post("/sdapi/v1/img2img")
    async def generate(request: Request) -> dict[str, Any]:
        body = await request.body()
        seen.append(body)
        return {"info": "generated"}

    @app.post("/sdapi/v1/png-info")
    async def other(request: Request) -> dict[str, Any]:
        return {"body": (await request.body()).decode()}

    return app, seen


@pytest.fixture
def client() -> tuple[TestClient, list[Any]]:
    app, seen = make_app()
    client = TestClient(app)
    assert client.post("/sdapi/v1/png-info", json={}).status_code == 200  # the app has started
    api.on_app_started(None, app)
    return client, seen


def post(client: TestClient, tome: Any, path: str = "/sdapi/v1/txt2img", key: str = "tome") -> Any:
    return client.post(path, json={"prompt": "a cat", "steps": 3, "alwayson_scripts": {key: tome}})


@pytest.mark.parametrize(
    ("tome", "detail"),
    [
        ({"args": [True, 5]}, "ToMe (alwayson_scripts['tome']): ratio (args[1]) must be a number in [0, 0.95], got 5"),
        ({"args": [True, 0.5, "auto", "two"]}, "sx (args[3]) must be an integer in [1, 8], got 'two'"),
        ({"args": [{"ratio": 5}]}, "ratio must be a number in [0, 0.95], got 5"),
        ({"args": [{"colour": "red"}]}, "unknown field(s) 'colour'; allowed: enabled, preset, ratio"),
        (
            {"args": [{"preset": "turbo"}]},
            "preset must be one of 'quality', 'balanced', 'fast', 'fastest', 'custom', got 'turbo'",
        ),
        ({"args": [{"hires": {"preset": "slow"}}]}, "hires.preset must be one of 'quality', 'balanced'"),
        ({"args": [{"hires": {"preset": "fast", "ratio": 0.5}}]}, "hires takes either a 'preset' or its own settings"),
        ({"args": [{"ratio": 0.5}, True]}, "must hold the dict alone"),
        ({"args": {"ratio": 0.5}}, "args must be a list, got dict"),
        ([True, 0.5], 'must be an object like {"args": [...]}, got list'),
        ({"args": [False, 5]}, "ratio (args[1])"),  # refused even though it would be off: the request is wrong
    ],
)
def test_invalid_args_get_422_naming_the_field(client: tuple[TestClient, list[Any]], tome: Any, detail: str) -> None:
    http, seen = client
    for path in ("/sdapi/v1/txt2img", "/sdapi/v1/img2img"):
        response = post(http, tome, path)
        assert response.status_code == 422
        assert detail in response.json()["detail"]
    assert seen == []  # never reached generation


def test_a_bad_preset_in_the_positional_form_names_its_index_in_each_tab(client: tuple[TestClient, list[Any]]) -> None:
    http, seen = client
    allowed = "must be one of 'quality', 'balanced', 'fast', 'fastest', 'custom', got 'turbo'"
    txt2img = [*tome_args(True)[:21], "turbo"]
    response = post(http, {"args": txt2img})
    assert response.status_code == 422 and f"preset (args[21]) {allowed}" in response.json()["detail"]
    img2img = [*tome_args(True, img2img=True)[:16], "turbo"]
    response = post(http, {"args": img2img}, "/sdapi/v1/img2img")
    assert response.status_code == 422 and f"preset (args[16]) {allowed}" in response.json()["detail"]
    response = post(http, {"args": [*tome_args(True)[:22], "turbo"]})
    assert response.status_code == 422 and f"hr_preset (args[22]) {allowed}" in response.json()["detail"]
    # img2img's positions are its own: index 14 is mlp_ratio there, hr_mode in txt2img
    response = post(http, {"args": [*tome_args(True, img2img=True)[:14], "same"]}, "/sdapi/v1/img2img")
    assert response.status_code == 422 and "mlp_ratio (args[14]) must be a number" in response.json()["detail"]
    assert seen == []


def test_positional_args_without_presets_are_completed_with_custom(client: tuple[TestClient, list[Any]]) -> None:
    """The WebUI fills missing args with the UI defaults (a preset): an old client's list gets "custom" instead."""
    http, seen = client
    for path, img2img in (("/sdapi/v1/txt2img", False), ("/sdapi/v1/img2img", True)):
        assert post(http, {"args": [True, 0.3, "auto", 2, 2]}, path).status_code == 200
        body = json.loads(seen.pop())
        args = body["alwayson_scripts"]["tome"]["args"]
        names = IMG2IMG_ARG_NAMES if img2img else ARG_NAMES
        assert len(args) == len(names)
        assert dict(zip(names, args)) == {**dict(zip(names, tome_args(True, img2img=img2img))), "ratio": 0.3} | {
            name: "custom" for name in ("preset", "hr_preset") if name in names
        }
        assert body["prompt"] == "a cat"  # the rest of the request is kept
        assert resolve(args, is_img2img=img2img) == resolve([True, 0.3], is_img2img=img2img)
    # A list that reaches `preset` but stops before `hr_preset`: only that one is filled.
    given = [*tome_args(True)[:21], "fast"]
    assert post(http, {"args": given}).status_code == 200
    filled = tome_args(True)[len(given) + 1 :]  # the UI defaults of the args after hr_preset
    assert json.loads(seen.pop())["alwayson_scripts"]["tome"]["args"] == [*given, "custom", *filled]


def test_key_is_matched_case_insensitively(client: tuple[TestClient, list[Any]]) -> None:
    http, _ = client
    response = post(http, {"args": [True, 5]}, key="ToMe")
    assert response.status_code == 422 and "alwayson_scripts['ToMe']" in response.json()["detail"]


@pytest.mark.parametrize(
    "body",
    [
        {"prompt": "a cat", "alwayson_scripts": {"tome": {"args": [{"ratio": 0.6, "hires": {"ratio": 0.3}}]}}},
        {
            "prompt": "a cat",
            "alwayson_scripts": {"tome": {"args": [{"preset": "fast", "hires": {"preset": "Fastest"}}]}},
        },
        {
            "prompt": "a cat",
            "alwayson_scripts": {"tome": {"args": [*tome_args(True)[:21], "fast", "custom"]}},
        },
        {"prompt": "a cat", "alwayson_scripts": {"tome": {}}},
        {"prompt": "a cat", "alwayson_scripts": {"other script": {"args": [5]}}},
        {"prompt": "a cat"},
    ],
)
def test_valid_and_unrelated_requests_pass_through_unchanged(
    client: tuple[TestClient, list[Any]], body: dict[str, Any]
) -> None:
    http, seen = client
    raw = json.dumps(body).encode()
    response = http.post("/sdapi/v1/txt2img", content=raw, headers={"content-type": "application/json"})
    assert response.status_code == 200
    assert seen == [raw]


def test_non_json_and_other_routes_are_not_touched(client: tuple[TestClient, list[Any]]) -> None:
    http, seen = client
    response = http.post("/sdapi/v1/txt2img", content=b"not json", headers={"content-type": "application/json"})
    assert response.status_code == 200 and seen == [b"not json"]
    bad = {"alwayson_scripts": {"tome": {"args": [True, 5]}}}
    assert http.post("/sdapi/v1/png-info", json=bad).status_code == 200
    assert http.get("/sdapi/v1/txt2img").status_code == 405


def test_install_is_idempotent() -> None:
    app, _ = make_app()
    assert api.install(app) is True
    assert api.install(app) is False
    assert sum(m.cls is api.TomeRequestValidator for m in app.user_middleware) == 1


def test_request_error_without_http() -> None:
    assert api.request_error({"alwayson_scripts": {"TOME": {"args": [True, 0.5]}}}) is None
    assert api.request_error([1, 2]) is None
    assert api.request_error({"alwayson_scripts": []}) is None
    error = api.request_error({"alwayson_scripts": {"tome": {"args": [True, 0.5, "auto", 2, 2, "x"]}}})
    assert error is not None and "use_rand (args[5]) must be true or false, got 'x'" in error
