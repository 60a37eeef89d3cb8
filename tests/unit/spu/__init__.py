"""Unit tests of the SPU simulator's pure parts: replica offsets, SPU state, fetch frames, backoff, checkpoint."""
