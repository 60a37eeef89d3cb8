"""The credentials of both ports read again without a restart: the public port's tokens and
certificate mappings (auth_tokens) and the SPU token, when their file changes and on SIGHUP, as the
TLS files are. A revoked credential is refused from the next request on and loses what it holds open
(HTTP watches, Fluvio connections); a lowered role applies to the next write; a file that does not
load keeps the credentials loaded before. Against a real `sc run` where a signal or the file
watcher is what is tested, in-process where certificates and SPUs are."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import contextlib
import gc
import re
import signal
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from connection_manager import tls
from connection_manager.spu.simulator import SimulatedSpu
from controller import config, daemon as daemon_module
from controller.api import auth, credentials
from controller.api.fluvio import client as fluvio_client, messages, objects as fluvio_objects
from store import embedded_etcd, supervisor
from tests.fixtures import sc_run
from tests.fixtures.certs import Authority
from tests.fixtures.daemon import running
from tests.fixtures.threads import on_the_loop
from tests.functional.test_security import (
    ADMIN_TOKEN, FAST, READER_TOKEN, call, client_tls, eventually, settings_for, tokens_file,
)  # fmt: skip

NEW_READER_TOKEN = "new-reader-token-0123456"
NEW_ADMIN_TOKEN = "new-admin-token-01234567"
# Twice what a reload takes at the longest (the watcher looks every 2 s): a bound so that a defect
# fails the test instead of hanging it, not a measure of speed.
BOUND_SECONDS = 30.0


def rewrite(path: Path, *lines: str) -> None:
    """Replace ``path`` as an editor or a configuration tool does: a new file moved over it."""
    new = path.with_suffix(".new")
    new.write_text("\n".join(lines) + "\n")
    new.chmod(0o600)
    new.replace(path)


def rewrite_in_place_unseen(path: Path, old: str, new: str) -> None:
    """Replace ``old`` by ``new`` (of the same length) in ``path``, keeping its inode, size and
    modification time: nothing the file watcher looks at changes, so only SIGHUP reloads it."""
    assert len(old) == len(new)
    before = path.stat()
    text = path.read_text()
    assert old in text
    with path.open("r+") as file:
        file.write(text.replace(old, new))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (path.stat().st_ino, path.stat().st_size, path.stat().st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)


async def status_of(url: str, method: str, path: str, token: str) -> int:
    async with aiohttp.ClientSession() as session, session.request(
        method, f"{url}{path}", headers={"Authorization": f"Bearer {token}"}
    ) as response:
        await response.read()
        return response.status


async def file_counter(url: str, token: str, counter: str, file: str) -> float:
    """``counter`` (``sc_file_reloads_total``, ``sc_file_reload_failures_total``) for ``file``, as
    /metrics serves it (0 when the series is not there)."""
    async with aiohttp.ClientSession() as session, session.get(
        f"{url}/metrics", headers={"Authorization": f"Bearer {token}"}
    ) as response:
        text = await response.text()
    found = re.search(rf'^{counter}\{{file="{file}"\}} (\S+)$', text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


async def reload_failures(url: str, token: str, file: str) -> float:
    return await file_counter(url, token, "sc_file_reload_failures_total", file)


async def reloads(url: str, token: str, file: str) -> float:
    return await file_counter(url, token, "sc_file_reloads_total", file)


@pytest.fixture
def sc_with_tokens(tmp_path: Path) -> sc_run.ScRun:
    tokens = tokens_file(tmp_path)
    return sc_run.ScRun(tmp_path / "sc", None, "--store", "memory", "--auth-tokens", str(tokens))


async def test_a_rewritten_tokens_file_revokes_ends_watches_lowers_roles_and_a_bad_one_changes_nothing(
    tmp_path: Path, sc_with_tokens: sc_run.ScRun
) -> None:
    sc = sc_with_tokens
    tokens = tmp_path / "tokens"
    sc.start(logs_to_file=True)
    try:
        await sc.wait_healthy()
        assert await status_of(sc.url, "GET", "/v1/topics", READER_TOKEN) == 200
        async with aiohttp.ClientSession() as session:
            revoked_watch = await session.get(f"{sc.url}/v1/watch/topics", headers={"Authorization": f"Bearer {READER_TOKEN}"})
            lowered_watch = await session.get(f"{sc.url}/v1/watch/topics", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
            assert (revoked_watch.status, lowered_watch.status) == (200, 200)

            # The reader's token leaked: it goes, a new one comes; alice keeps reading only.
            rewrite(tokens, f"reader read {NEW_READER_TOKEN}", f"alice read {ADMIN_TOKEN}", f"ops admin {NEW_ADMIN_TOKEN}")

            async def revoked() -> None:
                assert await status_of(sc.url, "GET", "/v1/topics", READER_TOKEN) == 401

            await eventually(revoked, BOUND_SECONDS)
            assert await status_of(sc.url, "GET", "/v1/topics", NEW_READER_TOKEN) == 200
            assert await status_of(sc.url, "DELETE", "/v1/topics/anything", ADMIN_TOKEN) == 403
            # The watch opened with the revoked token ends; alice's (a read, which her role keeps) goes on.
            async with asyncio.timeout(BOUND_SECONDS):
                await revoked_watch.content.read()
            assert revoked_watch.content.at_eof()
            topic = {"name": "after-revocation", "spec": {"partitions": 1, "replicationFactor": 1}}
            async with session.post(
                f"{sc.url}/v1/topics?timeout=0", json=topic, headers={"Authorization": f"Bearer {NEW_ADMIN_TOKEN}"}
            ) as created:
                assert created.status in (201, 202), await created.text()
            async with asyncio.timeout(BOUND_SECONDS):
                while b"after-revocation" not in await lowered_watch.content.readline():
                    pass
            revoked_watch.close()
            lowered_watch.close()

        # A line that does not parse: the previous credentials stay, the error names the line, not the token.
        short = "short-token"
        rewrite(tokens, f"reader read {NEW_READER_TOKEN}", "# a comment", f"intruder admin {short}")

        async def counted() -> None:
            assert await reload_failures(sc.url, NEW_READER_TOKEN, "auth_tokens") == 1

        await eventually(counted, BOUND_SECONDS)
        assert await status_of(sc.url, "GET", "/v1/topics", NEW_READER_TOKEN) == 200
        assert await status_of(sc.url, "DELETE", "/v1/topics/after-revocation", NEW_ADMIN_TOKEN) == 200
        assert await status_of(sc.url, "GET", "/v1/topics", short) == 401
        log = sc.log_path.read_text()
        errors = [json.loads(line) for line in log.splitlines() if line.startswith("{") and '"credentials file' in line]
        assert any("line 3: the token (field 3) has 11 characters" in entry.get("error", "") for entry in errors), errors
        assert short not in log and NEW_READER_TOKEN not in log
        assert sc.process is not None and sc.process.poll() is None
    finally:
        sc.stop()


async def test_sighup_reloads_a_tokens_file_the_watcher_could_not_see_change(
    tmp_path: Path, sc_with_tokens: sc_run.ScRun
) -> None:
    sc = sc_with_tokens
    tokens = tmp_path / "tokens"
    tokens.chmod(0o644)  # the reload warns, as the start does
    sc.start(logs_to_file=True)
    try:
        await sc.wait_healthy()
        assert await status_of(sc.url, "GET", "/v1/topics", READER_TOKEN) == 200
        replacement = "rotated-token-012345678"
        rewrite_in_place_unseen(tokens, READER_TOKEN, replacement)
        assert sc.process is not None
        sc.process.send_signal(signal.SIGHUP)

        async def rotated() -> None:
            assert await status_of(sc.url, "GET", "/v1/topics", READER_TOKEN) == 401
            assert await status_of(sc.url, "GET", "/v1/topics", replacement) == 200

        await eventually(rotated, BOUND_SECONDS)
        warnings = [line for line in sc.log_path.read_text().splitlines() if "credentials file (auth_tokens) is readable" in line]
        assert len(warnings) == 2, warnings  # at start and at the reload
        assert sc.process.poll() is None
    finally:
        sc.stop()


async def test_the_live_page_s_websocket_watch_ends_when_its_token_is_revoked(tmp_path: Path) -> None:
    tokens = tokens_file(tmp_path)
    async with running(settings_for(auth_tokens=tokens)) as sc:
        offered = "bearer." + base64.urlsafe_b64encode(READER_TOKEN.encode()).decode().rstrip("=")
        async with sc.session.ws_connect("/v1/watch/topics", protocols=("sc.v1", offered)) as websocket:
            assert websocket.protocol == "sc.v1"
            rewrite(tokens, f"alice admin {ADMIN_TOKEN}")
            await sc.daemon.reload_files()  # what SIGHUP does
            async with asyncio.timeout(BOUND_SECONDS):
                async for _ in websocket:
                    pass  # until the SC closes it
            assert websocket.closed
        assert (await call(sc, "GET", "/v1/topics", token=READER_TOKEN))[0] == 401


async def test_a_certificate_whose_mapping_is_lowered_then_removed_loses_its_rights_on_both_protocols(
    ca: Authority, tmp_path: Path
) -> None:
    server, ops = ca.server(), ca.issue("ops-user")
    tokens = tokens_file(tmp_path, "ops admin cert:ops-user")
    settings = settings_for(tls_cert=server.cert, tls_key=server.key, tls_client_ca=ca.path, auth_tokens=tokens)
    async with running(settings) as sc:
        context = client_tls(ca, ops)
        fluvio = await fluvio_client.Client.connect("127.0.0.1", sc.daemon.public_port or 0, tls=client_tls(ca, ops))
        try:
            watch = fluvio.watch(fluvio_objects.TOPIC)
            async with asyncio.timeout(BOUND_SECONDS):
                await watch.get()  # the snapshot
            delete = messages.DeleteRequest(fluvio_objects.TOPIC, "ops-topic")
            assert (await fluvio.status(messages.DELETE, delete)).error_code.code != messages.Error.PERMISSION_DENIED

            rewrite(tokens, f"reader read {READER_TOKEN}", "ops read cert:ops-user")
            await sc.daemon.reload_files()  # what SIGHUP does
            # The same connection, its next write: the lowered role.
            refused = await fluvio.status(messages.DELETE, delete)
            assert refused.error_code.code == messages.Error.PERMISSION_DENIED, refused
            assert refused.error_message is not None and "CN=ops-user has role read" in refused.error_message, refused
            assert (await call(sc, "GET", "/v1/topics", context=context))[0] == 200
            assert (await call(sc, "DELETE", "/v1/topics/ops-topic", context=context))[0] == 403

            rewrite(tokens, f"reader read {READER_TOKEN}")
            await sc.daemon.reload_files()
            # Its watch has no error field: the connection is closed.
            async with asyncio.timeout(BOUND_SECONDS):
                await fluvio.closed.wait()
            assert (await call(sc, "GET", "/v1/topics", context=context))[0] == 401
        finally:
            await fluvio.close()


async def test_a_new_spu_token_applies_to_new_registrations_and_keeps_the_spus_connected(tmp_path: Path) -> None:
    token_file = tmp_path / "spu-token"
    token_file.write_text("old-spu-token-0123456789\n")
    token_file.chmod(0o600)
    settings = settings_for(auth_tokens=tokens_file(tmp_path), spu_token_file=token_file)
    async with running(settings) as sc:
        ports = embedded_etcd.free_ports(6)
        for spu_id in (1, 2, 3):
            spec = {"id": spu_id, "publicEndpoint": {"host": "127.0.0.1", "port": ports[2 * spu_id - 2]},
                    "privateEndpoint": {"host": "127.0.0.1", "port": ports[2 * spu_id - 1]}}  # fmt: skip
            assert (await call(sc, "POST", "/v1/spus", token=ADMIN_TOKEN, body={"name": f"spu-{spu_id}", "spec": spec}))[0] == 201
        address = ("127.0.0.1", sc.daemon.private_port or 0)
        connected = SimulatedSpu(1, address, "old-spu-token-0123456789", settings=FAST)
        late = SimulatedSpu(2, address, "old-spu-token-0123456789", settings=FAST)
        rotated = SimulatedSpu(3, address, "new-spu-token-0123456789", settings=FAST)
        spus = [connected]
        try:
            await connected.start()

            async def first_connected() -> None:
                assert connected.connected

            await eventually(first_connected)
            sessions = sc.daemon.connections
            assert sessions is not None
            session = sessions.sessions[1]

            # An empty file is no token: the old one stays.
            rewrite(token_file, "")
            await sc.daemon.reload_files()
            rewrite(token_file, "new-spu-token-0123456789")
            await sc.daemon.reload_files()
            spus += [late, rotated]
            await late.start()
            await rotated.start()

            async def new_token_only_for_new_registrations() -> None:
                rejection = late.session.last_rejection
                assert rejection is not None and rejection.code == "unauthorized", rejection
                assert rotated.connected

            await eventually(new_token_only_for_new_registrations)
            # The SPU connected under the old token keeps its connection.
            assert connected.connected and sessions.sessions.get(1) is session and session.closing is None
            assert sc.daemon.reloadables is not None
            assert {item.name: item.failures for item in sc.daemon.reloadables} == {"auth_tokens": 0, "spu_token": 1}
        finally:
            for spu in spus:
                await spu.stop()


OLD_SPU_TOKEN = "old-spu-token-0123456789"
NEW_SPU_TOKEN = "new-spu-token-0123456789"


async def test_an_spu_token_rotation_listing_the_new_token_with_the_old_takes_no_spu_offline(tmp_path: Path) -> None:
    """A shared secret's rotation: list the new token with the old, move the SPUs over one at a
    time, then remove the old. Meanwhile an SPU not moved yet that reconnects with the old token
    is taken, and an SPU that keeps its connection keeps it. Against a real `sc run`, whose file
    watcher reads the file as it is rewritten."""
    token_file = tmp_path / "spu-token"
    token_file.write_text(f"{OLD_SPU_TOKEN}\n")
    token_file.chmod(0o600)
    sc = sc_run.ScRun(
        tmp_path / "sc", None, "--store", "memory",
        "--auth-tokens", str(tokens_file(tmp_path)), "--spu-token-file", str(token_file),
    )  # fmt: skip
    sc.start(logs_to_file=True)
    address = ("127.0.0.1", sc.private_port)
    spus: list[SimulatedSpu] = []

    def spu(spu_id: int, token: str) -> SimulatedSpu:
        spus.append(SimulatedSpu(spu_id, address, token, settings=FAST))
        return spus[-1]

    async def rotate(*lines: str) -> None:
        before = await reloads(sc.url, ADMIN_TOKEN, "spu_token")
        rewrite(token_file, *lines)

        async def reloaded() -> None:
            assert await reloads(sc.url, ADMIN_TOKEN, "spu_token") > before

        await eventually(reloaded, BOUND_SECONDS)

    async def all_connected(*group: SimulatedSpu) -> None:
        async def connected() -> None:
            assert all(each.connected for each in group), [(each.spu_id, each.session.last_rejection) for each in group]

        await eventually(connected, BOUND_SECONDS)

    try:
        await sc.wait_healthy()
        ports = embedded_etcd.free_ports(8)
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as http:
            for spu_id in (1, 2, 3, 4):
                spec = {"id": spu_id, "publicEndpoint": {"host": "127.0.0.1", "port": ports[2 * spu_id - 2]},
                        "privateEndpoint": {"host": "127.0.0.1", "port": ports[2 * spu_id - 1]}}  # fmt: skip
                async with http.post(f"{sc.url}/v1/spus", json={"name": f"spu-{spu_id}", "spec": spec}) as answer:
                    assert answer.status == 201, await answer.text()
        moved, reconnecting, untouched = spu(1, OLD_SPU_TOKEN), spu(2, OLD_SPU_TOKEN), spu(3, OLD_SPU_TOKEN)
        for each in (moved, reconnecting, untouched):
            await each.start()
        await all_connected(moved, reconnecting, untouched)

        # The new token first, the old one still listed: no SPU is refused while it moves over.
        await rotate(NEW_SPU_TOKEN, OLD_SPU_TOKEN)
        await moved.stop()
        moved = spu(1, NEW_SPU_TOKEN)
        await moved.start()
        await reconnecting.stop()
        reconnecting = spu(2, OLD_SPU_TOKEN)  # not moved yet: its connection broke, it comes back
        await reconnecting.start()
        await all_connected(moved, reconnecting, untouched)
        await reconnecting.stop()
        reconnecting = spu(2, NEW_SPU_TOKEN)  # moved over in its turn
        await reconnecting.start()
        await all_connected(moved, reconnecting, untouched)

        # Every SPU has the new token: the old one goes, and is refused from then on.
        await rotate(NEW_SPU_TOKEN)
        stale = spu(4, OLD_SPU_TOKEN)
        await stale.start()

        async def refused() -> None:
            rejection = stale.session.last_rejection
            assert rejection is not None and rejection.code == "unauthorized", rejection

        await eventually(refused, BOUND_SECONDS)
        assert not stale.connected
        # The SPU left alone kept its one connection throughout; the others came back once each.
        assert [(each.connected, each.session.connections) for each in (untouched, moved, reconnecting)] == [(True, 1)] * 3
        assert await reload_failures(sc.url, ADMIN_TOKEN, "spu_token") == 0
    finally:
        for each in spus:
            await each.stop()
        sc.stop()


@contextlib.asynccontextmanager
async def signalled_sc(ca: Authority, tmp_path: Path) -> AsyncIterator[tuple[daemon_module.Daemon, asyncio.Task[None]]]:
    """An SC with TLS, credentials and an SPU token file run as `sc run` runs it
    (Daemon.run_until_signalled), in this process: a SIGHUP or a SIGTERM sent to this process is
    what it handles. Ready (its /healthz answers 200) when it is given; stopped at the end, and
    what run_until_signalled sets for the whole process (signal handlers, the collector's
    threshold, a frozen heap) given back; the open-file limit it raises stays raised."""
    server = ca.server()
    token_file = tmp_path / "spu-token"
    token_file.write_text("spu-token-0123456789\n")
    token_file.chmod(0o600)
    settings = settings_for(tls_cert=server.cert, tls_key=server.key, auth_tokens=tokens_file(tmp_path), spu_token_file=token_file)
    daemon = daemon_module.Daemon(settings)
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    threshold = gc.get_threshold()
    running_sc = asyncio.create_task(daemon.run_until_signalled())
    try:

        async def ready() -> None:
            assert daemon.public_port is not None and not running_sc.done()
            async with aiohttp.ClientSession() as session, session.get(
                f"https://127.0.0.1:{daemon.public_port}/healthz", ssl=client_tls(ca)
            ) as response:
                assert response.status == 200

        await eventually(ready, BOUND_SECONDS)
        yield daemon, running_sc
    finally:
        await supervisor.cancel_and_wait(running_sc)
        gc.unfreeze()
        gc.set_threshold(*threshold)
        loop = asyncio.get_running_loop()
        for signum, handler in handlers.items():
            loop.remove_signal_handler(signum)
            signal.signal(signum, handler)


async def test_sighup_reads_every_file_off_the_event_loop_and_puts_what_it_built_in_place_on_it(
    ca: Authority, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGHUP through the handler `sc run` installs: the TLS files, the credentials and the SPU
    token are read, parsed and built in a thread (a large file or a slow disk holds no request,
    heartbeat or controller pass), and the new credentials put in place on the loop, where what
    holds a principal is told."""
    async with signalled_sc(ca, tmp_path) as (daemon, running_sc):
        built_on_the_loop: dict[str, list[bool]] = {"tls": [], "auth_tokens": [], "spu_token": []}
        told_on_the_loop: list[bool] = []

        def recording(name: str, build: Callable[..., Any]) -> Callable[..., Any]:
            def recorded(*args: Any, **kwargs: Any) -> Any:
                built_on_the_loop[name].append(on_the_loop())
                return build(*args, **kwargs)

            return recorded

        monkeypatch.setattr(tls, "server_context", recording("tls", tls.server_context))
        monkeypatch.setattr(auth, "parse", recording("auth_tokens", auth.parse))
        monkeypatch.setattr(config, "read_tokens", recording("spu_token", config.read_tokens))
        assert daemon.context is not None
        daemon.context.authenticator.listen(lambda: told_on_the_loop.append(on_the_loop()))

        os.kill(os.getpid(), signal.SIGHUP)  # no file changed: the watcher reads none of them

        async def reloaded() -> None:
            counts = {reloadable.name: (reloadable.reloads, reloadable.failures) for reloadable in daemon.reloadables}
            assert counts == {"tls": (1, 0), "auth_tokens": (1, 0), "spu_token": (1, 0)}

        await eventually(reloaded, BOUND_SECONDS)
        # Two contexts (the public port's, the private port's), a parse, a read: none on the loop.
        assert built_on_the_loop == {"tls": [False, False], "auth_tokens": [False], "spu_token": [False]}
        assert told_on_the_loop == [True]
        os.kill(os.getpid(), signal.SIGTERM)
        async with asyncio.timeout(BOUND_SECONDS):
            await running_sc


