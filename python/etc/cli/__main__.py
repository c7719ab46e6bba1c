"""`python -m etc.cli`: the `etc` command (how the tensor-parallel ranks
start it again)."""

import sys

from . import main

sys.exit(main())
