"""TLS for both SC ports and for their clients: server contexts built from certificate and key files
(TLS 1.2 at least), rebuilt when the files change or on demand (SIGHUP), and the names a peer's
certificate carries. It never reads a connection: the accept loop asks it for the current context.
The other secret files (the public port's credentials, the SPU token) are read again the same way
(Reloadable).
"""

from __future__ import annotations

import asyncio
import os
import ssl
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import structlog

log = structlog.get_logger(__name__)

MINIMUM_VERSION = ssl.TLSVersion.TLSv1_2
# Seconds between two looks at the secret files' modification times.
WATCH_INTERVAL = 2.0

# What a Reloadable builds from its files (the TLS contexts, the credentials, the SPU tokens).
Built = TypeVar("Built")
# Each file's inode, size and modification time (None: it cannot be looked at).
Signature = tuple[tuple[int, int, int] | None, ...]


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


class Reloadable(Generic[Built]):
    """What the SC builds from files and builds again when they change (``watch``) or on demand
    (SIGHUP), in two parts. ``read`` reads the files and builds what they hold, or raises ValueError
    (a message naming the file, the line and what to do, never a secret); it runs in a worker
    thread, so that a large file or a slow disk holds no request, heartbeat or controller pass, and
    therefore touches nothing shared. ``put`` then puts what was built in place and tells what holds
    a credential, on the event loop. Files that do not load leave what was loaded before in place:
    an error in the log, a count in ``failures`` (``/metrics``), and the SC goes on. One reload of
    a file at a time: a watcher's and a SIGHUP's at once take turns, so an older read is never put
    in place over a newer one."""

    def __init__(self, name: str, what: str, paths: tuple[Path, ...], secrets: tuple[tuple[Path, str], ...], kept: str) -> None:
        self.name = name  # the metrics' label: tls, auth_tokens, spu_token
        self.what = what  # for the log: "TLS files", "credentials file (auth_tokens)"
        self.paths = paths
        self.secrets = secrets  # (file, what it is): warned about at each load when others may read it
        self.kept = kept  # what stays when the files do not load, for the log
        self.reloads = 0
        self.failures = 0
        self._seen = self._signature()
        self._turn = asyncio.Lock()

    def read(self) -> Built:
        """What the files hold now, built (in a worker thread: it changes nothing)."""
        raise NotImplementedError

    def put(self, built: Built) -> None:
        """Put what ``read`` built in place, and tell who must know (on the event loop)."""
        raise NotImplementedError

    async def reload(self) -> bool:
        """Read the files again; False (an error logged, counted) if they do not load."""
        async with self._turn:
            return await self._reload()

    async def reload_if_changed(self) -> bool:
        """Reload if a file changed since the last load (looked at in a worker thread too)."""
        async with self._turn:
            return await asyncio.to_thread(self.changed) and await self._reload()

    def changed(self) -> bool:
        """Whether a file's inode, size or modification time differs from the last load."""
        return self._signature() != self._seen

    async def _reload(self) -> bool:
        # Cancelled while the thread reads (the SC stops): nothing is put, the thread's result is dropped.
        seen, built = await asyncio.to_thread(self._read)
        self._seen = seen
        if isinstance(built, ValueError):
            self.failures += 1
            log.error(f"{self.what} not reloaded: {self.kept}", error=str(built), failures=self.failures)
            return False
        self.put(built)
        self.reloads += 1
        log.info(f"{self.what} reloaded", file=str(self.paths[0]), reloads=self.reloads)
        return True

    def _read(self) -> tuple[Signature, Built | ValueError]:
        """In the worker thread: the files' signature before they are read (a change while they are
        is seen at the next look), the secrets' permissions warned about, and what ``read`` built
        or why it could not."""
        seen = self._signature()
        for path, secret in self.secrets:
            warn_if_readable_by_others(path, secret)
        try:
            return seen, self.read()
        except ValueError as error:
            return seen, error

    def _signature(self) -> Signature:
        signature: list[tuple[int, int, int] | None] = []
        for path in self.paths:
            try:
                info = path.stat()
            except OSError:
                signature.append(None)
            else:
                signature.append((info.st_ino, info.st_size, info.st_mtime_ns))
        return tuple(signature)


async def watch(reloadables: Sequence[Reloadable[Any]], interval: float = WATCH_INTERVAL) -> None:
    """Reload each on every change of its files, looking every ``interval`` seconds (forever). The
    looks and the reads are in a worker thread (a slow disk holds no connection); what was read is
    put in place on the loop, where what holds a credential is told at once."""
    while True:
        await asyncio.sleep(interval)
        for reloadable in reloadables:
            await reloadable.reload_if_changed()


class Contexts(Reloadable[tuple[ssl.SSLContext, ssl.SSLContext]]):
    """The current server contexts of both ports. A reload builds new ones from the files (loading
    the certificate and the key in a worker thread); a new handshake takes the newest, a connection
    already open keeps the one it was made with. Files that do not load leave the contexts as they
    were (and say why in the log)."""

    def __init__(self, files: Files) -> None:
        self.files = files
        self.public, self.private = self.read()
        super().__init__(
            "tls", "TLS files", files.paths(), ((files.key, "TLS private key"),), "the connections keep the previous certificate"
        )

    def read(self) -> tuple[ssl.SSLContext, ssl.SSLContext]:
        return server_context(self.files, require_client_cert=False), server_context(self.files, require_client_cert=True)

    def put(self, built: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
        self.public, self.private = built


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
