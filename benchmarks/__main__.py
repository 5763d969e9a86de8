"""``python -m benchmarks``: the suite's entry point (``benchmarks/run.py``)."""

import sys

from benchmarks.run import main

sys.exit(main())
