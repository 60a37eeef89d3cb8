"""The `sc` command line, one module per command group; `main` builds the argparse tree.

Owns flags, output and exit codes only: the work is done by the modules each command calls.
Imports nothing here, so that loading one command's module does not load every other one.
"""
