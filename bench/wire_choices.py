"""The event loop and JSON choices for the private port (issue 17): what the SC would gain from
uvloop instead of asyncio's loop, and from orjson or the standard json module instead of
pydantic's own JSON parser, on the frames SPUs send and the frames the SC sends.

  1. parsing: an Offsets frame of 2,000 entries (an SPU leading 2,000 partitions, every one
     changed) and a Hosted frame of 6,000 entries, validated into the wire messages:
     pydantic's validate_json (parse and validate in one pass, in Rust), orjson.loads then
     validate_python, json.loads then validate_python;
  2. encoding: a Sync of 6,000 replicas: pydantic's model_dump_json, orjson.dumps of model_dump;
  3. the loop: 50,000 small frames (heartbeat-sized) and 2,000 large ones (the Offsets frame)
     from an aiohttp WebSocket client to an aiohttp server in one process, each taken in by the
     server (parsed), on asyncio's default loop and on uvloop.

orjson and uvloop are optional here (measured only when installed): the SC itself uses neither
unless this says they pay (see README, "Dependencies and why").

    .venv/bin/python bench/wire_choices.py [--repeat 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import aiohttp  # noqa: E402
from aiohttp import web  # noqa: E402

from connection_manager import wire  # noqa: E402

try:
    import orjson
except ImportError:  # measured only when installed
    orjson = None
try:
    import uvloop
except ImportError:
    uvloop = None


def offsets_frame(entries: int) -> bytes:
    parts = [
        f'{{"partition":"topic-{i // 10}-{i % 10}","leaderEpoch":3,"hw":{1000 + i},"leo":{1010 + i},'
        f'"followers":[{{"spu":1,"hw":{1000 + i},"leo":{1005 + i}}},{{"spu":2,"hw":{1000 + i},"leo":{1010 + i}}}]}}'
        for i in range(entries)
    ]
    return ('{"v":2,"type":"offsets","partitions":[' + ",".join(parts) + "]}").encode()


def hosted_frame(entries: int) -> bytes:
    parts = [f'{{"partition":"topic-{i // 10}-{i % 10}","leo":{5000 + i},"leaderEpoch":{i % 7}}}' for i in range(entries)]
    return ('{"v":2,"type":"hosted","partitions":[' + ",".join(parts) + "]}").encode()


def sync_message(entries: int) -> wire.Sync:
    endpoint = wire.Endpoint(host="10.0.0.1", port=9005)
    spus = [wire.SpuInfo(id=i, name=f"spu-{i}", rack=f"r{i % 5}", public_endpoint=endpoint, private_endpoint=endpoint) for i in range(50)]
    replicas = [
        wire.ReplicaInfo(
            partition=f"topic-{i // 10}-{i % 10}", leader=i % 50, leader_epoch=i % 9, partition_epoch=i % 11,
            isr=[i % 50, (i + 1) % 50, (i + 2) % 50], replicas=[i % 50, (i + 1) % 50, (i + 2) % 50],
        )
        for i in range(entries)
    ]
    return wire.Sync(epoch=123456, spus=spus, replicas=replicas)


def best_of(repeat: int, work: Callable[[], Any]) -> float:
    """The fastest of ``repeat`` runs, in milliseconds (the machine is shared: the minimum is the cost)."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return min(times) * 1000


ADAPTER = wire._SPU_MESSAGES


def parsing(repeat: int) -> list[tuple[str, float]]:
    rows = []
    for label, frame in (("Offsets, 2,000 entries", offsets_frame(2000)), ("Hosted, 6,000 entries", hosted_frame(6000))):
        expected = wire.parse_spu_message(frame)
        assert ADAPTER.validate_python(json.loads(frame)) == expected
        rows.append((f"parse {label}: pydantic validate_json (ms)", best_of(repeat, lambda: wire.parse_spu_message(frame))))
        if orjson is not None:
            assert ADAPTER.validate_python(orjson.loads(frame)) == expected
            rows.append((f"parse {label}: orjson.loads + validate_python (ms)", best_of(repeat, lambda: ADAPTER.validate_python(orjson.loads(frame)))))
        rows.append((f"parse {label}: json.loads + validate_python (ms)", best_of(repeat, lambda: ADAPTER.validate_python(json.loads(frame)))))
    return rows


def encoding(repeat: int) -> list[tuple[str, float]]:
    sync = sync_message(6000)
    rows = [("encode Sync, 6,000 replicas: pydantic model_dump_json (ms)", best_of(repeat, lambda: wire.encode(sync)))]
    if orjson is not None:
        assert json.loads(orjson.dumps(sync.model_dump(by_alias=True))) == json.loads(wire.encode(sync))
        rows.append(("encode Sync, 6,000 replicas: orjson.dumps(model_dump) (ms)", best_of(repeat, lambda: orjson.dumps(sync.model_dump(by_alias=True)))))
    return rows


async def websocket_round(small: int, large: int) -> float:
    """Seconds for ``small`` heartbeats and ``large`` Offsets frames through a WebSocket, each parsed."""
    heartbeat, offsets = wire.encode(wire.Heartbeat()), offsets_frame(2000)
    taken = 0
    done = asyncio.Event()

    async def handle(request: web.Request) -> web.WebSocketResponse:
        nonlocal taken
        websocket = web.WebSocketResponse(max_msg_size=wire.MAX_FRAME_BYTES)
        await websocket.prepare(request)
        async for message in websocket:
            wire.parse_spu_message(message.data)
            taken += 1
            if taken == small + large:
                done.set()
        return websocket

    app = web.Application()
    app.router.add_get("/ws", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with aiohttp.ClientSession() as session, session.ws_connect(f"http://127.0.0.1:{port}/ws", max_msg_size=wire.MAX_FRAME_BYTES) as ws:
            started = time.perf_counter()
            for index in range(small + large):
                await ws.send_bytes(offsets if large and index % (small // large + 1) == 0 else heartbeat)
            await done.wait()
            return time.perf_counter() - started
    finally:
        await runner.cleanup()


def loops(rounds: int) -> list[tuple[str, float]]:
    rows = []
    candidates: list[tuple[str, Callable[[Any], Any]]] = [("asyncio", asyncio.run)]
    if uvloop is not None:
        candidates.append(("uvloop", uvloop.run))
    for name, run in candidates:
        small = min(run(websocket_round(50_000, 0)) for _ in range(rounds))
        mixed = min(run(websocket_round(2_000, 2_000)) for _ in range(rounds))
        rows.append((f"loop {name}: 50,000 heartbeats through a WebSocket, parsed (ms)", small * 1000))
        rows.append((f"loop {name}: 2,000 Offsets of 2,000 entries + 2,000 heartbeats (ms)", mixed * 1000))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rows = [*parsing(args.repeat), *encoding(args.repeat), *loops(args.rounds)]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value:>10.1f}")
    print(f"(installed: orjson {'yes' if orjson else 'no'}, uvloop {'yes' if uvloop else 'no'}; python {sys.version.split()[0]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
