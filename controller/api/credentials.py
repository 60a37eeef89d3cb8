"""The credentials file read again while the SC runs (when it changes, and on SIGHUP, as the TLS
files are), and what a long-lived holder of a principal (a watch, a Fluvio connection) waits on to
learn that its credential was revoked. auth.py stays pure: this is its I/O and asyncio side.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import structlog

from connection_manager import tls
from controller.api import auth

log = structlog.get_logger(__name__)


class CredentialsFile(tls.Reloadable[auth.Credentials]):
    """The credentials file, read again when it changes and on SIGHUP (as the TLS files are): read
    and parsed in a worker thread; a file that parses replaces the authenticator's credentials at
    once, on the event loop (what holds a principal is told there); one that does not leaves them."""

    def __init__(self, path: Path, authenticator: auth.Authenticator) -> None:
        self.authenticator = authenticator
        what = "credentials file (auth_tokens)"
        super().__init__("auth_tokens", what, (path,), ((path, what),), "the public port keeps the previous credentials")

    def read(self) -> auth.Credentials:
        return auth.load(self.paths[0])

    def put(self, built: auth.Credentials) -> None:
        self.authenticator.replace(built)
        log.info("public port credentials loaded", tokens=len(built.tokens), certificates=len(built.certificates))


async def until_refused(authenticator: auth.Authenticator, presented: auth.Presented, right: auth.Right) -> str:
    """Returns, with why, once the credentials no longer give what was ``presented`` the ``right``:
    a credential removed, or a role lowered below it. Checked at once too: they may have been
    replaced since it was presented."""
    replaced = asyncio.Event()
    stop = authenticator.listen(replaced.set)
    try:
        while True:
            replaced.clear()
            refusal = authenticator.refusal(presented, right)
            if refusal is not None:
                return refusal
            await replaced.wait()
    finally:
        stop()
