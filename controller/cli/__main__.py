"""`python -m controller.cli ...`: the same as `sc ...` (the tests and the demo start the SC so),
including its exit (console(): no interpreter teardown once Arrow is loaded)."""

from controller.cli import main

main.console()
