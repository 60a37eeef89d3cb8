"""The credentials file, principals and rights of the public port (controller/api/auth.py): pure,
table-driven."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest
import structlog

from connection_manager import tls
from controller import config
from controller.api import auth, credentials
from store import supervisor
from tests.fixtures.threads import on_the_loop

TOKEN = "a-token-of-24-characters"


def test_a_file_gives_tokens_and_certificate_names_their_roles() -> None:
    credentials = auth.parse(f"# comment\n\nalice admin {TOKEN}\nbob read {TOKEN}-b\nops admin:orders- cert:ops-host\n", "f")
    authenticator = auth.Authenticator(credentials, client_certificates=True)
    assert authenticator.authenticate(f"Bearer {TOKEN}", None, "10.0.0.1") == auth.Principal("alice", auth.Grant("admin"), "10.0.0.1")
    assert authenticator.authenticate(f"bearer  {TOKEN}-b ", "ops-host", None) == auth.Principal("bob", auth.Grant("read"), None)
    assert authenticator.authenticate(None, "ops-host", "::1") == auth.Principal("CN=ops-host", auth.Grant("admin", "orders-"), "::1")


@pytest.mark.parametrize(
    ("header", "common_name", "message"),
    [
        (None, None, "this SC requires a credential: send 'Authorization: Bearer TOKEN' (a token of its --auth-tokens file) or a client certificate its --tls-client-ca signed"),
        ("Bearer wrong-token-but-long-enough", None, "the bearer token is not valid: use a token from the SC's --auth-tokens file"),
        (f"Basic {TOKEN}", None, "the Authorization header must be 'Bearer TOKEN'"),
        ("Bearer ", None, "the Authorization header must be 'Bearer TOKEN'"),
        (None, "stranger", "client certificate CN='stranger' has no role: map it in the SC's --auth-tokens file (a line NAME ROLE cert:stranger)"),
    ],
)
def test_no_valid_credential_is_refused_with_what_to_send(header: str | None, common_name: str | None, message: str) -> None:
    authenticator = auth.Authenticator(auth.parse(f"alice admin {TOKEN}\n", "f"), client_certificates=True)
    with pytest.raises(auth.Unauthenticated) as refused:
        authenticator.authenticate(header, common_name, "10.0.0.1")
    assert str(refused.value) == message


def test_without_credentials_everyone_is_anonymous_with_every_right() -> None:
    authenticator = auth.Authenticator(None, client_certificates=False)
    assert not authenticator.enabled
    assert authenticator.authenticate("Bearer anything", None, "127.0.0.1") == auth.Principal("anonymous@loopback", auth.Grant("admin"), "127.0.0.1")
    assert authenticator.authenticate(None, None, "10.1.2.3").name == "anonymous"


HINT = "use read, admin, or admin:PREFIX (admin on topics starting with PREFIX)"
MAKE_ONE = "make one with `python -c 'import secrets; print(secrets.token_urlsafe(32))'`"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("alice admin", "'t' line 1 has 2 fields: write NAME ROLE TOKEN (or NAME ROLE cert:CN)"),
        (f"alice root {TOKEN}", f"'t' line 1: the role (field 2, 4 characters, not shown) is unknown: {HINT}"),
        (f"alice read:x {TOKEN}", f"'t' line 1: the role (field 2, 6 characters, not shown) is unknown: {HINT}"),
        (f"alice admin: {TOKEN}", f"'t' line 1: the role (field 2, 6 characters, not shown) is unknown: {HINT}"),
        # The columns swapped: the token is where the role goes, and is not shown there either.
        (f"alice {TOKEN} admin", f"'t' line 1: the role (field 2, 24 characters, not shown) is unknown: {HINT}"),
        ("alice admin short", f"'t' line 1: the token (field 3) has 5 characters, fewer than 16; {MAKE_ONE}"),
        (f"alice admin {TOKEN}\nalice read {TOKEN}x", "'t' line 2: the name (field 1, 5 characters) is line 1's too; each credential needs a name of its own"),
        (f"alice admin {TOKEN}\nbob read {TOKEN}", "'t' line 2: the token (field 3) is line 1's too; give each credential its own"),
        ("a admin cert:x\nb read cert:x", "'t' line 2: certificate CN 'x' is line 1's too; map each CN once"),
        ("a admin cert:", "'t' line 1: the certificate CN (field 3) is empty: write cert:CN"),
        # The name and the token swapped: the token is in the name column, and the name too short for a token.
        (f"{TOKEN} admin alice", f"'t' line 1: the token (field 3) has 5 characters, fewer than 16; {MAKE_ONE}"),
        (f"{TOKEN} admin {TOKEN}-b\n{TOKEN} read {TOKEN}-c", "'t' line 2: the name (field 1, 24 characters) is line 1's too; each credential needs a name of its own"),
        (f"{TOKEN} admin {TOKEN}-b\n{TOKEN}-x read {TOKEN}-b", "'t' line 2: the token (field 3) is line 1's too; give each credential its own"),
        # A token in every column.
        (f"{TOKEN} {TOKEN} {TOKEN}", f"'t' line 1: the role (field 2, 24 characters, not shown) is unknown: {HINT}"),
    ],
)
def test_a_bad_line_is_named_and_its_token_never_shown(text: str, message: str) -> None:
    with pytest.raises(auth.CredentialsError) as refused:
        auth.parse(text, "'t'")
    assert str(refused.value) == message
    assert TOKEN not in str(refused.value)
    assert TOKEN[:8] not in str(refused.value)


@pytest.mark.parametrize(
    "text",
    [
        f"{TOKEN} admin alice",  # name and token swapped: the token's length check quoted the name
        f"{TOKEN} admin {TOKEN}-b\n{TOKEN} read {TOKEN}-c",  # the name given twice
        f"{TOKEN} admin {TOKEN}-b\n{TOKEN}-x read {TOKEN}-b",  # the token given twice
        f"alice admin {TOKEN}\n{TOKEN} read {TOKEN}",  # a token given twice, beside a name that is one
        f"{TOKEN} {TOKEN} {TOKEN}",
        f"short {TOKEN} x",
    ],
)
def test_a_token_in_any_column_is_never_shown(text: str) -> None:
    """Whatever column a token is in, the error names the line and the field's length only."""
    with pytest.raises(auth.CredentialsError) as refused:
        auth.parse(text, "'t'")
    assert "line " in str(refused.value)
    assert TOKEN[:8] not in str(refused.value)


