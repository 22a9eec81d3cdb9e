"""Ready for the places users install from (issue 39): the license, one version number, the Comfy registry's and
A1111's extension index's metadata, and a wheel that holds the library and its host adapters but not the lab."""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

import tome_core

tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")

ROOT = Path(__file__).resolve().parents[1]
#: What users install: the library and the two host adapters. The lab (`tome_bench`) stays in the checkout.
SHIPPED = ("tome_core", "tome_comfy", "tome_webui")
#: comfy-cli's reading of `[tool.comfy.version] path` (comfy_cli/registry/config_parser.py `_VERSION_RE`): a text
#: match, no Python run; a version it cannot match is published as empty and refused.
COMFY_VERSION_LINE = re.compile(
    r"""^(?P<name>__version__|VERSION)(?:[\t ]*:[\t ]*[^=\n]+)?[\t ]*=[\t ]*(?:"(?P<dq>[^"\\\n]*)"|'(?P<sq>[^'\\\n]*)')""",
    re.MULTILINE,
)
#: The tags of A1111's extension index (AUTOMATIC1111/stable-diffusion-webui-extensions, tags.json, 2026-05); its
#: validate.py refuses an entry with any other tag.
INDEX_TAGS = frozenset(
    (
        "script",
        "localization",
        "tab",
        "dropdown",
        "ads",
        "installed",
        "training",
        "models",
        "UI related",
        "prompting",
        "editing",
        "manipulations",
        "online",
        "animation",
        "query",
        "science",
        "extras",
    )
)


def pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_license_is_the_mit_license_pyproject_names() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License\n")
    assert "Copyright (c) 2026 sd-webui-tome contributors" in text
    assert 'THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND' in text
    assert pyproject()["project"]["license"] == {"text": "MIT"}


def test_one_version_number_read_by_setuptools_and_the_comfy_registry() -> None:
    """The version is written once, in tome_core/version.py: a WebUI extension is a plain git clone that pip never
    installed, so the code cannot ask package metadata; pyproject reads the file instead of repeating it."""
    project = pyproject()
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "tome_core.version.__version__"}
    source = ROOT / project["tool"]["comfy"]["version"]["path"]
    assert source == ROOT / "tome_core" / "version.py"
    text = source.read_text()
    (match,) = COMFY_VERSION_LINE.finditer(text)
    assert match["name"] == "__version__" and match["dq"] == tome_core.__version__
    assert re.fullmatch(r"\d+\.\d+\.\d+", tome_core.__version__)  # the registry's semantic X.Y.Z
    # setuptools reads `attr:` from the source without importing it (importing tome_core needs torch) when the
    # value is a literal
    (assign,) = [n for n in ast.parse(text).body if isinstance(n, ast.Assign)]
    assert ast.literal_eval(assign.value) == tome_core.__version__


