"""TLS on both ports, SPU identity under mutual TLS, credentials and roles on the public port, the
loopback default without credentials, and who made each change: against a real daemon on 127.0.0.1
with certificates made by the test (tests/fixtures/certs.py)."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import socket
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from connection_manager import health as health_module, tls
from connection_manager.spu import settings as spu_settings
from connection_manager.spu.simulator import SimulatedSpu
from controller import config
from controller.cli import main as cli
from store import embedded_etcd, history, models
from tests.fixtures.certs import Authority, Pair, serial_of
from tests.fixtures.daemon import COMMON_SETTINGS, Running, running
from tests.functional.test_connection_manager import _non_loopback_address

READER_TOKEN = "reader-token-0123456789"
ADMIN_TOKEN = "admin-token-0123456789ab"
ORDERS_TOKEN = "orders-token-0123456789"
FAST = spu_settings.SpuSettings(tick_interval=0.05, reconnect_initial=0.02, reconnect_max=0.1, append_interval=0.05)


@pytest.fixture
def ca(tmp_path: Path) -> Authority:
    return Authority(tmp_path / "ca")


def tokens_file(directory: Path, *extra: str) -> Path:
    path = directory / "tokens"
    lines = [
        "# name role token",
        f"reader read {READER_TOKEN}",
        f"alice admin {ADMIN_TOKEN}",
        f"orders admin:orders- {ORDERS_TOKEN}",
        *extra,
    ]
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o600)
    return path


def settings_for(**overrides: Any) -> config.Settings:
    return config.Settings(store=config.StoreKind.MEMORY, record_history=False, **{**COMMON_SETTINGS, **overrides})


def client_tls(ca: Authority, pair: Pair | None = None, max_tls12: bool = False) -> ssl.SSLContext:
    context = tls.client_context(ca.path, pair.cert if pair else None, pair.key if pair else None)
    if max_tls12:
        # Under TLS 1.2 a refused client certificate fails the handshake itself (1.3 reports it later).
        context.maximum_version = ssl.TLSVersion.TLSv1_2
    return context


async def call(
    sc: Running, method: str, path: str, *, token: str | None = None, context: ssl.SSLContext | bool = False, body: Any = None
) -> tuple[int, Any, Any]:
    scheme = "https" if context is not False else "http"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as session, session.request(
        method, f"{scheme}://127.0.0.1:{sc.daemon.public_port}{path}", json=body, headers=headers, ssl=context
    ) as response:
        text = await response.text()
        return response.status, json.loads(text) if text.startswith(("{", "[")) else text, response.headers


async def server_serial(port: int, context: ssl.SSLContext) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            await writer.wait_closed()
    from cryptography import x509

    return x509.load_der_x509_certificate(der).serial_number


async def eventually(check: Callable[[], Any], timeout: float = 15.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            await check()
            return
        except AssertionError:
            if loop.time() > deadline:
                raise
        await asyncio.sleep(0.05)


# ---------------------------------------------------------------------------- TLS on the public port


async def test_the_public_port_speaks_tls_to_clients_that_trust_its_ca_only(ca: Authority, tmp_path: Path) -> None:
    server = ca.server()
    other = Authority(tmp_path / "other", "other-ca")
    async with running(settings_for(tls_cert=server.cert, tls_key=server.key)) as sc:
        status, body, _ = await call(sc, "GET", "/healthz", context=client_tls(ca))
        assert (status, body) == (200, {"status": "ok"})
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await call(sc, "GET", "/healthz", context=client_tls(other))
        # Plaintext HTTP to a TLS port is no handshake: the connection is dropped, nothing is served.
        with pytest.raises(aiohttp.ClientError):
            await call(sc, "GET", "/healthz")
        assert sc.daemon.tls is not None
        assert sc.daemon.tls.public.minimum_version == sc.daemon.tls.private.minimum_version == ssl.TLSVersion.TLSv1_2


async def test_a_new_certificate_serves_new_handshakes_after_sighup_and_after_a_file_change(
    ca: Authority, tmp_path: Path
) -> None:
    first = ca.server()
    async with running(settings_for(tls_cert=first.cert, tls_key=first.key)) as sc:
        port = sc.daemon.public_port
        assert port is not None and sc.daemon.tls is not None
        context = client_tls(ca)
        assert await server_serial(port, context) == serial_of(first.cert.read_bytes())

        # A key that does not match its certificate is not taken: the old certificate keeps serving.
        ca.issue("unrelated", file_name="unrelated")
        first.key.write_bytes((tmp_path / "ca" / "unrelated.key").read_bytes())
        await sc.daemon.reload_files()
        assert await server_serial(port, context) == serial_of(first.cert.read_bytes())

        second = ca.server()  # the same files, a new certificate and key
        await sc.daemon.reload_files()  # what SIGHUP does
        assert await server_serial(port, context) == serial_of(second.cert.read_bytes())

        third = ca.server()  # noticed by the file watcher, no signal

        async def serves_third() -> None:
            assert await server_serial(port, context) == serial_of(third.cert.read_bytes())

        await eventually(serves_third)


async def test_a_file_with_a_key_readable_by_others_is_warned_about(ca: Authority, tmp_path: Path) -> None:
    pair = ca.server()
    assert not tls.warn_if_readable_by_others(pair.key, "TLS private key")
    pair.key.chmod(0o644)
    assert tls.warn_if_readable_by_others(pair.key, "TLS private key")


# ---------------------------------------------------------------------------- credentials and roles


async def test_tokens_give_roles_and_requests_without_them_are_refused(tmp_path: Path) -> None:
    async with running(settings_for(auth_tokens=tokens_file(tmp_path))) as sc:
        status, body, headers = await call(sc, "GET", "/v1/topics")
        assert status == 401 and body["error"]["code"] == "Unauthenticated", body
        assert headers["WWW-Authenticate"] == 'Bearer realm="sc"'
        status, body, _ = await call(sc, "GET", "/v1/topics", token="not-a-token-of-the-file")
        assert (status, body["error"]["message"]) == (
            401, "the bearer token is not valid: use a token from the SC's --auth-tokens file"
        )
        # Health needs no credential (load balancers); metrics need read.
        assert (await call(sc, "GET", "/healthz"))[0] == 200
        assert (await call(sc, "GET", "/metrics"))[0] == 401
        assert (await call(sc, "GET", "/metrics", token=READER_TOKEN))[0] == 200

        assert (await call(sc, "GET", "/v1/topics", token=READER_TOKEN))[:2] == (200, [])
        status, body, _ = await call(sc, "DELETE", "/v1/topics/anything", token=READER_TOKEN)
        assert (status, body) == (403, {"error": {"code": "Forbidden", "message": (
            "reader has role read, and this request needs admin on topic 'anything'; ask for an admin credential"
        )}})  # fmt: skip
        spu = {"name": "spu-1", "spec": {"id": 1, "publicEndpoint": {"host": "127.0.0.1", "port": 9005},
                                         "privateEndpoint": {"host": "127.0.0.1", "port": 9006}}}  # fmt: skip
        assert (await call(sc, "POST", "/v1/spus", token=READER_TOKEN, body=spu))[0] == 403
        # A placement dry run is a read.
        placement = {"spus": [{"id": 1}], "partitions": 1, "replicationFactor": 1}
        assert (await call(sc, "POST", "/v1/placement", token=READER_TOKEN, body=placement))[0] == 200
        dry_topic = {"name": "payments", "spec": {"partitions": 1, "replicationFactor": 1}}
        assert (await call(sc, "POST", "/v1/topics?dryRun=true", token=READER_TOKEN, body=dry_topic))[0] != 403

        assert (await call(sc, "POST", "/v1/spus", token=ADMIN_TOKEN, body=spu))[0] == 201
        # admin:orders- changes topics starting with orders- only.
        topic = {"name": "orders-eu", "spec": {"partitions": 1, "replicationFactor": 1}}
        assert (await call(sc, "POST", "/v1/topics?timeout=0", token=ORDERS_TOKEN, body=topic))[0] in (201, 202)
        status, body, _ = await call(sc, "POST", "/v1/topics", token=ORDERS_TOKEN, body=dry_topic)
        assert (status, body["error"]["message"]) == (403, (
            "orders has role admin:orders-: it may change only topics starting with 'orders-', not topic 'payments'; "
            "this request needs admin on topic 'payments'"
        ))  # fmt: skip
        assert (await call(sc, "DELETE", "/v1/spus/spu-1", token=ORDERS_TOKEN))[0] == 403
        assert (await call(sc, "DELETE", "/v1/topics/orders-eu", token=ORDERS_TOKEN))[0] == 200


async def test_a_client_certificate_is_a_credential_on_the_public_port(ca: Authority, tmp_path: Path) -> None:
    server = ca.server()
    ops, stranger = ca.issue("ops-user"), ca.issue("stranger")
    expired = ca.issue("ops-user", expired=True, file_name="ops-expired")
    settings = settings_for(
        tls_cert=server.cert, tls_key=server.key, tls_client_ca=ca.path,
        auth_tokens=tokens_file(tmp_path, "ops admin cert:ops-user"),
    )  # fmt: skip
    async with running(settings) as sc:
        spu = {"name": "spu-1", "spec": {"id": 1, "publicEndpoint": {"host": "127.0.0.1", "port": 9005},
                                         "privateEndpoint": {"host": "127.0.0.1", "port": 9006}}}  # fmt: skip
        assert (await call(sc, "POST", "/v1/spus", context=client_tls(ca, ops), body=spu))[0] == 201
        status, body, _ = await call(sc, "GET", "/v1/spus", context=client_tls(ca, stranger))
        assert (status, body["error"]["message"]) == (401, (
            "client certificate CN='stranger' has no role: map it in the SC's --auth-tokens file "
            "(a line NAME ROLE cert:stranger)"
        ))  # fmt: skip
        # Without a certificate the port still serves TLS; a token then is the credential.
        assert (await call(sc, "GET", "/v1/spus", context=client_tls(ca), token=READER_TOKEN))[0] == 200
        with pytest.raises((aiohttp.ClientError, ssl.SSLError)):
            await call(sc, "GET", "/v1/spus", context=client_tls(ca, expired, max_tls12=True))


# ---------------------------------------------------------------------------- SPU identity on 9004


async def test_an_spu_certificate_registers_only_as_the_spu_it_names(ca: Authority, tmp_path: Path) -> None:
    server = ca.server()
    spu3, by_san = ca.issue("spu-3"), ca.issue("rack-a-host", dns_names=("spu-4",))
    expired = ca.issue("spu-3", expired=True, file_name="spu-3-expired")
    settings = settings_for(
        tls_cert=server.cert, tls_key=server.key, tls_client_ca=ca.path, auth_tokens=tokens_file(tmp_path)
    )
    async with running(settings) as sc:
        ports = embedded_etcd.free_ports(4)
        for spu_id, public, private in ((3, ports[0], ports[1]), (4, ports[2], ports[3])):
            spec = {"id": spu_id, "publicEndpoint": {"host": "127.0.0.1", "port": public},
                    "privateEndpoint": {"host": "127.0.0.1", "port": private}}  # fmt: skip
            body = {"name": f"spu-{spu_id}", "spec": spec}
            assert (await call(sc, "POST", "/v1/spus", context=client_tls(ca), token=ADMIN_TOKEN, body=body))[0] == 201
        address = ("127.0.0.1", sc.daemon.private_port or 0)
        impostor = SimulatedSpu(4, address, settings=FAST, tls=client_tls(ca, spu3))
        honest = SimulatedSpu(3, address, settings=FAST, tls=client_tls(ca, spu3))
        named_by_san = SimulatedSpu(4, address, settings=FAST, tls=client_tls(ca, by_san))
        stale = SimulatedSpu(3, address, settings=FAST, tls=client_tls(ca, expired, max_tls12=True))
        spus = [impostor, honest, stale]
        try:
            for spu in spus:
                await spu.start()

            async def settled() -> None:
                rejection = impostor.session.last_rejection
                assert rejection is not None and rejection.code == "wrong-identity", rejection
                assert rejection.reason == (
                    "the client certificate names spu-3, not spu-4: SPU 4 must present a certificate whose CN "
                    "or a DNS SAN is spu-4"
                )
                assert honest.connected and not impostor.connected and not stale.connected

            await eventually(settled)
            await impostor.stop()
            spus.remove(impostor)
            spus.append(named_by_san)
            await named_by_san.start()

            async def san_accepted() -> None:
                assert named_by_san.connected

            await eventually(san_accepted)
            connections = sc.daemon.connections
            assert connections is not None and connections.stats.rejected.get("wrong-identity", 0) >= 1
            assert stale.session.connections == 0
        finally:
            for spu in spus:
                await spu.stop()


# ---------------------------------------------------------------------------- safe by default


def _bound_hosts(sc: Running) -> set[str]:
    runner = sc.daemon._runner
    assert runner is not None
    return {address[0] for address in runner.addresses if isinstance(address, tuple)}


@pytest.mark.parametrize(
    ("overrides", "hosts"),
    [
        ({}, {"127.0.0.1"}),
        ({"bind_host": "0.0.0.0"}, {"127.0.0.1"}),
        ({"bind_host": "0.0.0.0", "public_bind_without_auth": True}, {"0.0.0.0"}),
        ({"auth_tokens": "tokens"}, {"0.0.0.0"}),
    ],
)
async def test_without_credentials_the_public_port_listens_on_loopback_only(
    tmp_path: Path, overrides: dict[str, Any], hosts: set[str]
) -> None:
    if "auth_tokens" in overrides:
        overrides = {**overrides, "auth_tokens": tokens_file(tmp_path)}
    settings = config.Settings(
        store=config.StoreKind.MEMORY, record_history=False, public_port=0, private_port=0, **overrides
    )
    async with running(settings) as sc:
        assert _bound_hosts(sc) == hosts
        if hosts == {"127.0.0.1"}:
            remote = _non_loopback_address()
            with pytest.raises(ConnectionRefusedError), socket.create_connection((remote, sc.daemon.public_port or 0), 2):
                pass
    held, reason = config.public_bind(settings)
    assert (held == "127.0.0.1") == (hosts == {"127.0.0.1"})
    if hosts == {"127.0.0.1"}:
        assert reason is not None and "auth_tokens (--auth-tokens)" in reason and "public_bind_without_auth" in reason


# ---------------------------------------------------------------------------- who did it


async def test_every_write_of_the_public_port_is_recorded_with_its_principal(tmp_path: Path) -> None:
    settings = config.Settings(
        store=config.StoreKind.MEMORY, history_dir=tmp_path / "history", auth_tokens=tokens_file(tmp_path),
        **COMMON_SETTINGS,
    )  # fmt: skip
    async with running(settings) as sc:
        spu = {"name": "spu-1", "spec": {"id": 1, "publicEndpoint": {"host": "127.0.0.1", "port": 9005},
                                         "privateEndpoint": {"host": "127.0.0.1", "port": 9006}}}  # fmt: skip
        assert (await call(sc, "POST", "/v1/spus", token=ADMIN_TOKEN, body=spu))[0] == 201
        assert (await call(sc, "DELETE", "/v1/spus/spu-1", token=ADMIN_TOKEN))[0] == 200
        recorder = sc.daemon.history
        assert recorder is not None
        await recorder.flush()
    records = list(history.HistoryReader(tmp_path / "history").records())
    requests = [(r["kind"], r["name"], r["by"], r["address"]) for r in records if r["type"] == history.REQUEST]
    assert requests == [("spus", "spu-1", "alice", "127.0.0.1"), ("spus", "spu-1", "alice", "127.0.0.1")]
    changes = {r["revision"] for r in records if r["type"] == history.CHANGE and r["kind"] == "spus" and r["op"] != "update"}
    assert {r["revision"] for r in records if r["type"] == history.REQUEST} <= changes


# ---------------------------------------------------------------------------- the CLI


async def test_the_cli_calls_a_tls_port_with_a_token(ca: Authority, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    server = ca.server()
    settings = settings_for(tls_cert=server.cert, tls_key=server.key, auth_tokens=tokens_file(tmp_path))
    async with running(settings) as sc:
        url = f"https://127.0.0.1:{sc.daemon.public_port}"
        argv = ["spu", "list", "--sc", url, "--ca", str(ca.path), "-o", "json"]
        capsys.readouterr()  # the daemon's start-up log
        assert await asyncio.to_thread(cli.main, [*argv, "--token", READER_TOKEN]) == 0
        assert capsys.readouterr().out.splitlines()[-1] == "[]"
        assert await asyncio.to_thread(cli.main, argv) == 1
        error = json.loads(capsys.readouterr().out)["error"]  # with -o json, errors are JSON on stdout
        assert error["code"] == "Unauthenticated" and "this SC requires a credential" in error["message"]
        assert await asyncio.to_thread(cli.main, ["spu", "list", "--sc", url, "--token", READER_TOKEN]) == 1
        assert "CERTIFICATE_VERIFY_FAILED" in capsys.readouterr().err


# ---------------------------------------------------------------------------- the real fluvio client


@pytest.mark.skipif(importlib.util.find_spec("fluvio") is None, reason="the fluvio client is not installed (dev extra)")
async def test_the_fluvio_client_lists_and_creates_topics_over_mutual_tls(ca: Authority, tmp_path: Path) -> None:
    from tests.functional.test_fluvio_client import run_client

    server = ca.server()
    admin_pair, reader_pair = ca.issue("fluvio-admin"), ca.issue("fluvio-reader")
    settings = settings_for(
        tls_cert=server.cert, tls_key=server.key, tls_client_ca=ca.path,
        auth_tokens=tokens_file(tmp_path, "ops admin cert:fluvio-admin", "viewer read cert:fluvio-reader"),
    )  # fmt: skip
    async with running(settings) as sc:
        spu = {"name": "spu-1", "spec": {"id": 1, "publicEndpoint": {"host": "127.0.0.1", "port": 9005},
                                         "privateEndpoint": {"host": "127.0.0.1", "port": 9006}}}  # fmt: skip
        assert (await call(sc, "POST", "/v1/spus", context=client_tls(ca), token=ADMIN_TOKEN, body=spu))[0] == 201
        assert sc.daemon.pipeline is not None
        sc.daemon.pipeline.health.set(1, health_module.Health.ONLINE, asyncio.get_running_loop().time())

        def script(pair: Pair) -> str:
            return f"""
            config.set_tls_file_paths("localhost", {str(pair.key)!r}, {str(pair.cert)!r}, {str(ca.path)!r})
            admin = fluvio.FluvioAdmin.connect_with_config(config)
            emit("created", error_text(admin.create_topic, "tls-topic"))
            emit("topics", sorted(topic.name() for topic in admin.list_topics([])))
            """

        as_admin = await run_client(sc, script(admin_pair))
        assert as_admin == {"created": None, "topics": ["tls-topic"], "done": True}
        as_reader = await run_client(sc, script(reader_pair).replace('"tls-topic"', '"other-topic"'))
        assert as_reader["topics"] == ["tls-topic"]
        assert as_reader["created"] == (
            "CN=fluvio-reader has role read, and this request needs admin on topic 'other-topic'; ask for an admin credential"
        ), as_reader
        assert await sc.read("topics", "other-topic") is None


async def test_a_read_token_s_dry_run_is_a_dry_run_only_where_the_route_has_one(tmp_path: Path) -> None:
    """?dryRun=true gave the read role any POST: a read token registered SPUs, set racks, drained,
    created and scaled SPU groups and added partitions (those routes have no dry run, and wrote).
    It now counts on the three routes that honour it only."""
    async with running(settings_for(auth_tokens=tokens_file(tmp_path))) as sc:

        def spu(spu_id: int) -> dict[str, Any]:
            ports = {"publicEndpoint": {"host": "127.0.0.1", "port": 9005 + 2 * spu_id}}
            return {"name": f"spu-{spu_id}", "spec": {"id": spu_id, **ports, "privateEndpoint": {"host": "127.0.0.1", "port": 9006 + 2 * spu_id}}}

        assert (await call(sc, "POST", "/v1/spus", token=ADMIN_TOKEN, body=spu(1)))[0] == 201
        group = {"name": "g", "spec": {"replicas": 1, "minId": 100}}
        assert (await call(sc, "POST", "/v1/spu-groups?timeout=0", token=ADMIN_TOKEN, body=group))[0] in (201, 202)
        topic = {"name": "payments", "spec": {"partitions": 1, "replicationFactor": 1}}
        assert (await call(sc, "POST", "/v1/topics?timeout=0", token=ADMIN_TOKEN, body=topic))[0] in (201, 202)
        attempts = [
            ("/v1/spus?dryRun=true", spu(2)),
            ("/v1/spus/spu-1/rack?dryRun=true", {"rack": "evil"}),
            ("/v1/spus/spu-1/drain?dryRun=1&timeout=0&force=true", None),
            ("/v1/spu-groups?dryRun=&timeout=0", {"name": "h", "spec": {"replicas": 1, "minId": 200}}),
            ("/v1/spu-groups/g/scale?dryRun=true", {"replicas": 3}),
            ("/v1/topics/payments/partitions?dryRun=true&timeout=0", {"count": 2}),
        ]
        for path, body in attempts:
            status, answer, _ = await call(sc, "POST", path, token=READER_TOKEN, body=body)
            assert status == 403 and answer["error"]["code"] == "Forbidden", (path, status, answer)
        group_g, topic_now = await sc.read("spu-groups", "g"), await sc.read("topics", "payments")
        spu_1 = await sc.read("spus", "spu-1")
        assert await sc.read("spus", "spu-2") is None and await sc.read("spu-groups", "h") is None
        assert isinstance(spu_1, models.Spu) and spu_1.spec.rack is None and not spu_1.spec.drain
        assert isinstance(group_g, models.SpuGroup) and group_g.spec.replicas == 1
        assert isinstance(topic_now, models.Topic) and topic_now.spec.partitions == 1
        # The dry runs that exist are still the read role's (answered as they can be: no SPU is up).
        dry = {"name": "t2", "spec": {"partitions": 1, "replicationFactor": 1}}
        for path, body in [
            ("/v1/topics?dryRun=true", dry), ("/v1/spus/spu-1/decommission?dryRun=true", None), ("/v1/cluster/rebalance?dryRun=true", None)
        ]:
            status, answer, _ = await call(sc, "POST", path, token=READER_TOKEN, body=body)
            assert status != 403 and status < 500, (path, status, answer)
        spu_1 = await sc.read("spus", "spu-1")
        assert await sc.read("topics", "t2") is None and isinstance(spu_1, models.Spu) and not spu_1.spec.decommission


EVIL = "https://evil.example"


async def _from_another_site(url: str, context: ssl.SSLContext | bool, host: str | None = None) -> tuple[int, bool]:
    """A browser's cross-site POST (text/plain: no preflight) and WebSocket, with the origin of
    another site: the POST's status, and whether the WebSocket was opened."""
    headers = {"Origin": EVIL, "Content-Type": "text/plain;charset=UTF-8", "Sec-Fetch-Site": "cross-site"}
    if host is not None:
        headers["Host"] = host
    body = json.dumps({"name": "planted", "spec": {"partitions": 1, "replicationFactor": 1}})
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/v1/topics?timeout=0", data=body, headers=headers, ssl=context) as response:
            status = response.status
        try:
            async with session.ws_connect(url.replace("http", "ws", 1) + "/v1/watch/topics", headers={"Origin": EVIL}, ssl=context):
                opened = True
        except aiohttp.WSServerHandshakeError:
            opened = False
    return status, opened


