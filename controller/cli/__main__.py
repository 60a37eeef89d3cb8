"""`python -m controller.cli ...`: the same as `sc ...` (the tests and the demo start the SC so)."""

import sys

from controller.cli import main

sys.exit(main.main())
