"""Unit tests of the Fluvio admin protocol: codec, mapping and the per-connection server."""
