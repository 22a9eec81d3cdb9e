"""`make test` runs two pytest-xdist workers with --dist loadgroup: the tests of one `xdist_group` (the browser
tests, the GPU-budget traces, the stand-in fidelity) must run in one worker, which builds what they share once.

pytest 9.2 keeps a node's id in `_id`, where pytest-xdist 3.8 appends the group to `_nodeid`: every group was then
spread over both workers and each built its shared models and traces again (the suite took minutes longer). This
runs the pinned pair on a file of its own, as `make test` runs them.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

GROUPED = """
import pytest

pytestmark = pytest.mark.xdist_group("together")


@pytest.mark.parametrize("n", range(6))
def test_grouped(n):
    pass
"""


def test_the_tests_of_one_group_run_in_one_worker(tmp_path: Path) -> None:
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    (tmp_path / "test_free.py").write_text("def test_free():\n    pass\n")
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v", "-p", "no:cacheprovider", "."],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    workers = set(re.findall(r"\[(gw\d+)\].*PASSED test_grouped\.py", run.stdout))
    assert len(workers) == 1, run.stdout


def test_the_browser_tests_are_one_group_when_xdist_reads_the_groups() -> None:
    """pytest-xdist 3.8 reads `xdist_group` while it collects, before a conftest's `pytest_collection_modifyitems`
    adds marks: a mark added there never grouped anything (the browser tests started a server and a Chromium in
    both workers). The group is the module's own mark."""
    import test_browser_ui

    marks = test_browser_ui.pytestmark if isinstance(test_browser_ui.pytestmark, list) else [test_browser_ui.pytestmark]
    assert any(m.name == "xdist_group" and m.args == ("browser",) for m in marks), marks
