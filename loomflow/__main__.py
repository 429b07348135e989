"""``python -m loomflow``: the ``loomflow`` command."""

import sys

from loomflow.cli import main

sys.exit(main())
