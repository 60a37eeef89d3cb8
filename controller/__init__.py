"""The Streaming Controller daemon: pipeline, controllers, placement, public API and CLI."""
