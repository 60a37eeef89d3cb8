"""Who is calling the public port and what they may do: the credentials file (bearer tokens and
client-certificate names, each with a role), the principal of a request, and the right a request
needs. Purely computational, no I/O but reading the credentials file; it never logs a token. Its
reading again when the file changes, and what waits for that, are in credentials.py.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import ipaddress
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

READ = "read"
ADMIN = "admin"
ROLES = (READ, ADMIN)
ROLES_HINT = "use read, admin, or admin:PREFIX (admin on topics starting with PREFIX)"
# The third column of a credentials line naming a client certificate's subject CN, not a token.
CERT_PREFIX = "cert:"
# A token shorter than this is guessable: refused when the file is read.
MIN_TOKEN_CHARS = 16
# The principal of a request when no credential is configured (the port then listens on loopback).
ANONYMOUS = "anonymous"


class CredentialsError(ValueError):
    """The credentials file cannot be used; the message names the file, the line and what to do."""


class Unauthenticated(Exception):
    """No valid credential (HTTP 401); the message says what to send."""


class Forbidden(Exception):
    """The credential lacks the right (HTTP 403); the message names the right."""


@dataclass(frozen=True, slots=True)
class Grant:
    """A role, and for ``admin:PREFIX`` the topics it may change (read stays on everything)."""

    role: str
    topic_prefix: str | None = None

    def __str__(self) -> str:
        return self.role if self.topic_prefix is None else f"{self.role}:{self.topic_prefix}"


@dataclass(frozen=True, slots=True)
class Principal:
    """Who made a request: ``name`` is a token's name, ``CN=<cn>`` for a client certificate, or
    ``anonymous@loopback`` (``anonymous`` from elsewhere) when no credential is configured."""

    name: str
    grant: Grant
    address: str | None


@dataclass(frozen=True, slots=True)
class Presented:
    """The credential a request or connection presented (the Authorization header, the client
    certificate's CN) and where from: what outlasts one request keeps it, to be authenticated
    again when the credentials are replaced."""

    authorization: str | None
    certificate_cn: str | None
    address: str | None


@dataclass(frozen=True, slots=True)
class _Entry:
    name: str
    grant: Grant
    digest: bytes  # SHA-256 of the token: every comparison is of equal lengths


@dataclass(frozen=True)
class Credentials:
    tokens: tuple[_Entry, ...] = ()
    # Client certificate subject CN -> (name in the file, grant).
    certificates: dict[str, tuple[str, Grant]] = dataclasses.field(default_factory=dict)


def parse_grant(text: str) -> Grant:
    """``read``, ``admin`` or ``admin:PREFIX`` (admin on the topics whose name starts with PREFIX)."""
    role, colon, prefix = text.partition(":")
    if role not in ROLES or (colon and (role != ADMIN or not prefix)):
        raise ValueError(f"role {text!r} is unknown: {ROLES_HINT}")
    return Grant(role, prefix if colon else None)


def parse(text: str, source: str) -> Credentials:
    """Lines ``NAME ROLE TOKEN`` or ``NAME ROLE cert:CN``; blank lines and ``#`` comments are skipped.

    An error names the line, the field and its length, never a name, role or token: a line with
    its columns swapped holds a token in any of them."""
    tokens: list[_Entry] = []
    certificates: dict[str, tuple[str, Grant]] = {}
    name_lines: dict[str, int] = {}
    digest_lines: dict[bytes, int] = {}
    certificate_lines: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        where = f"{source} line {number}"
        if len(fields) != 3:
            raise CredentialsError(f"{where} has {len(fields)} fields: write NAME ROLE TOKEN (or NAME ROLE cert:CN)")
        name, role, secret = fields
        try:
            grant = parse_grant(role)
        except ValueError:
            raise CredentialsError(
                f"{where}: the role (field 2, {len(role)} characters, not shown) is unknown: {ROLES_HINT}"
            ) from None
        if name in name_lines:
            raise CredentialsError(
                f"{where}: the name (field 1, {len(name)} characters) is line {name_lines[name]}'s too; "
                "each credential needs a name of its own"
            )
        name_lines[name] = number
        if secret.startswith(CERT_PREFIX):
            # A certificate's subject is no secret (every TLS handshake shows it): it is named.
            common_name = secret[len(CERT_PREFIX) :]
            if not common_name:
                raise CredentialsError(f"{where}: the certificate CN (field 3) is empty: write {CERT_PREFIX}CN")
            if common_name in certificate_lines:
                raise CredentialsError(
                    f"{where}: certificate CN {common_name!r} is line {certificate_lines[common_name]}'s too; map each CN once"
                )
            certificate_lines[common_name] = number
            certificates[common_name] = (name, grant)
            continue
        if len(secret) < MIN_TOKEN_CHARS:
            raise CredentialsError(
                f"{where}: the token (field 3) has {len(secret)} characters, fewer than {MIN_TOKEN_CHARS}; "
                "make one with `python -c 'import secrets; print(secrets.token_urlsafe(32))'`"
            )
        digest = hashlib.sha256(secret.encode()).digest()
        if digest in digest_lines:
            raise CredentialsError(
                f"{where}: the token (field 3) is line {digest_lines[digest]}'s too; give each credential its own"
            )
        digest_lines[digest] = number
        tokens.append(_Entry(name, grant, digest))
    return Credentials(tuple(tokens), certificates)


def load(path: Path) -> Credentials:
    try:
        text = path.read_text()
    except OSError as error:
        raise CredentialsError(f"cannot read the credentials file {str(path)!r}: {error.strerror}") from None
    except UnicodeDecodeError:
        raise CredentialsError(f"the credentials file {str(path)!r} is not UTF-8 text") from None
    return parse(text, repr(str(path)))


def is_loopback(address: str | None) -> bool:
    if address is None:
        return False
    try:
        parsed = ipaddress.ip_address(address.partition("%")[0])
    except ValueError:
        return False
    mapped = getattr(parsed, "ipv4_mapped", None)
    return bool(parsed.is_loopback or (mapped is not None and mapped.is_loopback))


class Authenticator:
    """Turns what a request presents into its principal. ``enabled`` is False when the operator
    configured no credential (no file, no client CA): every request is then anonymous with every
    right, which is why the port then listens on loopback only (unless the operator overrides it)."""

    def __init__(self, credentials: Credentials | None, client_certificates: bool) -> None:
        self.credentials = credentials or Credentials()
        self.enabled = credentials is not None or client_certificates
        # Called at each replace(): what holds a principal for long (a watch, a Fluvio connection)
        # authenticates what it presented again (credentials.until_refused).
        self._listeners: set[Callable[[], None]] = set()

    def replace(self, credentials: Credentials) -> None:
        """New credentials, from the next request on; what holds a principal for long is told."""
        self.credentials = credentials
        for listener in list(self._listeners):
            listener()

    def listen(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener`` at each replace() from now on; returns what stops it."""
        self._listeners.add(listener)
        return lambda: self._listeners.discard(listener)

    def refusal(self, presented: Presented, right: Right) -> str | None:
        """Why the current credentials do not give what was ``presented`` the ``right`` (a
        credential removed, or a role lowered below it), or None if they do."""
        try:
            check(self.authenticate(presented.authorization, presented.certificate_cn, presented.address), right)
        except (Unauthenticated, Forbidden) as refused:
            return str(refused)
        return None

    def authenticate(self, authorization: str | None, certificate_cn: str | None, address: str | None) -> Principal:
        if not self.enabled:
            name = f"{ANONYMOUS}@loopback" if is_loopback(address) else ANONYMOUS
            return Principal(name, Grant(ADMIN), address)
        if authorization is not None:
            scheme, _, token = authorization.strip().partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise Unauthenticated("the Authorization header must be 'Bearer TOKEN'")
            entry = self._token(token.strip())
            if entry is None:
                raise Unauthenticated("the bearer token is not valid: use a token from the SC's --auth-tokens file")
            return Principal(entry.name, entry.grant, address)
        if certificate_cn is not None:
            mapped = self.credentials.certificates.get(certificate_cn)
            if mapped is None:
                raise Unauthenticated(
                    f"client certificate CN={certificate_cn!r} has no role: map it in the SC's --auth-tokens file "
                    f"(a line NAME ROLE cert:{certificate_cn})"
                )
            return Principal(f"CN={certificate_cn}", mapped[1], address)
        raise Unauthenticated(
            "this SC requires a credential: send 'Authorization: Bearer TOKEN' (a token of its --auth-tokens file) "
            "or a client certificate its --tls-client-ca signed"
        )

    def _token(self, token: str) -> _Entry | None:
        """The entry of ``token``, comparing with every entry in constant time (no early exit)."""
        digest = hashlib.sha256(token.encode()).digest()
        found = None
        for entry in self.credentials.tokens:
            if hmac.compare_digest(digest, entry.digest):
                found = entry
        return found


@dataclass(frozen=True, slots=True)
class Right:
    """What a request needs: ``role``, and for a change of one topic, its name (for admin:PREFIX)."""

    role: str
    topic: str | None = None

    def __str__(self) -> str:
        return self.role if self.topic is None else f"{self.role} on topic {self.topic!r}"


# The live page's files: its code only, the same for everyone (it ships in the package). Everything it
# shows it reads from the API with the credential the person gives it.
UI_PATHS = frozenset({"/ui", "/ui/app.js", "/ui/app.css"})
# Requests answered without any credential: a load balancer's or orchestrator's health check, and
# the live page's files.
UNAUTHENTICATED_PATHS = frozenset({"/healthz", *UI_PATHS})
# A browser cannot set headers on a WebSocket: the live page offers its token as a subprotocol
# ``bearer.<token in base64url, unpadded>`` next to WEBSOCKET_PROTOCOL, which the SC picks (never
# the token's), so the token is neither in the URL nor echoed back.
WEBSOCKET_PROTOCOL = "sc.v1"
WEBSOCKET_BEARER_PREFIX = "bearer."
# POST routes that change nothing (placement dry runs): the read role may call them.
_READ_POSTS = frozenset({"/v1/placement"})
# POST routes whose handler honours ?dryRun=true (writes nothing then): the read role may call
# them so. Any other POST needs admin whatever its query says (a dryRun there is ignored).
_DRY_RUN_POSTS = frozenset({"/v1/topics", "/v1/cluster/rebalance"})


def _dry_run_route(path: str) -> bool:
    if path in _DRY_RUN_POSTS:
        return True
    parts = path.split("/")  # /v1/spus/{name}/decommission
    return len(parts) == 5 and parts[:3] == ["", "v1", "spus"] and parts[3] != "" and parts[4] == "decommission"


def http_right(method: str, path: str, dry_run: bool) -> Right | None:
    """The right an HTTP request needs (None: none at all)."""
    if path in UNAUTHENTICATED_PATHS:
        return None
    if method in ("GET", "HEAD", "OPTIONS") or path in _READ_POSTS or (method == "POST" and dry_run and _dry_run_route(path)):
        return Right(READ)
    return Right(ADMIN, _topic_of(path))


def cross_site_refusal(method: str, websocket: bool, origin: str | None, fetch_site: str | None, host: str | None) -> str | None:
    """Why a browser's request from another site is refused (None: it is not one). A page on any
    site may make a browser send a POST (a form, ``fetch`` with ``no-cors``) or open a WebSocket
    to the SC, with whatever ambient credential the browser holds: a client certificate imported
    into it, or none at all on the loopback default. Browsers name the page's origin on both;
    clients that are not browsers (the CLI, curl, SDKs) send no Origin and are not concerned.
    Reads other than WebSockets are not refused: the browser does not let the other site read
    the answer (no CORS header is ever sent)."""
    if method in ("GET", "HEAD", "OPTIONS") and not websocket:
        return None
    what = "a WebSocket" if websocket else f"a {method}"
    if origin is not None:
        sent_from = _netloc(origin) if origin != "null" else ""
        if sent_from and host is not None and sent_from == host.lower():
            return None  # the SC's own live page
        return (
            f"{what} sent by a page of origin {origin[:100]!r}, another site than this SC ({(host or '')[:100]!r}), is refused: "
            "only the SC's own live page and clients that send no Origin (the CLI, curl, SDKs) may change the cluster or watch it"
        )
    if fetch_site == "cross-site":
        return f"{what} a browser sent from another site (Sec-Fetch-Site: cross-site) is refused"
    return None


def _netloc(url: str) -> str:
    """``HOST[:PORT]`` of ``url``, lower case; "" when it has none or cannot be parsed."""
    try:
        return urllib.parse.urlsplit(url).netloc.lower()
    except ValueError:  # unbalanced brackets
        return ""


def anonymous_host_refusal(host: str | None) -> str | None:
    """Why a request to an SC without credentials is refused for the Host it names (None: not).
    With no credential configured anyone who reaches the port is admin, and the port listens on
    loopback: a page of another site can still reach it through DNS rebinding (its own name made
    to resolve to 127.0.0.1), and then names its own host. Only an IP address or localhost is
    taken."""
    try:
        name = urllib.parse.urlsplit(f"//{host or ''}").hostname or ""
    except ValueError:  # unbalanced brackets: no name at all
        name = ""
    if name == "localhost" or name.endswith(".localhost"):
        return None
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return (
            f"this SC has no credentials configured, so only requests naming it by IP address or localhost are "
            f"served, not Host {(host or '')[:100]!r} (a page of another site may have made its own name point here); "
            "give it credentials (--auth-tokens, --tls-client-ca) to be reached by name"
        )
    return None


def websocket_authorization(protocols: str | None) -> str | None:
    """``Bearer TOKEN`` from a ``Sec-WebSocket-Protocol`` header offering ``bearer.<base64url>``;
    None when it offers none. A token that does not decode is passed on as it is, to be refused."""
    if protocols is None:
        return None
    for offered in protocols.split(","):
        offered = offered.strip()
        if offered.startswith(WEBSOCKET_BEARER_PREFIX):
            encoded = offered[len(WEBSOCKET_BEARER_PREFIX) :]
            try:
                token = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
            except (ValueError, UnicodeDecodeError):
                token = encoded
            return f"Bearer {token}"
    return None


def without_websocket_token(protocols: str) -> str:
    """``protocols`` (a ``Sec-WebSocket-Protocol`` header) without the token's entry: the rest is
    handed to the WebSocket handshake, which may log what it does not know."""
    return ", ".join(offered.strip() for offered in protocols.split(",") if not offered.strip().startswith(WEBSOCKET_BEARER_PREFIX))


def _topic_of(path: str) -> str | None:
    """The topic a path changes (``/v1/topics/NAME``..., ``/v1/partitions/NAME-I``), if any."""
    parts = path.split("/")
    if len(parts) >= 4 and parts[1] == "v1" and parts[2] == "topics":
        return parts[3]
    if len(parts) >= 4 and parts[1] == "v1" and parts[2] == "partitions":
        return parts[3].rpartition("-")[0] or parts[3]
    return None


def check(principal: Principal, right: Right, topics: Iterable[str] = ()) -> None:
    """Raise Forbidden unless ``principal`` holds ``right`` (over ``topics`` as well, if given)."""
    grant = principal.grant
    if right.role == READ or (grant.role == ADMIN and grant.topic_prefix is None):
        return
    if grant.role == ADMIN and grant.topic_prefix is not None:
        named = [right.topic] if right.topic is not None else list(topics)
        outside = [topic for topic in named if not topic.startswith(grant.topic_prefix)]
        if named and not outside:
            return
        what = f"topic {outside[0]!r}" if outside else "objects other than topics"
        raise Forbidden(
            f"{principal.name} has role {grant}: it may change only topics starting with {grant.topic_prefix!r}, "
            f"not {what}; this request needs {right}"
        )
    raise Forbidden(f"{principal.name} has role {grant}, and this request needs {right}; ask for an admin credential")