async def test_a_page_of_another_site_cannot_use_a_browser_s_client_certificate(ca: Authority, tmp_path: Path) -> None:
    """docs/operations.md suggests importing a client certificate into the browser for the live
    page; the browser then presents it to the SC on any site's requests too. A page of another
    site created topics (a text/plain POST) and read watch streams (a WebSocket)."""
    server, ops = ca.server(), ca.issue("ops-user")
    settings = settings_for(
        tls_cert=server.cert, tls_key=server.key, tls_client_ca=ca.path, auth_tokens=tokens_file(tmp_path, "ops admin cert:ops-user")
    )
    async with running(settings) as sc:
        url = f"https://127.0.0.1:{sc.daemon.public_port}"
        assert await _from_another_site(url, client_tls(ca, ops)) == (403, False)
        assert await sc.read("topics", "planted") is None
        # The SC's own page (its own origin) and clients that send no Origin are served.
        async with aiohttp.ClientSession() as session:
            own = {"Origin": f"https://127.0.0.1:{sc.daemon.public_port}"}
            body = {"name": "mine", "spec": {"partitions": 1, "replicationFactor": 1}}
            async with session.post(f"{url}/v1/topics?timeout=0", json=body, headers=own, ssl=client_tls(ca, ops)) as response:
                assert response.status == 202, await response.text()
            async with session.ws_connect(f"wss://127.0.0.1:{sc.daemon.public_port}/v1/watch/topics", headers=own, ssl=client_tls(ca, ops)):
                pass


