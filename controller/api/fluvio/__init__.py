"""Fluvio's own binary admin protocol on the public port, next to the HTTP API (../shared/fluvio-wire.md)."""
