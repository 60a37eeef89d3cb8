"""What the live page (/ui) needs of a real daemon with credentials: its files served without a
credential and with a strict policy, nothing fetched from elsewhere, and the watch streams (the
decisions' too) opened by a browser's WebSocket offering its token as a subprotocol, never in a URL."""

from __future__ import annotations

import asyncio
import base64
import json
import re
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from connection_manager import health as health_module
from controller.api import auth, routes
from tests.fixtures.daemon import Running, running
from tests.functional.test_security import ADMIN_TOKEN, READER_TOKEN, call, settings_for, tokens_file


def offered(token: str) -> list[str]:
    """The subprotocols the page offers: its own, and its token as base64url without padding."""
    return [auth.WEBSOCKET_PROTOCOL, "bearer." + base64.urlsafe_b64encode(token.encode()).decode().rstrip("=")]


class Events:
    """The events of a WebSocket that picked the page's subprotocol: a message holds one or more, one per line."""

    def __init__(self, websocket: aiohttp.ClientWebSocketResponse) -> None:
        self.websocket = websocket
        self.waiting: list[Any] = []
        self.messages = 0

    async def next(self) -> Any:
        while not self.waiting:
            message = await asyncio.wait_for(self.websocket.receive_str(), 5)
            assert message.endswith("\n"), message
            self.messages += 1
            self.waiting = [json.loads(line) for line in message.splitlines()]
        return self.waiting.pop(0)


async def test_the_pages_files_need_no_credential_and_load_nothing_from_elsewhere(tmp_path: Path) -> None:
    async with running(settings_for(auth_tokens=tokens_file(tmp_path))) as sc:
        for path, content_type in (("/ui", "text/html"), ("/ui/app.js", "text/javascript"), ("/ui/app.css", "text/css")):
            status, body, headers = await call(sc, "GET", path)
            assert status == 200, body
            assert headers["Content-Type"] == f"{content_type}; charset=utf-8"
            assert headers["Content-Security-Policy"] == routes.UI_HEADERS["Content-Security-Policy"]
            assert headers["X-Content-Type-Options"] == "nosniff"
            # No CDN, no font or script from another origin: every URL in the files is this SC's.
            assert re.findall(r"https?://|wss?://|[\"'(=]\s*//", body) == [], path
        status, body, _ = await call(sc, "GET", "/ui")
        assert re.findall(r'(?:src|href)="([^"]+)"', body) == ["data:,", "/ui/app.css", "/ui/app.js", "#topics"]
        # What the page shows is behind the credential.
        status, body, _ = await call(sc, "GET", "/v1/spus")
        assert status == 401, body


def test_the_pages_files_are_the_ones_auth_lets_through_and_the_package_ships() -> None:
    assert set(routes.UI_FILES) == auth.UI_PATHS
    assert sorted(path.name for path in routes.UI_DIRECTORY.iterdir()) == sorted(name for name, _ in routes.UI_FILES.values())
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert '"controller.api" = ["ui/*.html", "ui/*.js", "ui/*.css"]' in pyproject


async def test_a_websocket_watch_takes_its_token_as_a_subprotocol_and_refuses_without_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with running(settings_for(auth_tokens=tokens_file(tmp_path))) as sc, aiohttp.ClientSession() as session:
        url = f"ws://127.0.0.1:{sc.daemon.public_port}/v1/watch/spus"
        for protocols in ([auth.WEBSOCKET_PROTOCOL], offered("not-a-token-of-this-sc")):
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await session.ws_connect(url, protocols=protocols)
            assert refused.value.status == 401
        await register_spu(sc, 1)
        async with session.ws_connect(url, protocols=offered(READER_TOKEN)) as websocket:
            # The SC picks the page's subprotocol, never the one carrying the token.
            assert websocket.protocol == auth.WEBSOCKET_PROTOCOL
            events = Events(websocket)
            first = await events.next()
            assert (first["type"], first["object"]["name"]) == ("ADDED", "spu-1")
            assert (await events.next())["type"] == "SYNC"
    captured = capsys.readouterr()
    assert "spu-1" in captured.out  # the SC's log was captured: the token would be in it
    assert READER_TOKEN not in captured.out + captured.err


