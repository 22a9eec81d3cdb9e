"""Every dotted name of ours the README and docs/*.md show in backticks or code exists (issue 33, section 4).

A name such as `tome_core.presets.preset_hint` is resolved as a reader's Python would: after importing every module
its dotted prefix names, attribute by attribute from the package. (`tome_core.presets` is the function that lists
the presets, which hides the submodule of that name: `tome_core.presets.preset_hint` raises AttributeError.)
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

REPO_DIR = Path(__file__).resolve().parents[1]
DOCS = (REPO_DIR / "README.md", *sorted((REPO_DIR / "docs").glob("*.md")))
PACKAGES = ("tome_core", "tome_bench", "tome_webui", "tome_comfy")
NAME = re.compile(rf"\b(?:{'|'.join(PACKAGES)})(?:\.[A-Za-z_]\w*)+")
#: Inline code, fenced blocks and indented (4-space) code lines: what a reader copies.
CODE = re.compile(r"```.*?```|`[^`\n]+`|^(?: {4}|\t).*$", re.DOTALL | re.MULTILINE)
#: Names a document shows as gone, with where: they must stay gone, or the sentence is wrong.
FORMER = {("docs/benchmarks.md", "tome_core.bench"): "the benchmark's module before it left the library"}


def shown_names(text: str) -> set[str]:
    return {name for span in CODE.findall(text) for name in NAME.findall(span)}


def resolve(name: str) -> object:
    """The object `name` stands for, as `import a.b; a.b.c` finds it; AttributeError/ImportError otherwise."""
    parts = name.split(".")
    for end in range(1, len(parts) + 1):
        try:
            importlib.import_module(".".join(parts[:end]))
        except ModuleNotFoundError as exc:
            if exc.name != ".".join(parts[:end]):
                raise  # the module exists but one of its own imports is missing: a real failure
            break
    obj: object = importlib.import_module(parts[0])
    for part in parts[1:]:
        obj = getattr(obj, part)
    return obj


NAMES = sorted({(doc.relative_to(REPO_DIR).as_posix(), n) for doc in DOCS for n in shown_names(doc.read_text())})


def test_the_docs_show_names_of_ours() -> None:
    shown = {name for _, name in NAMES}
    assert {"tome_core.apply_patch", "tome_core.presets", "tome_core.field_specs"} <= shown
    assert any(name.startswith("tome_webui.") for name in shown) and any(n.startswith("tome_bench.") for n in shown)


@pytest.mark.parametrize(("doc", "name"), NAMES, ids=[f"{doc}:{name}" for doc, name in NAMES])
def test_every_name_the_docs_show_exists(doc: str, name: str) -> None:
    if (doc, name) in FORMER:
        with pytest.raises((AttributeError, ImportError)):
            resolve(name)
        return
    try:
        resolve(name)
    except (AttributeError, ImportError) as exc:
        pytest.fail(f"{doc} shows `{name}`, which does not resolve: {type(exc).__name__}: {exc}")


def test_a_name_hidden_by_the_presets_function_does_not_resolve() -> None:
    """The resolver reads names as a user's Python does (the README once showed this one)."""
    with pytest.raises(AttributeError):
        resolve("tome_core.presets.preset_hint")
    assert callable(resolve("tome_core.presets"))
    assert callable(resolve("tome_core.merge.bipartite_soft_matching_random2d"))
