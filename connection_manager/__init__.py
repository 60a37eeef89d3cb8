"""The private SPU-facing server (port 9004), wire messages, SPU sessions and health."""
