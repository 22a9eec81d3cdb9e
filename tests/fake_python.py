"""A stand-in for python and pip that `make venv` can run without a network or a real torch (tests/test_make_venv.py).

Installed as an executable under any name (python3.12, .venv/bin/python). It appends each call to $FAKE_PY_LOG as
one JSON line and imitates just what the Makefile relies on:

- `-m venv DIR` makes DIR/bin/python, a copy of this file;
- `-m pip install ... torch==V` with `--no-index` succeeds only where a `torch-V*.whl` lies in a find-links folder
  ($PIP_FIND_LINKS or -f/--find-links) and installs that build (`+cpu` in the name: a CPU build); without it, the
  index (--index-url, else $PIP_INDEX_URL, else PyPI) gives V+cpu from a `/cpu` index, V+cuXYZ from a `/cuXYZ`
  index and, as PyPI does on Linux, a CUDA build otherwise. `--dry-run` installs nothing;
- `-m pip install -r requirements-dev.txt` replaces torch by a CUDA build when $FAKE_PIP_REQUIREMENTS_PULL_CUDA is
  set (a dependency dragging in another torch), and every other pip call succeeds doing nothing;
- `-c CODE` runs CODE with a fake `torch` module (its `__version__` and `version.cuda`) or none at all.

The installed torch is kept in fake-torch.json beside bin/ (the venv's root).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import types
from pathlib import Path

HERE = Path(__file__).resolve()
STATE = HERE.parent.parent / "fake-torch.json"
PYPI_CUDA = "12.8"  # what `pip install torch` from PyPI brings on Linux


def log(argv: list[str]) -> None:
    path = os.environ.get("FAKE_PY_LOG")
    if path:
        env = {k: os.environ.get(k) for k in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "CI")}
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"exe": str(Path(sys.argv[0])), "argv": argv, "env": env}) + "\n")


def read_state() -> dict | None:
    return json.loads(STATE.read_text()) if STATE.exists() else None


def option(args: list[str], *names: str) -> list[str]:
    """Every value of an option given as `--name value` or `--name=value`."""
    values = []
    for i, arg in enumerate(args):
        for name in names:
            if arg == name and i + 1 < len(args):
                values.append(args[i + 1])
            elif arg.startswith(name + "="):
                values.append(arg.split("=", 1)[1])
    return values


def pip_install(args: list[str]) -> int:
    dry = "--dry-run" in args
    torch_specs = [a for a in args if re.fullmatch(r"torch==[\w.+]+", a)]
    if (
        "-r" in args
        and "requirements-dev.txt" in option(args, "-r")
        and os.environ.get("FAKE_PIP_REQUIREMENTS_PULL_CUDA")
    ):
        state = read_state() or {"version": "2.13.0"}
        STATE.write_text(json.dumps({"version": state["version"].split("+")[0], "cuda": PYPI_CUDA}))
        return 0
    if not torch_specs:
        return 0
    version = torch_specs[0].split("==", 1)[1]
    if "--no-index" in args:
        folders = os.environ.get("PIP_FIND_LINKS", "").split() + option(args, "-f", "--find-links")
        wheels = [w for d in folders if Path(d).is_dir() for w in sorted(Path(d).glob(f"torch-{version}*.whl"))]
        if not wheels:
            print(f"ERROR: Could not find a version that satisfies the requirement torch=={version}", file=sys.stderr)
            print(f"ERROR: No matching distribution found for torch=={version}", file=sys.stderr)
            return 1
        build = wheels[0].name.split("-")[1]
        new = {"version": build, "cuda": None if build.endswith("+cpu") else PYPI_CUDA}
    else:
        state = read_state()
        if state and state["version"].split("+")[0] == version:
            return 0  # "Requirement already satisfied": nothing is fetched
        index = (option(args, "-i", "--index-url") or [os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple")])[-1]
        cuda = re.search(r"/(cu\d+)$", index.rstrip("/"))
        if index.rstrip("/").endswith("/cpu"):
            new = {"version": f"{version}+cpu", "cuda": None}
        elif cuda:
            new = {"version": f"{version}+{cuda.group(1)}", "cuda": cuda.group(1)}
        else:
            new = {"version": version, "cuda": PYPI_CUDA}
    if not dry:
        STATE.write_text(json.dumps(new))
    return 0


def run_code(code: str) -> None:
    state = read_state()
    if state is None:
        sys.modules["torch"] = None  # type: ignore[assignment]  # `import torch` raises ImportError
    else:
        torch = types.ModuleType("torch")
        torch.__version__ = state["version"]  # type: ignore[attr-defined]
        torch.version = types.SimpleNamespace(cuda=state["cuda"])  # type: ignore[attr-defined]
        sys.modules["torch"] = torch
    exec(compile(code, "<string>", "exec"), {"__name__": "__main__"})


def main(argv: list[str]) -> int:
    log(argv)
    if argv[:1] == ["-c"]:
        run_code(argv[1])
        return 0
    if argv[:2] == ["-m", "venv"]:
        venv = Path(argv[-1])
        (venv / "bin").mkdir(parents=True, exist_ok=True)
        shutil.copy2(HERE, venv / "bin" / "python")
        return 0
    if argv[:3] == ["-m", "pip", "install"]:
        return pip_install(argv[3:])
    print(f"fake_python: unexpected call {argv}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
