"""`python -m tome_core.bench [options]`: see `python -m tome_core.bench --help`."""

import sys

from tome_core.bench.cli import main

sys.exit(main())
