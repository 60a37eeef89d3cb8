"""`sc demo`: a local cluster end to end (demo), shown on a terminal (output), its processes
always stopped (processes). Talks to the SC only over its HTTP API, as a user would.
"""