def test_setuptools_reads_the_version_without_torch() -> None:
    """An isolated build (`pip install .` from a clone) has no torch: setuptools must read the literal, not import
    `tome_core`, whose `__init__` imports torch."""
    code = (
        "import sys\n"
        "sys.modules['torch'] = None  # `import torch` raises ImportError\n"
        "from setuptools.config.expand import read_attr\n"
        f"print(read_attr('tome_core.version.__version__', root_dir={str(ROOT)!r}), 'tome_core' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [tome_core.__version__, "False"]


def test_comfy_registry_metadata() -> None:
    """docs.comfy.org/registry/specifications: the node id (`[project] name`) and `[tool.comfy]`."""
    project = pyproject()
    name = project["project"]["name"]
    # < 100 characters of letters, digits, "-", "_" and "."; no two special characters in a row; starts with a letter
    assert len(name) < 100 and re.fullmatch(r"[a-z][a-z0-9]*(?:[-_.][a-z0-9]+)*", name)
    assert "comfyui" not in name.lower()
    comfy = project["tool"]["comfy"]
    assert comfy["PublisherId"] == "sd-webui-tome"
    assert comfy["DisplayName"] == "ToMe (Token Merging) for SD"
    assert comfy["Icon"] == ""  # optional; a URL once the repository hosts an icon
    assert project["project"]["description"]


def listing_entry() -> dict[str, Any]:
    """The A1111 extension index entry docs/listing.md gives (a JSON block; the README's "Listing" links there)."""
    listing = (ROOT / "docs" / "listing.md").read_text()
    section = listing.split("\n## A1111's extension index\n", 1)[1].split("\n## ", 1)[0]
    assert "docs/listing.md" in (ROOT / "README.md").read_text().split("\n## Listing\n", 1)[1]
    (block,) = re.findall(r"```json\n(.*?)```", section, re.DOTALL)
    return json.loads(block)


def test_readme_lists_the_fields_of_a1111s_extension_index() -> None:
    entry = listing_entry()
    assert set(entry) == {"name", "description", "tags"}
    assert entry["name"] == "ToMe (Token Merging) for SD" == pyproject()["tool"]["comfy"]["DisplayName"]
    assert entry["description"] == pyproject()["project"]["description"]  # one text for both places
    assert entry["tags"] and set(entry["tags"]) <= INDEX_TAGS
    # ToMe never goes online and shows no ads; "installed" and "localization" are the index's own
    assert not set(entry["tags"]) & {"online", "ads", "installed", "localization"}


def test_the_package_list_leaves_the_lab_out() -> None:
    from setuptools import find_packages

    include = pyproject()["tool"]["setuptools"]["packages"]["find"]["include"]
    found = find_packages(where=str(ROOT), include=include)
    assert {name.split(".")[0] for name in found} == set(SHIPPED)


def test_the_wheel_holds_the_library_and_adapters_and_not_the_lab(tmp_path: Path) -> None:
    """Built from a copy (a build in the checkout would leave build/ behind, whose stale files later wheels pick
    up) that has `tome_bench` in it too, so its absence from the wheel is the package list's doing."""
    src = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in (*SHIPPED, "tome_bench"):
        shutil.copytree(ROOT / name, src / name, ignore=ignore)
    for name in ("pyproject.toml", "LICENSE", "README.md"):
        shutil.copy(ROOT / name, src / name)
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(src), "-w", "dist"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        headers = archive.read(metadata).decode()
    assert {name.split("/")[0] for name in names if ".dist-info/" not in name} == set(SHIPPED)
    assert f"\nVersion: {tome_core.__version__}\n" in headers
    assert any(name.endswith(".dist-info/licenses/LICENSE") or name.endswith(".dist-info/LICENSE") for name in names)


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def test_nothing_users_install_imports_the_lab() -> None:
    """`tome_bench` may use the library; the library, the adapters and the hosts' entry points never use it."""
    sources = [p for name in SHIPPED for p in (ROOT / name).rglob("*.py")]
    sources += [ROOT / "__init__.py", ROOT / "install.py", *(ROOT / "scripts").glob("*.py")]
    offenders = {
        str(path.relative_to(ROOT)): sorted(m for m in imported_modules(path) if m.split(".")[0] == "tome_bench")
        for path in sources
    }
    assert {path: modules for path, modules in offenders.items() if modules} == {}


def code_lines(path: Path) -> int:
    """Non-blank lines that are not comments (docstrings count): `#` in Python, `//` and block comments in JavaScript."""
    comment = ("//", "/*", "*") if path.suffix == ".js" else ("#",)
    return sum(1 for line in path.read_text().splitlines() if line.strip() and not line.strip().startswith(comment))


def test_the_lab_is_smaller_than_the_product_it_measures() -> None:
    """Issue 44: the lab (`tome_bench`) by the same measure as the library, its host adapters and the WebUI's
    script and JavaScript."""
    lab = sum(code_lines(p) for p in (ROOT / "tome_bench").rglob("*.py"))
    product = sum(code_lines(p) for name in (*SHIPPED, "scripts") for p in (ROOT / name).rglob("*.py"))
    product += code_lines(ROOT / "javascript" / "tome.js")
    assert lab < product, f"the lab has {lab} lines of code, the product {product}"


def test_no_module_of_the_lab_is_over_600_lines() -> None:
    sizes = {p.name: len(p.read_text().splitlines()) for p in (ROOT / "tome_bench").glob("*.py")}
    assert {name: n for name, n in sizes.items() if n > 600} == {}
