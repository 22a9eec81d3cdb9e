"""The API check: invalid ToMe args in /sdapi/v1/txt2img|img2img get HTTP 422 before generation."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient

from tome_webui import api


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
        ({"args": [{"colour": "red"}]}, "unknown field(s) 'colour'; allowed: enabled, ratio"),
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


def test_key_is_matched_case_insensitively(client: tuple[TestClient, list[Any]]) -> None:
    http, _ = client
    response = post(http, {"args": [True, 5]}, key="ToMe")
    assert response.status_code == 422 and "alwayson_scripts['ToMe']" in response.json()["detail"]


@pytest.mark.parametrize(
    "body",
    [
        {"prompt": "a cat", "alwayson_scripts": {"tome": {"args": [True, 0.5, "auto", 2, 2]}}},
        {"prompt": "a cat", "alwayson_scripts": {"tome": {"args": [{"ratio": 0.6, "hires": {"ratio": 0.3}}]}}},
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
