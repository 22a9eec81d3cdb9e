"""`python -m tome_bench [options]`: see `python -m tome_bench --help`."""

import sys

from tome_bench.cli import main

sys.exit(main())
