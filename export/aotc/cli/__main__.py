"""`python -m aotc.cli ...`: the same as the `aotc` command."""

import sys

from aotc.cli import main

sys.exit(main())
