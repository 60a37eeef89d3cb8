"""TLS for both SC ports and for their clients: server contexts built from certificate and key files
(TLS 1.2 at least), rebuilt when the files change or on demand (SIGHUP), and the names a peer's
certificate carries. It never reads a connection: the accept loop asks it for the current context.
"""

from __future__ import annotations

import asyncio
import os
import ssl
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

log = structlog.get_logger(__name__)

MINIMUM_VERSION = ssl.TLSVersion.TLSv1_2
# Seconds between two looks at the certificate files' modification times.
WATCH_INTERVAL = 2.0


class TlsError(ValueError):
    """Certificate or key files that cannot be used; the message names the file and what to do."""


@dataclass(frozen=True)
class Files:
    """The SC's certificate, its key, and the CA that signs acceptable client certificates (None:
    client certificates are not asked for)."""

    cert: Path
    key: Path
    client_ca: Path | None = None

    def paths(self) -> tuple[Path, ...]:
        return (self.cert, self.key) + ((self.client_ca,) if self.client_ca is not None else ())


def server_context(files: Files, require_client_cert: bool) -> ssl.SSLContext:
    """A server context from ``files``: with a client CA, client certificates are verified against it,
    and required when ``require_client_cert`` (the SPUs' port), else optional (the public port)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = MINIMUM_VERSION
    try:
        context.load_cert_chain(files.cert, files.key)
    except FileNotFoundError as error:
        raise TlsError(f"TLS file {error.filename!r} does not exist: check --tls-cert and --tls-key") from None
    except (ssl.SSLError, OSError) as error:
        raise TlsError(
            f"cannot use TLS certificate {str(files.cert)!r} with key {str(files.key)!r} ({error}): "
            "give a PEM certificate (chain) and the PEM private key that matches it"
        ) from None
    if files.client_ca is not None:
        try:
            context.load_verify_locations(cafile=files.client_ca)
        except (ssl.SSLError, OSError) as error:
            raise TlsError(f"cannot use client CA {str(files.client_ca)!r} ({error}): give a PEM CA certificate") from None
        context.verify_mode = ssl.CERT_REQUIRED if require_client_cert else ssl.CERT_OPTIONAL
    return context


def client_context(ca: Path | None, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    """A client context that trusts ``ca`` (None: the system's CAs) and presents ``cert`` if given."""
    context = ssl.create_default_context(cafile=str(ca) if ca is not None else None)
    context.minimum_version = MINIMUM_VERSION
    if cert is not None:
        context.load_cert_chain(cert, key)
    return context


class Contexts:
    """The current server contexts of both ports. ``reload`` builds new ones from the files; a new
    handshake takes the newest, a connection already open keeps the one it was made with. Files that
    do not load leave the contexts as they were (and say why in the log)."""

    def __init__(self, files: Files) -> None:
        self.files = files
        self.public = server_context(files, require_client_cert=False)
        self.private = server_context(files, require_client_cert=True)
        self.reloads = 0
        self._seen = self._signature()

    def reload(self) -> bool:
        """Build both contexts again from the files; False (and an error logged) if they do not load."""
        self._seen = self._signature()
        try:
            public = server_context(self.files, require_client_cert=False)
            private = server_context(self.files, require_client_cert=True)
        except TlsError as error:
            log.error("TLS files not reloaded: the connections keep the previous certificate", error=str(error))
            return False
        self.public, self.private = public, private
        self.reloads += 1
        log.info("TLS certificate reloaded", cert=str(self.files.cert), reloads=self.reloads)
        return True

    def reload_if_changed(self) -> bool:
        """Reload when a file's inode, size or modification time differs from the last load."""
        return self._signature() != self._seen and self.reload()

    async def watch(self, interval: float = WATCH_INTERVAL) -> None:
        """Reload on every change of the files, looking every ``interval`` seconds (forever)."""
        while True:
            await asyncio.sleep(interval)
            await asyncio.to_thread(self.reload_if_changed)

    def _signature(self) -> tuple[tuple[int, int, int] | None, ...]:
        signature: list[tuple[int, int, int] | None] = []
        for path in self.files.paths():
            try:
                info = path.stat()
            except OSError:
                signature.append(None)
            else:
                signature.append((info.st_ino, info.st_size, info.st_mtime_ns))
        return tuple(signature)


def peer_names(peercert: dict[str, Any] | None) -> tuple[str | None, tuple[str, ...]]:
    """A verified peer certificate's subject CN and DNS subject-alternative names (ssl's getpeercert())."""
    if not peercert:
        return None, ()
    common_name = None
    for relative_name in peercert.get("subject", ()):
        for key, value in relative_name:
            if key == "commonName":
                common_name = value
    dns_names = tuple(value for key, value in peercert.get("subjectAltName", ()) if key == "DNS")
    return common_name, dns_names


def peercert_of(transport: asyncio.BaseTransport | None) -> dict[str, Any] | None:
    """The verified client certificate of a TLS connection (None: plaintext, or no certificate)."""
    if transport is None:
        return None
    return transport.get_extra_info("peercert")


def warn_if_readable_by_others(path: Path | None, what: str) -> bool:
    """Log a warning when a secret file (a key, a token file) is readable by its group or by others;
    True if it is."""
    if path is None:
        return False
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    if mode & (stat.S_IRGRP | stat.S_IROTH):
        log.warning(
            f"the {what} is readable by other users: make it readable by the SC's user only (chmod 600)",
            file=str(path), mode=oct(stat.S_IMODE(mode)),
        )  # fmt: skip
        return True
    return False