def test_an_unreadable_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(auth.CredentialsError) as refused:
        auth.load(tmp_path / "absent")
    assert str(refused.value) == f"cannot read the credentials file {str(tmp_path / 'absent')!r}: No such file or directory"


@pytest.mark.parametrize(
    ("method", "path", "dry_run", "right"),
    [
        ("GET", "/healthz", False, None),
        ("GET", "/metrics", False, auth.Right("read")),
        ("GET", "/v1/watch/topics", False, auth.Right("read")),
        ("POST", "/v1/placement", False, auth.Right("read")),
        ("POST", "/v1/topics", True, auth.Right("read")),
        ("POST", "/v1/topics", False, auth.Right("admin")),
        ("DELETE", "/v1/topics/orders-eu", False, auth.Right("admin", "orders-eu")),
        ("POST", "/v1/topics/orders-eu/partitions", False, auth.Right("admin", "orders-eu")),
        ("DELETE", "/v1/partitions/orders-eu-3", False, auth.Right("admin", "orders-eu")),
        ("POST", "/v1/spus/spu-1/drain", False, auth.Right("admin")),
        # A dry run is the read role's where the route has one; elsewhere the query changes nothing.
        ("POST", "/v1/cluster/rebalance", True, auth.Right("read")),
        ("POST", "/v1/spus/spu-1/decommission", True, auth.Right("read")),
        ("POST", "/v1/spus/spu-1/drain", True, auth.Right("admin")),
        ("POST", "/v1/spus", True, auth.Right("admin")),
        ("POST", "/v1/spus/a/b/decommission", True, auth.Right("admin")),
        ("POST", "/v1/spu-groups/g/scale", True, auth.Right("admin")),
        ("POST", "/v1/topics/orders-eu/partitions", True, auth.Right("admin", "orders-eu")),
    ],
)
def test_each_request_needs_its_right(method: str, path: str, dry_run: bool, right: auth.Right | None) -> None:
    assert auth.http_right(method, path, dry_run) == right


