#!/usr/bin/env bash
# Installs Debian's chromium and chromium-driver for the browser test (tests/test_browser_ui.py) when either is
# missing; does nothing when both are there. Only Debian's own packages: no browser download, no selenium-manager.
# CI runs as root; elsewhere it uses `sudo -n` when that works.
set -euo pipefail

if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
    echo "install-browser: chromium and chromedriver already installed"
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-browser: no apt-get; install Chromium and its chromedriver yourself" \
         "(or set TOME_CHROMIUM / TOME_CHROMEDRIVER)" >&2
    exit 1
fi

as_root=()
if [ "$(id -u)" -ne 0 ]; then
    if sudo -n true 2>/dev/null; then
        as_root=(sudo -n)
    else
        echo "install-browser: needs root (or password-less sudo) for apt-get" >&2
        exit 1
    fi
fi

export DEBIAN_FRONTEND=noninteractive
# One retry: a mirror can be briefly out of step with its index.
for attempt in 1 2; do
    if "${as_root[@]}" apt-get update -qq \
        && "${as_root[@]}" apt-get install -y -qq --no-install-recommends chromium chromium-driver; then
        break
    fi
    if [ "$attempt" -eq 2 ]; then
        echo "install-browser: apt-get could not install chromium chromium-driver" >&2
        exit 1
    fi
    sleep 10
done

# /usr/bin/chromium is a wrapper script that complains on stderr about its environment: keep only the version.
echo "install-browser: $(chromium --version 2>/dev/null); $(chromedriver --version)"
