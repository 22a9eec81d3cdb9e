"""`make venv`'s torch step on a machine with and without a local torch wheel (issue 33).

The Makefile runs for real; python and pip are tests/fake_python.py, which records every call and imitates pip's
find-links and indexes, so nothing is downloaded and no venv is built (each case takes well under a second).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STUB = Path(__file__).resolve().parent / "fake_python.py"
MAKE = shutil.which("make")
TORCH = "2.13.0"
LOCAL_WHEEL = f"torch-{TORCH}+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"

pytestmark = pytest.mark.skipif(MAKE is None, reason="GNU make is not installed")

# Settings of the caller's shell that would change what the Makefile does; each case sets its own.
CLEARED = ("CI", "TORCH_INDEX_URL", "TORCH_VERSION", "PYTHON", "VENV", "MAKEFLAGS", "MFLAGS", "MAKELEVEL")
CLEARED += ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_NO_INDEX")


def install_stub(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!{sys.executable}\n" + STUB.read_text())
    path.chmod(0o755)
    return path


def make_venv(
    tmp_path: Path,
    *,
    wheels: tuple[str, ...] = (),
    make_args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    python: str = "python3.11",
    path: str | None = None,
) -> tuple[subprocess.CompletedProcess[str], list[dict], dict | None]:
    """Run `make venv` into tmp_path/venv; returns the result, the python/pip calls and the torch it installed."""
    links = tmp_path / "find-links"
    links.mkdir()
    for name in wheels:
        (links / name).write_bytes(b"")
    stub = install_stub(tmp_path / "bin" / python)
    venv = tmp_path / "venv"
    calls = tmp_path / "calls.jsonl"
    full_env = {k: v for k, v in os.environ.items() if k not in CLEARED}
    full_env |= {"PIP_FIND_LINKS": str(links), "PIP_CONFIG_FILE": os.devnull, "FAKE_PY_LOG": str(calls)}
    full_env |= env or {}
    args = [f"VENV={venv}", *make_args]
    if path is None:
        args.append(f"PYTHON={stub}")
    else:
        full_env["PATH"] = path
    assert MAKE is not None
    result = subprocess.run(
        [MAKE, "--no-print-directory", "-C", str(ROOT), "venv", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=120,
    )
    recorded = [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []
    state = venv / "fake-torch.json"
    return result, recorded, json.loads(state.read_text()) if state.exists() else None


def torch_installs(calls: list[dict]) -> list[list[str]]:
    """The pip calls that name torch==TORCH (a probe, the install itself and the call for torch's requirements)."""
    return [
        c["argv"][3:] for c in calls if c["argv"][:3] == ["-m", "pip", "install"] and f"torch=={TORCH}" in c["argv"]
    ]


def test_no_local_wheel_installs_the_pinned_torch_from_the_index_with_the_users_options(tmp_path: Path) -> None:
    result, calls, torch = make_venv(
        tmp_path,
        make_args=(f"TORCH_INDEX_URL={CPU_INDEX}",),
        env={"PIP_EXTRA_INDEX_URL": "https://mirror.example/simple"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    installs = torch_installs(calls)
    assert "--no-index" in installs[0], f"the local wheel was not looked for first: {installs}"
    from_index = [a for a in installs if "--no-index" not in a]
    assert from_index, installs
    assert from_index[0][from_index[0].index("--index-url") + 1] == CPU_INDEX, from_index[0]
    index_call = next(c for c in calls if c["argv"][3:] == from_index[0])
    assert index_call["env"]["PIP_EXTRA_INDEX_URL"] == "https://mirror.example/simple"  # pip's own options pass
    assert torch == {"version": f"{TORCH}+cpu", "cuda": None}
    assert f"torch {TORCH}+cpu" in result.stdout


def test_a_users_cuda_build_from_the_index_is_accepted(tmp_path: Path) -> None:
    """Plain PyPI on Linux gives a CUDA build: a user's machine keeps it (it may be what they want)."""
    result, calls, torch = make_venv(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert torch is not None and torch["cuda"] is not None
    assert not any("--index-url" in a for a in torch_installs(calls))
    assert "CUDA" in result.stdout


def test_ci_refuses_a_cuda_build(tmp_path: Path) -> None:
    result, _, torch = make_venv(tmp_path, env={"CI": "true"})
    assert torch is not None and torch["cuda"] is not None
    assert result.returncode != 0
    assert "a CUDA build of torch got into" in result.stderr


def test_the_local_cpu_wheel_is_used_where_find_links_has_one(tmp_path: Path) -> None:
    result, calls, torch = make_venv(tmp_path, wheels=(LOCAL_WHEEL,), make_args=(f"TORCH_INDEX_URL={CPU_INDEX}",))
    assert result.returncode == 0, result.stdout + result.stderr
    assert torch == {"version": f"{TORCH}+cpu", "cuda": None}
    installs = torch_installs(calls)
    assert all("--index-url" not in a for a in installs), f"went to the index despite the local wheel: {installs}"
    assert any("--no-index" in a and "--dry-run" not in a for a in installs), installs


def test_a_cuda_build_replacing_the_local_wheel_fails_outside_ci_too(tmp_path: Path) -> None:
    result, _, torch = make_venv(tmp_path, wheels=(LOCAL_WHEEL,), env={"FAKE_PIP_REQUIREMENTS_PULL_CUDA": "1"})
    assert torch is not None and torch["cuda"] is not None
    assert result.returncode != 0
    assert "a CUDA build of torch got into" in result.stderr


def test_python_312_is_accepted(tmp_path: Path) -> None:
    """Only python3.12 on PATH (and the two tools the recipe uses besides bash builtins)."""
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in ("touch", "rm"):
        found = shutil.which(tool)
        assert found is not None
        (tools / tool).symlink_to(found)
    result, calls, _ = make_venv(tmp_path, wheels=(LOCAL_WHEEL,), python="python3.12", path=str(tools))
    assert result.returncode == 0, result.stdout + result.stderr
    venv_calls = [c for c in calls if c["argv"][:2] == ["-m", "venv"]]
    assert [Path(c["exe"]).name for c in venv_calls] == ["python3.12"]
