"""`make test`'s pytest: the browser tests in a process of their own beside the rest.

The browser tests spend most of their time waiting for a page to settle (about 100 of their 125 s, 2026-11-28): in
an xdist worker that wait holds one of the two cores' workers idle. Here they run in their own pytest process while
the rest runs on `--workers` pytest-xdist workers (--dist loadgroup) at a lower CPU priority, so that the page, its
server and Chromium answer as promptly as when they had a core to themselves, and the cores do the rest's work while
the page waits. Nothing is left out: the two selections are the mark expression with and without `browser`. The
browser process looks for its tests in `--browser-tests` unless the pytest arguments name paths (pytest's
`testpaths`), so that it does not import and rewrite every test module to deselect them.

    python tests/run_suite.py --mark "not webui and not comfy" --workers 2 [-- pytest arguments]

Exit status: pytest's, the first failing one of the two; 5 ("no tests ran") only when neither ran a test.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence

#: Nice value of the xdist workers: the browser process's page, server and Chromium wait on short round trips.
WORKERS_NICE = 5
NO_TESTS = 5
#: Where the tests marked `browser` are (tests/test_suite_groups.py checks that no other module has one).
BROWSER_TESTS = "tests/test_browser_ui.py"


def commands(
    mark: str, workers: int, args: Sequence[str], browser_tests: str = BROWSER_TESTS
) -> tuple[list[str], list[str]]:
    """(the browser tests' pytest command, the rest's)."""
    pytest = [sys.executable, "-m", "pytest", "-q"]
    only = ["-o", f"testpaths={browser_tests}"]
    browser = [*pytest, "-p", "no:cacheprovider", *only, "-m", f"({mark}) and browser", *args]
    rest = [*pytest, "-m", f"({mark}) and not browser", "-n", str(workers), "--dist", "loadgroup", *args]
    return browser, rest


def status(browser: int, rest: int) -> int:
    """The suite's exit status from the two runs'."""
    if browser == rest == NO_TESTS:
        return NO_TESTS
    return next((rc for rc in (rest, browser) if rc not in (0, NO_TESTS)), 0)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mark", default="not webui and not comfy", help="pytest -m expression of the whole suite")
    parser.add_argument("--workers", type=int, default=2, help="pytest-xdist workers for all but the browser tests")
    parser.add_argument("--browser-tests", default=BROWSER_TESTS, help="the module of the tests marked browser")
    parser.add_argument("pytest_args", nargs="*", help="passed to both pytest runs (after --)")
    opts = parser.parse_args(argv)
    browser_cmd, rest_cmd = commands(opts.mark, opts.workers, opts.pytest_args, opts.browser_tests)
    with tempfile.TemporaryFile("w+") as log:
        browser = subprocess.Popen(browser_cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            rest = subprocess.run(rest_cmd, preexec_fn=lambda: os.nice(WORKERS_NICE), check=False).returncode
        finally:
            browser_rc = browser.wait()
        log.seek(0)
        print(f"\n---- the browser tests ({' '.join(browser_cmd[1:])}):", flush=True)
        sys.stdout.write(log.read())
    rc = status(browser_rc, rest)
    if rc == NO_TESTS:
        print("error: pytest collected/ran no tests", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
