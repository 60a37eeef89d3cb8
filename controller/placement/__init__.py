"""Replica placement: every strategy of the seeds, purely computational, no I/O."""
