"""``python -m attnzoo.benchmarks.scaling``."""

import sys

from attnzoo.benchmarks.scaling.cli import main

sys.exit(main())
