"""`python -m batchfutures` is the `batchfutures` command line."""

import sys

from .cli import main

sys.exit(main())
