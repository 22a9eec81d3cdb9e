"""install.py: installs nothing, needs no network, honours --skip-install, says when torch is too old."""

from __future__ import annotations

import importlib.util
import logging
import subprocess
import sys
import types
from pathlib import Path

import pytest

INSTALL = Path(__file__).resolve().parents[1] / "install.py"


def load_install() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("tome_install", INSTALL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_runs_as_a_subprocess_from_another_cwd(tmp_path: Path) -> None:
    """As the WebUI runs it: `python install.py` with the WebUI root as cwd."""
    env = {"PATH": "", "PYTHONPATH": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, str(INSTALL)], cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env
    )
    assert result.returncode == 0, result.stderr
    assert "nothing to install" in result.stdout


def test_skip_install(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    install = load_install()
    caplog.set_level(logging.INFO, logger="tome")
    assert install.main(["--skip-install"]) == 0
    assert "--skip-install" in caplog.text
    monkeypatch.setenv("COMMANDLINE_ARGS", "--api --skip-install")
    assert install.skip_install([]) is True
    monkeypatch.setenv("COMMANDLINE_ARGS", "--api")
    monkeypatch.setitem(sys.modules, "launch", types.SimpleNamespace(args=types.SimpleNamespace(skip_install=True)))
    assert install.skip_install([]) is True
    monkeypatch.setitem(sys.modules, "launch", types.SimpleNamespace(args=types.SimpleNamespace(skip_install=False)))
    assert install.skip_install([]) is False


@pytest.mark.parametrize(("version", "warned"), [("1.13.1+cu117", True), ("2.0.1", False), ("2.1.2+cu121", False)])
def test_old_torch_is_reported(
    version: str, warned: bool, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    install = load_install()
    monkeypatch.delenv("COMMANDLINE_ARGS", raising=False)
    monkeypatch.setattr(install.importlib.metadata, "version", lambda name: version)
    caplog.set_level(logging.INFO, logger="tome")
    assert install.main([]) == 0
    assert ("too old" in caplog.text) == warned
    if warned:
        assert "torch>=2.0" in caplog.text and "with_kwargs=True" in caplog.text


def test_no_torch_is_reported(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    install = load_install()
    monkeypatch.delenv("COMMANDLINE_ARGS", raising=False)

    def missing(name: str) -> str:
        raise install.importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(install.importlib.metadata, "version", missing)
    caplog.set_level(logging.INFO, logger="tome")
    assert install.main([]) == 0
    assert "torch is not installed" in caplog.text
