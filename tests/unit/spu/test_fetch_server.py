"""The fetch server's listening socket: a stop that cancels its start leaves nothing listening."""

from __future__ import annotations

import asyncio
import socket

from connection_manager.spu.fetch import FetchServer
from connection_manager.spu.state import SpuState
from store import embedded_etcd


def port_is_free(port: int) -> bool:
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        probe.bind(("127.0.0.1", port))
        probe.listen()
        return True
    except OSError:
        return False
    finally:
        probe.close()


async def test_a_listen_cancelled_at_any_step_leaves_no_socket_listening() -> None:
    """The SPU's stop cancels its listening task wherever it is. Cancelled as the server had just
    started (asyncio's create_server yields once more after it opened the socket), the server was
    lost and its socket stayed open until the garbage collector found it (a ResourceWarning that
    failed a test's teardown, 1 full run in 4)."""
    (port,) = embedded_etcd.free_ports(1)
    for steps in range(8):
        server = FetchServer(SpuState(0, lag_time=2.0))
        listening = asyncio.create_task(server.listen("127.0.0.1", port))
        for _ in range(steps):
            await asyncio.sleep(0)
        listening.cancel()
        await asyncio.gather(listening, return_exceptions=True)
        await server.close()  # what the SPU's stop does next
        assert port_is_free(port), f"still listening on {port} after a listen cancelled {steps} steps in"
