"""Structured logging setup: structlog rendering to the console on a terminal, JSON otherwise.

Called once by the CLI entry point; library modules only call structlog.get_logger().
"""

from __future__ import annotations

import logging
import sys

import structlog

from controller import config


def configure(log_format: config.LogFormat = config.LogFormat.AUTO, level: str = "info") -> None:
    numeric_level = logging.getLevelNamesMapping().get(level.upper())
    if numeric_level is None:
        raise ValueError(f"log level {level!r} is unknown: use debug, info, warning or error")
    as_json = log_format is config.LogFormat.JSON or (
        log_format is config.LogFormat.AUTO and not sys.stderr.isatty()
    )
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if as_json else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    timestamper = structlog.processors.TimeStamper(fmt="iso", utc=True)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            timestamper,
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric_level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    # Libraries that use the standard logging module (the etcd supervisor, aiohttp, grpc) are
    # rendered by the same renderer: one JSON object per line off a terminal, like our events.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[structlog.stdlib.add_log_level, structlog.stdlib.add_logger_name, timestamper],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                renderer,
            ],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(max(numeric_level, logging.INFO))