def test_a_topic_prefix_admin_changes_its_topics_only() -> None:
    orders = auth.Principal("orders", auth.Grant("admin", "orders-"), None)
    auth.check(orders, auth.Right("admin", "orders-eu"))
    auth.check(orders, auth.Right("admin"), topics=["orders-a", "orders-b"])
    auth.check(orders, auth.Right("read"))
    with pytest.raises(auth.Forbidden) as refused:
        auth.check(orders, auth.Right("admin", "payments"))
    assert str(refused.value) == (
        "orders has role admin:orders-: it may change only topics starting with 'orders-', not topic 'payments'; "
        "this request needs admin on topic 'payments'"
    )
    with pytest.raises(auth.Forbidden, match="not objects other than topics"):
        auth.check(orders, auth.Right("admin"))
    reader = auth.Principal("bob", auth.Grant("read"), None)
    with pytest.raises(auth.Forbidden, match="^bob has role read, and this request needs admin; ask for an admin credential$"):
        auth.check(reader, auth.Right("admin"))


@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        ({"tls_cert": "c.pem"}, "tls_cert is set but tls_key is not: TLS needs both the certificate and its key"),
        ({"tls_key": "k.pem"}, "tls_key is set but tls_cert is not: TLS needs both the certificate and its key"),
        ({"tls_client_ca": "ca.pem"}, "tls_client_ca is set without tls_cert and tls_key: client certificates need TLS"),
    ],
)
def test_tls_settings_come_in_pairs(settings: dict[str, Any], problem: str) -> None:
    with pytest.raises(config.ConfigError) as refused:
        config.load(**settings)
    assert refused.value.problems == [f"(settings) (default) = {json.dumps(settings)}: {problem}"]


@pytest.mark.parametrize(
    ("protocols", "authorization"),
    [
        (None, None),
        ("sc.v1", None),
        # "a token of 24 characters" in base64url, without its padding, after the page's own subprotocol.
        ("sc.v1, bearer.YS10b2tlbi1vZi0yNC1jaGFyYWN0ZXJz", f"Bearer {TOKEN}"),
        ("bearer.YS10b2tlbi1vZi0yNC1jaGFyYWN0ZXJz,sc.v1", f"Bearer {TOKEN}"),
        # A token with characters base64url would pad: "é-token!" is 9 bytes.
        ("sc.v1, bearer.w6ktdG9rZW4h", "Bearer é-token!"),
        # Not base64url: handed on as it is, so it is refused as an unknown token, never a 500.
        ("sc.v1, bearer.not*base64", "Bearer not*base64"),
        ("sc.v1, bearer.", "Bearer "),
    ],
)
def test_a_browser_websocket_offers_its_token_as_a_subprotocol(protocols: str | None, authorization: str | None) -> None:
    assert auth.websocket_authorization(protocols) == authorization


def test_the_live_pages_files_need_no_credential_and_what_they_show_does() -> None:
    for path in ("/ui", "/ui/app.js", "/ui/app.css", "/healthz"):
        assert auth.http_right("GET", path, dry_run=False) is None, path
    for path in ("/ui/other.js", "/ui/", "/ui/../v1/spus", "/v1/watch/events", "/v1/watch/spus", "/v1/cluster"):
        assert auth.http_right("GET", path, dry_run=False) == auth.Right(auth.READ), path


@pytest.mark.parametrize(
    ("protocols", "kept"),
    [("sc.v1, bearer.YS10b2tlbg", "sc.v1"), ("bearer.YS10b2tlbg", ""), ("a,  bearer.x ,b", "a, b"), ("sc.v1", "sc.v1")],
)
def test_the_token_is_taken_out_of_the_subprotocols_the_handshake_sees(protocols: str, kept: str) -> None:
    assert auth.without_websocket_token(protocols) == kept


@pytest.mark.parametrize(
    ("method", "websocket", "origin", "fetch_site", "refused"),
    [
        ("POST", False, None, None, False),  # the CLI, curl, an SDK: no Origin
        ("POST", False, "https://sc.example:9003", "same-origin", False),  # the SC's own live page
        ("POST", False, "https://evil.example", "cross-site", True),
        ("DELETE", False, "null", None, True),  # a sandboxed frame, a file:// page
        ("GET", True, "https://evil.example", None, True),  # a WebSocket streams what it watches
        ("GET", True, "https://sc.example:9003", None, False),
        ("GET", False, "https://evil.example", "cross-site", False),  # the browser keeps the answer from the page
        ("POST", False, None, "cross-site", True),
    ],
)
def test_requests_a_browser_sends_for_another_site_are_refused(
    method: str, websocket: bool, origin: str | None, fetch_site: str | None, refused: bool
) -> None:
    assert (auth.cross_site_refusal(method, websocket, origin, fetch_site, "sc.example:9003") is not None) is refused