async def test_a_token_offered_without_the_pages_subprotocol_is_never_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """aiohttp logs the subprotocols a client offers when none is the server's: the token among them
    must not be there to log."""
    async with running(settings_for(auth_tokens=tokens_file(tmp_path))) as sc, aiohttp.ClientSession() as session:
        url = f"ws://127.0.0.1:{sc.daemon.public_port}/v1/watch/spus"
        async with session.ws_connect(url, protocols=offered(READER_TOKEN)[1:]) as websocket:
            assert websocket.protocol is None  # nothing of what it offered was picked: a message per event
            assert (await asyncio.wait_for(websocket.receive_json(), 5))["type"] == "SYNC"
    encoded = offered(READER_TOKEN)[1]
    assert [record.getMessage() for record in caplog.records if encoded in record.getMessage() or READER_TOKEN in record.getMessage()] == []


async def test_the_decisions_stream_tells_what_the_sc_decided_and_why_as_it_happens(tmp_path: Path) -> None:
    async with running(settings_for(auth_tokens=tokens_file(tmp_path))) as sc, aiohttp.ClientSession() as session:
        await register_spu(sc, 1)
        await register_spu(sc, 2)
        url = f"ws://127.0.0.1:{sc.daemon.public_port}/v1/watch/events"
        async with session.ws_connect(url, protocols=offered(READER_TOKEN)) as websocket:
            events = Events(websocket)
            ring = []
            while (event := await events.next())["type"] != "SYNC":
                ring.append(event["object"])
            # The ring came in one message (a batch), then SYNC in its own.
            assert events.messages == 2 and len(ring) >= 2, ring
            online = [decision for decision in ring if decision["name"] == "spu-1" and decision["verb"] == "update-status"]
            assert online and online[-1]["outcome"] == "applied", ring
            status, body, _ = await call(
                sc, "POST", "/v1/topics", token=ADMIN_TOKEN, body={"name": "orders", "spec": {"partitions": 2, "replicationFactor": 1}}
            )
            assert status == 201, body
            told: list[dict[str, Any]] = []
            while not any(decision["verb"] == "provision" for decision in told):
                event = await events.next()
                assert event["type"] == "ADDED"
                told.append(event["object"])
            provision = next(decision for decision in told if decision["verb"] == "provision")
            assert {key: provision[key] for key in ("kind", "name", "cause", "reason", "outcome")} == {
                "kind": "topics", "name": "orders", "cause": "", "reason": "orders: placed 2 partitions x 1 replicas", "outcome": "applied",
            }
            assert provision["revision"] > 0
        # The same stream as JSON lines, with the token in the Authorization header.
        async with session.get(
            f"http://127.0.0.1:{sc.daemon.public_port}/v1/watch/events", headers={"Authorization": f"Bearer {READER_TOKEN}"}
        ) as stream:
            assert stream.status == 200
            lines: list[dict[str, Any]] = []
            while not lines or lines[-1]["type"] != "SYNC":
                lines.append(json.loads(await asyncio.wait_for(stream.content.readline(), 5)))
            assert provision in [line["object"] for line in lines]


async def register_spu(sc: Running, spu_id: int) -> None:
    """Register ``spu-<id>`` with the admin token and mark it healthy (no SPU process)."""
    spec = {"id": spu_id, "publicEndpoint": {"host": "127.0.0.1", "port": 9005}, "privateEndpoint": {"host": "127.0.0.1", "port": 9006}}
    status, body, _ = await call(sc, "POST", "/v1/spus", token=ADMIN_TOKEN, body={"name": f"spu-{spu_id}", "spec": spec})
    assert status == 201, body
    pipeline = sc.daemon.pipeline
    assert pipeline is not None
    pipeline.health.set(spu_id, health_module.Health.ONLINE, asyncio.get_running_loop().time())

    async def online() -> None:
        spu = await sc.read("spus", f"spu-{spu_id}")
        assert spu is not None and spu.status.resolution.value == "Online"

    await sc.eventually(online)
