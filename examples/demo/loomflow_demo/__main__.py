"""``python -m loomflow_demo``: the same command as ``loomflow-demo``."""

import sys

from loomflow_demo.cli import main

sys.exit(main())
