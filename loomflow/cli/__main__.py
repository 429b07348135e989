"""``python -m loomflow.cli``: the same command as ``loomflow``."""

import sys

from loomflow.cli import main

sys.exit(main())
