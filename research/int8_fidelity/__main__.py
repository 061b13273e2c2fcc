"""``python -m research.int8_fidelity``."""

import sys

from research.int8_fidelity.cli import main

sys.exit(main())
