"""`python -m rlhf.cli`: the command line, as `rlhf`."""

import sys

from rlhf.cli import main

sys.exit(main())
