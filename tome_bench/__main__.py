"""`python -m tome_bench [job] [options]`: see `python -m tome_bench --help`."""

import sys

from tome_bench import main

sys.exit(main())
