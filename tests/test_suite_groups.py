"""`make test` (tests/run_suite.py) runs the browser tests in a pytest process of their own and the rest on two
pytest-xdist workers with --dist loadgroup: the tests of one `xdist_group` (the GPU-budget traces, the stand-in
fidelity; the browser tests when pytest-xdist runs them) must run in one worker, which builds what they share once.

pytest 9.2 keeps a node's id in `_id`, where pytest-xdist 3.8 appends the group to `_nodeid`: every group was then
spread over both workers and each built its shared models and traces again (the suite took minutes longer). This
runs the pinned pair on a suite of its own, as `make test` runs them.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import conftest
import pytest

GROUPED = """
import pytest

pytestmark = pytest.mark.xdist_group("together")


@pytest.mark.parametrize("n", range(6))
def test_grouped(n):
    pass
"""


def test_the_browser_tests_are_one_group_when_xdist_reads_the_groups() -> None:
    """pytest-xdist 3.8 reads `xdist_group` while it collects, before a conftest's `pytest_collection_modifyitems`
    adds marks: a mark added there never grouped anything (the browser tests started a server and a Chromium in
    both workers). The group is the module's own mark."""
    import test_browser_ui

    marks = test_browser_ui.pytestmark if isinstance(test_browser_ui.pytestmark, list) else [test_browser_ui.pytestmark]
    assert any(m.name == "xdist_group" and m.args == ("browser",) for m in marks), marks


PAGE = """
import pytest

pytestmark = pytest.mark.browser


def test_page():
    pass
"""


@pytest.fixture(scope="module")
def suite_run(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    """`make test`'s runner (tests/run_suite.py) on a few tests of its own: a group, a free test, a browser test."""
    root = tmp_path_factory.mktemp("suite")
    (root / "test_grouped.py").write_text(GROUPED)
    (root / "test_free.py").write_text("def test_free():\n    pass\n")
    (root / "test_page.py").write_text(PAGE)
    (root / "pytest.ini").write_text("[pytest]\nmarkers =\n    browser: a page\n    webui: a live WebUI\n")
    runner = Path(__file__).resolve().parent / "run_suite.py"
    # Four pytest processes: without the plugins these tests do not use (hypothesis' and anyio's import 2 s of
    # modules in each), 2 CPU-s instead of 10.
    unused = ["-p", "no:hypothesispytest", "-p", "no:anyio"]
    return subprocess.run(
        [
            sys.executable,
            str(runner),
            "--mark",
            "not webui",
            "--browser-tests",
            "test_page.py",
            "--",
            "-v",
            "-v",
            *unused,
        ],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_tests_of_one_group_run_in_one_worker(suite_run: subprocess.CompletedProcess[str]) -> None:
    assert suite_run.returncode == 0, suite_run.stdout + suite_run.stderr
    workers = set(re.findall(r"\[(gw\d+)\].*PASSED test_grouped\.py", suite_run.stdout))
    assert len(workers) == 1, suite_run.stdout


def test_make_test_runs_the_browser_tests_beside_the_rest_and_leaves_none_out(
    suite_run: subprocess.CompletedProcess[str],
) -> None:
    """The browser tests in a process of their own, the rest (7) on the xdist workers, each test once."""
    assert suite_run.returncode == 0, suite_run.stdout + suite_run.stderr
    rest, browser = suite_run.stdout.split("---- the browser tests")
    assert re.search(r"\b7 passed\b", rest) and "[gw1]" in rest and "test_page" not in rest, suite_run.stdout
    assert re.search(r"\b1 passed\b", browser) and "test_page.py::test_page PASSED" in browser, suite_run.stdout
    assert "deselected" not in browser, suite_run.stdout  # it collected the browser module alone


def test_the_browser_tests_are_where_the_runner_looks_for_them() -> None:
    """tests/run_suite.py's browser process collects `BROWSER_TESTS` only: a test marked `browser` elsewhere would run
    in neither process."""
    from run_suite import BROWSER_TESTS

    root = Path(__file__).resolve().parent.parent
    marked = {
        p.relative_to(root).as_posix() for p in (root / "tests").glob("test_*.py") if "mark.browser" in p.read_text()
    }
    assert marked - {"tests/test_suite_groups.py"} == {BROWSER_TESTS}, marked


def test_make_test_fails_when_neither_run_has_a_test(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import run_suite

    ran: list[list[str]] = []

    class Exited:
        def __init__(self, cmd: list[str], **_: object) -> None:
            ran.append(cmd)
            self.returncode = 5

        def wait(self) -> int:
            return self.returncode

    monkeypatch.setattr(run_suite.subprocess, "Popen", Exited)
    monkeypatch.setattr(run_suite.subprocess, "run", Exited)
    assert run_suite.main(["--mark", "webui", "--", "-k", "nothing"]) == 5
    assert "ran no tests" in capsys.readouterr().err
    assert [cmd[cmd.index("-m", 2) + 1] for cmd in ran] == ["(webui) and browser", "(webui) and not browser"], ran
    assert all(cmd[-2:] == ["-k", "nothing"] for cmd in ran), ran


def test_the_suite_fails_when_either_run_fails_and_not_when_one_selects_nothing() -> None:
    from run_suite import status

    assert [status(0, 0), status(5, 0), status(0, 5), status(5, 5)] == [0, 0, 0, 5]
    assert [status(1, 0), status(0, 1), status(5, 2), status(1, 2)] == [1, 1, 2, 2]


def test_under_xdist_the_tests_that_compile_are_handed_out_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """pytest-xdist hands single tests out in collection order: a compile test (tens of seconds) left for the end
    keeps one worker busy after the other has finished. The conftest puts them first under xdist, in their order,
    and leaves a plain run's order alone (module fixtures would be set up twice)."""

    class Item:
        def __init__(self, name: str, *fixtures: str) -> None:
            self.name, self.fixturenames = name, list(fixtures)

    def order() -> list[str]:
        items = [Item("a"), Item("b", "fresh_dynamo"), Item("c", "tmp_path"), Item("d", "fresh_dynamo")]
        conftest.pytest_collection_modifyitems(None, items)  # type: ignore[arg-type]
        return [item.name for item in items]

    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    assert order() == ["a", "b", "c", "d"]
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    assert order() == ["b", "d", "a", "c"]


def test_what_the_imports_made_is_out_of_the_garbage_collectors_way() -> None:
    """Python's full collections walk every object they track: torch's, diffusers' and gradio's from the imports
    too, unless the conftest froze them after collecting (and after each compile test, what dynamo keeps)."""
    import gc

    assert gc.get_freeze_count() > 100_000


@pytest.mark.skipif(conftest.LIBC is None, reason="glibc only")
def test_freed_memory_is_reused_without_page_faults() -> None:
    """The conftest keeps what the tests free in the process (the stand-in's calls: 1.5 s of page faults each): a
    64 MiB block freed and asked for again comes back without fresh pages. glibc's own malloc, not a tensor: torch
    asks for 64-byte alignment, and whether the chunk a tensor freed fits the next one's request then depends on the
    heap's state (after some tests each fill took the next 64 MiB up)."""
    import ctypes
    import resource

    libc = conftest.LIBC
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    size = 64 * 2**20  # 16,384 pages

    def faults_to_fill() -> int:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        block = libc.malloc(size)
        assert block
        ctypes.memset(block, 1, size)
        libc.free(block)
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    faults_to_fill()
    assert faults_to_fill() < 1_000