@pytest.mark.parametrize(
    ("host", "refused"),
    [("127.0.0.1:9003", False), ("[::1]:9003", False), ("localhost:9003", False), ("localhost", False),
     ("10.0.0.5:9003", False), ("attacker.example:9003", True), ("sc.internal", True), (None, True)],
)
def test_an_sc_without_credentials_is_reached_by_address_or_localhost_only(host: str | None, refused: bool) -> None:
    assert (auth.anonymous_host_refusal(host) is not None) is refused


@pytest.mark.parametrize("value", ["[abc", "x]:1", "http://[::1", "\x00", "a" * 10_000])
def test_a_malformed_origin_or_host_is_refused_not_an_error(value: str) -> None:
    """urllib raises on unbalanced brackets: a hostile header was a 500 and a traceback."""
    assert auth.cross_site_refusal("POST", False, value, None, "127.0.0.1:9003") is not None
    refusal = auth.anonymous_host_refusal(value)
    assert refusal is not None and len(refusal) < 500


# ---------------------------------------------------------------------------- the file read again


async def test_replaced_credentials_refuse_what_they_dropped_and_tell_what_holds_a_principal(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text(f"alice admin {TOKEN}\nops admin cert:ops-host\n")
    authenticator = auth.Authenticator(auth.load(path), client_certificates=True)
    credentials_file = credentials.CredentialsFile(path, authenticator)
    alice, ops = auth.Presented(f"Bearer {TOKEN}", None, "10.0.0.1"), auth.Presented(None, "ops-host", "10.0.0.2")
    alice_refused = asyncio.ensure_future(credentials.until_refused(authenticator, alice, auth.Right(auth.READ)))
    ops_refused = asyncio.ensure_future(credentials.until_refused(authenticator, ops, auth.Right(auth.ADMIN)))
    assert not credentials_file.changed()

    path.write_text(f"alice read {TOKEN}\n")  # ops removed, alice lowered to read
    assert await credentials_file.reload_if_changed() and credentials_file.reloads == 1
    assert await ops_refused == (
        "client certificate CN='ops-host' has no role: map it in the SC's --auth-tokens file (a line NAME ROLE cert:ops-host)"
    )
    await asyncio.sleep(0)
    assert not alice_refused.done()  # read is all a watch needs
    assert authenticator.authenticate(alice.authorization, None, None).grant == auth.Grant(auth.READ)

    path.write_text(f"bob read {TOKEN}-bob\n")
    await credentials_file.reload()
    assert await alice_refused == "the bearer token is not valid: use a token from the SC's --auth-tokens file"


async def test_a_file_that_does_not_parse_on_reload_keeps_the_credentials_and_names_the_line_not_the_token(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text(f"alice admin {TOKEN}\n")
    path.chmod(0o600)
    authenticator = auth.Authenticator(auth.load(path), client_certificates=False)
    credentials_file = credentials.CredentialsFile(path, authenticator)
    path.write_text(f"alice admin {TOKEN}\nbob read short-secret\n")
    path.chmod(0o644)
    with structlog.testing.capture_logs() as logged:
        assert not await credentials_file.reload()
    assert (credentials_file.reloads, credentials_file.failures) == (0, 1)
    assert authenticator.authenticate(f"Bearer {TOKEN}", None, None).name == "alice"
    assert [(entry["log_level"], entry["event"]) for entry in logged] == [
        ("warning", "the credentials file (auth_tokens) is readable by other users: make it readable by the SC's user only (chmod 600)"),
        ("error", "credentials file (auth_tokens) not reloaded: the public port keeps the previous credentials"),
    ]
    assert logged[1]["error"] == (
        f"{str(path)!r} line 2: the token (field 3) has 12 characters, fewer than 16; "
        "make one with `python -c 'import secrets; print(secrets.token_urlsafe(32))'`"
    )
    assert "short-secret" not in repr(logged)
    os.remove(path)  # a file gone is a change that does not load either
    assert not await credentials_file.reload_if_changed() and credentials_file.failures == 2


async def test_the_watcher_parses_a_changed_file_off_the_event_loop_and_puts_the_credentials_in_place_on_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A large credentials file or a slow disk must not hold the event loop (every request, SPU
    heartbeat and controller pass waits for it): the file is read and parsed in a thread, and only
    the new credentials are put in place on the loop, where what holds a principal is told."""
    path = tmp_path / "tokens"
    path.write_text(f"alice admin {TOKEN}\n")
    path.chmod(0o600)
    authenticator = auth.Authenticator(auth.load(path), client_certificates=False)
    credentials_file = credentials.CredentialsFile(path, authenticator)
    parsed_on_the_loop: list[bool] = []
    told_on_the_loop: list[bool] = []
    told = asyncio.Event()
    parse = auth.parse

    def recording_parse(text: str, where: str) -> auth.Credentials:
        parsed_on_the_loop.append(on_the_loop())
        return parse(text, where)

    def replaced() -> None:
        told_on_the_loop.append(on_the_loop())
        told.set()

    monkeypatch.setattr(auth, "parse", recording_parse)
    authenticator.listen(replaced)
    watching = asyncio.create_task(tls.watch([credentials_file], interval=0.01))
    try:
        new = tmp_path / "tokens.new"
        new.write_text(f"bob read {TOKEN}-bob\n")
        new.chmod(0o600)
        new.replace(path)
        async with asyncio.timeout(30):  # a bound so that a defect fails the test, not a measure of speed
            await told.wait()
    finally:
        await supervisor.cancel_and_wait(watching)
    assert (parsed_on_the_loop, told_on_the_loop) == ([False], [True])
    assert authenticator.authenticate(f"Bearer {TOKEN}-bob", None, None).name == "bob"
    assert (credentials_file.reloads, credentials_file.failures) == (1, 0)


class FirstReadHeld(credentials.CredentialsFile):
    """A credentials file whose first read, once it has read the file, waits until ``release`` is
    set (a slow disk); ``overlapped`` says whether another read began while one was going on."""

    def __init__(self, path: Path, authenticator: auth.Authenticator) -> None:
        super().__init__(path, authenticator)
        self.holding = threading.Event()
        self.release = threading.Event()
        self.overlapped = False
        self._reads = 0
        self._reading = 0
        self._count = threading.Lock()

    def read(self) -> auth.Credentials:
        with self._count:
            self._reads += 1
            first = self._reads == 1
            self.overlapped = self.overlapped or self._reading > 0
            self._reading += 1
        try:
            built = super().read()
            if first:
                self.holding.set()
                self.release.wait(30)
            return built
        finally:
            with self._count:
                self._reading -= 1


async def test_a_sighup_s_reload_and_the_watcher_s_take_turns_so_the_newer_file_stays_in_place(tmp_path: Path) -> None:
    """A SIGHUP's reload still reading (a slow disk) when the watcher sees the file changed again:
    the watcher's waits for it, so the older read is not put in place over the newer one."""
    path = tmp_path / "tokens"
    path.write_text(f"alice admin {TOKEN}\n")
    path.chmod(0o600)
    authenticator = auth.Authenticator(auth.load(path), client_certificates=False)
    credentials_file = FirstReadHeld(path, authenticator)
    signalled = asyncio.create_task(credentials_file.reload())
    watched: asyncio.Task[bool] | None = None
    try:
        assert await asyncio.to_thread(credentials_file.holding.wait, 30)  # it has read alice's file
        new = tmp_path / "tokens.new"
        new.write_text(f"bob admin {TOKEN}-bob\n")
        new.chmod(0o600)
        new.replace(path)
        watched = asyncio.create_task(credentials_file.reload_if_changed())
        # Whatever the watcher's reload can do before the first read ends, it has done: its look at
        # the file and its read were handed to the worker threads before this no-op.
        for _ in range(3):
            await asyncio.sleep(0)
        await asyncio.to_thread(lambda: None)
    finally:
        credentials_file.release.set()
    assert watched is not None
    async with asyncio.timeout(30):  # a bound so that a defect fails the test, not a measure of speed
        assert await asyncio.gather(signalled, watched) == [True, True]
    assert not credentials_file.overlapped
    assert authenticator.authenticate(f"Bearer {TOKEN}-bob", None, None).name == "bob"
    assert (credentials_file.reloads, credentials_file.failures) == (2, 0)