class HeldCredentialsFile(credentials.CredentialsFile):
    """A credentials file whose read, once it has read the file, waits until ``release`` is set:
    a large file or a slow disk, for as long as a test needs."""

    def __init__(self, path: Path, authenticator: auth.Authenticator) -> None:
        super().__init__(path, authenticator)
        self.reading = threading.Event()
        self.release = threading.Event()
        self.done = threading.Event()

    def read(self) -> auth.Credentials:
        try:
            built = super().read()
            self.reading.set()
            self.release.wait(BOUND_SECONDS)
            return built
        finally:
            self.done.set()


async def test_an_sc_stops_cleanly_while_a_sighup_s_reload_is_still_reading_and_puts_nothing_in_place(
    ca: Authority, tmp_path: Path
) -> None:
    """SIGTERM while a reload started by SIGHUP reads in its thread: the SC stops as it always does
    (the reload is cancelled; its thread ends on its own), and what the thread read is put nowhere."""
    async with signalled_sc(ca, tmp_path) as (daemon, running_sc):
        path = tmp_path / "held-tokens"
        path.write_text(f"alice admin {ADMIN_TOKEN}\n")
        path.chmod(0o600)
        authenticator = auth.Authenticator(auth.load(path), client_certificates=False)
        held = HeldCredentialsFile(path, authenticator)
        daemon.reloadables.append(held)
        path.write_text(f"bob admin {NEW_ADMIN_TOKEN}\n")

        os.kill(os.getpid(), signal.SIGHUP)
        try:
            assert await asyncio.to_thread(held.reading.wait, BOUND_SECONDS)
            os.kill(os.getpid(), signal.SIGTERM)
            async with asyncio.timeout(BOUND_SECONDS):
                await running_sc  # raises if the stop did
            assert not held.done.is_set()  # the SC stopped while the thread still read
        finally:
            held.release.set()
        assert await asyncio.to_thread(held.done.wait, BOUND_SECONDS)
        assert (held.reloads, held.failures) == (0, 0)
        assert authenticator.authenticate(f"Bearer {ADMIN_TOKEN}", None, None).name == "alice"


@pytest.fixture
def ca(tmp_path: Path) -> Authority:
    return Authority(tmp_path / "ca")
