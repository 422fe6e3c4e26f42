"""`python -m batchfutures` is the `batchfutures` command line."""

import sys

from .cli.app import main

sys.exit(main())
