"""The sc client and a standby SC's redirect: the same request sent again to the leader, method,
body and credentials kept; a bounded number of hops; a clear error when nobody leads."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web

from controller.api import client as client_module


class Servers:
    """HTTP servers on 127.0.0.1, each answering with the handler the test gives it."""

    def __init__(self) -> None:
        self.runners: list[web.AppRunner] = []

    async def start(self, handler: Callable[[web.Request], Any]) -> str:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.runners.append(runner)
        port = runner.addresses[0][1]
        return f"http://127.0.0.1:{port}"


@pytest.fixture
async def servers() -> AsyncIterator[Servers]:
    found = Servers()
    yield found
    for runner in found.runners:
        await runner.cleanup()


async def test_a_write_redirected_by_a_standby_reaches_the_leader_unchanged(servers: Servers) -> None:
    seen: list[tuple[str, str, str | None, bytes]] = []

    async def leader(request: web.Request) -> web.Response:
        seen.append((request.method, str(request.rel_url), request.headers.get("Authorization"), await request.read()))
        return web.json_response({"name": "orders"}, status=201)

    leader_url = await servers.start(leader)

    async def standby(request: web.Request) -> web.Response:
        return web.json_response({"error": {"code": "NotLeader", "message": "a standby"}}, status=307, headers={"Location": f"{leader_url}{request.rel_url}"})

    standby_url = await servers.start(standby)
    client = client_module.Client(standby_url, token="secret")
    status, answer = await asyncio.to_thread(client.call, "POST", "/v1/topics", {"name": "orders"}, {"timeout": "0"})
    assert (status, answer) == (201, {"name": "orders"})
    assert seen == [("POST", "/v1/topics?timeout=0", "Bearer secret", b'{"name": "orders"}')]
    status, _ = await asyncio.to_thread(client.call, "DELETE", "/v1/topics/orders")
    assert seen[-1] == ("DELETE", "/v1/topics/orders", "Bearer secret", b"")


async def test_redirects_that_go_round_end_with_an_error_naming_them(servers: Servers) -> None:
    async def loop(request: web.Request) -> web.Response:
        return web.Response(status=307, headers={"Location": str(request.url)})

    url = await servers.start(loop)
    with pytest.raises(client_module.ClientError) as raised:
        await asyncio.to_thread(client_module.Client(url).call, "POST", "/v1/topics", {})
    assert raised.value.code == "TooManyRedirects"
    assert str(raised.value).startswith("the SC redirected more than 3 times (")
    assert str(raised.value).endswith("): the SCs do not agree on their leader yet; retry in a few seconds")


async def test_a_standby_without_a_leader_is_a_clear_error(servers: Servers) -> None:
    async def no_leader(request: web.Request) -> web.Response:
        message = "this SC is a standby and no live SC leads its store right now"
        return web.json_response({"error": {"code": "NoLeader", "message": message}}, status=503)

    url = await servers.start(no_leader)
    with pytest.raises(client_module.ClientError) as raised:
        await asyncio.to_thread(client_module.Client(url).call, "POST", "/v1/topics", {})
    assert (raised.value.code, str(raised.value)) == ("NoLeader", "this SC is a standby and no live SC leads its store right now")


async def test_a_redirect_elsewhere_than_http_is_refused(servers: Servers) -> None:
    async def elsewhere(request: web.Request) -> web.Response:
        return web.Response(status=307, headers={"Location": "file:///etc/passwd"})

    url = await servers.start(elsewhere)
    with pytest.raises(client_module.ClientError) as raised:
        await asyncio.to_thread(client_module.Client(url).call, "POST", "/v1/topics", {})
    assert raised.value.code == "BadAnswer" and "'file:///etc/passwd', which is not an http(s) address" in str(raised.value)


@pytest.mark.parametrize("location", ["http://sc-b:9003/v1/topics", "//sc-b:9003/v1/topics", "/v1/topics"])
def test_a_redirect_from_https_keeps_tls_or_is_refused(location: str) -> None:
    """The token goes along with the request: a redirect from https to plain http would send it in clear."""
    client = client_module.Client("https://sc-a:9003", token="secret")
    if location.startswith("http:"):
        with pytest.raises(client_module.ClientError) as raised:
            client._redirected("https://sc-a:9003/v1/topics", location, [])
        assert raised.value.code == "BadAnswer"
        assert str(raised.value) == (
            "the SC at https://sc-a:9003/v1/topics redirected to 'http://sc-b:9003/v1/topics', plain http: "
            "the request and its credential are not sent there; call the leader with https yourself"
        )
    else:
        assert client._redirected("https://sc-a:9003/v1/topics", location, []).startswith("https://")