async def test_without_credentials_neither_another_site_nor_dns_rebinding_reaches_the_sc() -> None:
    async with running(settings_for()) as sc:
        assert await _from_another_site(sc.url, False) == (403, False)
        # DNS rebinding: the other site's own name resolved to 127.0.0.1; its page is then "same
        # origin" with the SC as far as the browser knows, and names its own host.
        port = sc.daemon.public_port
        rebound = f"attacker.example:{port}"
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{sc.url}/v1/topics", headers={"Host": rebound}) as response:
                answer = await response.json()
                assert response.status == 403 and "not Host 'attacker.example:" in answer["error"]["message"], answer
            async with session.post(
                f"{sc.url}/v1/topics?timeout=0", json={"name": "rebound", "spec": {"partitions": 1, "replicationFactor": 1}},
                headers={"Host": rebound, "Origin": f"http://{rebound}"},
            ) as response:
                assert response.status == 403
            for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}"):
                async with session.get(f"{sc.url}/v1/topics", headers={"Host": host}) as response:
                    assert response.status == 200, host
        assert await sc.read("topics", "planted") is None and await sc.read("topics", "rebound") is None


async def test_an_sc_served_unauthenticated_on_purpose_takes_any_host() -> None:
    """public_bind_without_auth: behind a proxy, requests name the proxy's host; the operator chose."""
    async with running(settings_for(public_bind_without_auth=True)) as sc:
        async with aiohttp.ClientSession() as session, session.get(
            f"{sc.url}/v1/topics", headers={"Host": f"sc.internal:{sc.daemon.public_port}"}
        ) as response:
            assert response.status == 200
