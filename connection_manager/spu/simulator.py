"""The SPU simulator: ``SimulatedSpu`` joins the SC, hosts its replicas and replicates their offsets
and leader epochs, no payloads. It is the reference SPU of the private protocol (docs/replication.md).

In-process (``start``/``stop``, K on one loop) or by ``sc spu run``. Wires the pure ``SpuState`` to its
I/O: SC session, fetch server on its own private endpoint, fetch loops, append bursts, the leaders'
ticks, the journal and checkpoint, and the record of leaderships and acknowledgements.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import ssl
from collections.abc import Callable, Collection, Coroutine, Sequence
from pathlib import Path
from typing import IO, Any

import structlog

from connection_manager.spu import (
    backoff as backoff_module,
    checkpoint,
    fetch,
    replica as replica_module,
    session as session_module,
    settings as settings_module,
    state as state_module,
)


parse_address = session_module.parse_address


def parse_addresses(text: str) -> list[tuple[str, int]]:
    """``HOST:PORT[,HOST:PORT...]``: the SCs of a store (one leads, the others are standbys)."""
    parts = [part for part in text.split(",") if part.strip()]
    if not parts:
        raise ValueError(f"{text[:40]!r} names no SC: give HOST:PORT, or several separated by commas")
    if len(parts) > MAX_SC_ADDRESSES:
        raise ValueError(f"{len(parts)} SC addresses given, at most {MAX_SC_ADDRESSES}")
    return [parse_address(part) for part in parts]


# More SCs than any store runs (2 or 3, one leading): a longer list is a mistake.
MAX_SC_ADDRESSES = 16


class Recorder:
    """``--record FILE``: one JSON line per leadership taken (``lead``: partition, leader epoch) and
    per acknowledgement (``ack``: a leader's HW reached ``offset``, so every record appended below it
    is acknowledged to its producer; ``lastEpoch``: the leader epoch of the record at ``offset - 1``,
    which identifies it), appended and handed to the operating system before the SPU goes on. A
    chaos test reads every SPU's file: no acknowledged record may be lost, and no epoch of a
    partition may have two leaders."""

    def __init__(self, path: Path, spu_id: int) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.spu_id = spu_id
        self.pid = os.getpid()
        self._file: IO[bytes] = open(path, "ab")

    def write(self, changes: state_module.Changes) -> None:
        lines = [
            {"spu": self.spu_id, "pid": self.pid, "event": "lead", "partition": name, "epoch": epoch}
            for name, epoch in sorted(changes.leaderships.items())
        ]
        lines += [
            {
                "spu": self.spu_id, "pid": self.pid, "event": "ack", "partition": name, "epoch": epoch, "offset": hw,
                "lastEpoch": last,
            }
            for name, (epoch, hw, last) in sorted(changes.acked.items())
        ]
        if lines:
            self._file.write(b"".join(json.dumps(line, separators=(",", ":")).encode() + b"\n" for line in lines))
            self._file.flush()

    def close(self) -> None:
        self._file.close()


class SimulatedSpu:
    """SPU ``spu_id`` connecting to the SC's private port at ``sc_address``: ``HOST:PORT`` or (host,
    port), or several (``HOST:PORT,HOST:PORT`` or a list of pairs): the SCs of a store, one leading.

    ``token``: sent in Register when the SC requires one. ``data_dir``: logs are journaled under it
    (``spu-<id>/``) as they change, folded into ``offsets.json`` every ``settings.checkpoint_interval``
    and on ``stop``, and resumed on ``start``; without it the SPU starts empty. ``listen_host``: bind
    the fetch server there instead of the host of the SPU's registered private endpoint (its port is
    always the registered one), for a container whose registered name is not a local address.
    ``record``: append leaderships and acknowledgements to this file (see ``Recorder``). ``tls``:
    connect to the SC over TLS with this client context (connection_manager/tls.py's client_context).
    """

    def __init__(
        self,
        spu_id: int,
        sc_address: str | tuple[str, int] | Sequence[tuple[str, int]],
        token: str | None = None,
        *,
        settings: settings_module.SpuSettings | None = None,
        data_dir: Path | None = None,
        listen_host: str | None = None,
        tls: ssl.SSLContext | None = None,
        record: Path | None = None,
    ) -> None:
        self.spu_id = spu_id
        if isinstance(sc_address, str):
            self.sc_addresses = parse_addresses(sc_address)
        elif isinstance(sc_address[0], str):
            self.sc_addresses = [sc_address]  # type: ignore[list-item]  # one (host, port) pair
        else:
            self.sc_addresses = list(sc_address)  # type: ignore[arg-type]  # pairs
        self.token = token
        self.settings = settings or settings_module.SpuSettings()
        self.checkpoint_path = None if data_dir is None else checkpoint.path_for(data_dir, spu_id)
        self.listen_host = listen_host
        self.record_path = record
        self.state = state_module.SpuState(spu_id, self.settings.replica_lag_time, self.settings.proposal_retry)
        self.server = fetch.FetchServer(self.state, on_change=self.after_change)
        self.fetchers = fetch.Fetchers(self.state, self.settings, on_change=self.after_change)
        self.session = session_module.ScSession(
            self.state, self.sc_addresses, token, self.settings, on_change=self._picture_changed, on_step=self.after_change, tls=tls
        )
        self._journal: checkpoint.Journal | None = None
        self._recorder: Recorder | None = None
        self._roles: dict[str, tuple[replica_module.Role, int | None]] | None = None  # None: no picture yet
        self._endpoint_changed = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._stopped = False
        self.log = structlog.get_logger(__name__).bind(spu=spu_id)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Resume logs from the data dir, then connect, listen, append, tick and fetch in the background.

        Once: a stopped SPU is not started again; make a new one, as a restarted process would be.
        """
        if self._tasks or self._stopped:
            raise RuntimeError(f"SPU {self.spu_id} was already started: create a new SimulatedSpu to run it again")
        if self.checkpoint_path is not None:
            restored = await asyncio.to_thread(checkpoint.load, self.checkpoint_path)
            self.state.restore(restored)
            self._journal = checkpoint.Journal(self.checkpoint_path)
            # From here the journal alone holds changes: fold what was restored into the snapshot.
            self._journal.compact(restored, sync=True)
            self.log.info("offsets restored", path=str(self.checkpoint_path), partitions=len(restored))
        if self.record_path is not None:
            self._recorder = Recorder(self.record_path, self.spu_id)
        self._spawn(self.session.run(), "session")
        self._spawn(self._listen(), "listen")
        self._spawn(append_bursts(self.state, self.settings, self.after_change), "append")
        self._spawn(self._tick(), "tick")
        if self._journal is not None:
            self._spawn(self._checkpoint(), "checkpoint")
        self.log.info("spu started", sc=",".join(f"{host}:{port}" for host, port in self.sc_addresses))

    async def stop(self) -> None:
        """Stop everything it started, drop its connections, and save its logs last."""
        if self._stopped or not self._tasks:
            return
        self._stopped = True
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.fetchers.close()
        await self.server.close()
        self.after_change()
        if self._journal is not None:
            try:
                self._journal.compact(self.state.logs(), sync=True)
            except OSError as error:
                self.log.error("cannot save offsets", path=str(self.checkpoint_path), error=str(error))
            self._journal.close()
        if self._recorder is not None:
            self._recorder.close()
        self.log.info("spu stopped")

    def after_change(self) -> None:
        """After each step that may have changed the state: journal the logs that moved, record
        leaderships and acknowledgements, and tell the SC what it must hear, in that order (what
        is acknowledged or said is on disk first)."""
        changes = self.state.drain()
        if self._journal is not None and changes.logs:
            try:
                self._journal.write(self.state.logs(changes.logs))
            except OSError as error:
                self.log.error("cannot journal offsets", path=str(self.checkpoint_path), error=str(error))
        if self._recorder is not None:
            self._recorder.write(changes)
        for name, epoch in sorted(changes.stepped_down.items()):
            self.log.info("stopped leading: a newer leader epoch exists", partition=name, leader_epoch=epoch)
        self.session.tell(changes)

    def _spawn(self, work: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(work, name=f"spu-{self.spu_id}-{name}")
        task.add_done_callback(self._crashed)
        self._tasks.append(task)

    def _crashed(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self.log.error("spu task failed", task=task.get_name(), exc_info=task.exception())

    # ------------------------------------------------------------------ observing

    @property
    def connected(self) -> bool:
        """Accepted by the SC and synced on the current connection."""
        return self.session.connected

    @property
    def listening(self) -> tuple[str, int] | None:
        """Where its fetch server listens, once the SC told it its endpoint."""
        return self.server.address

    def status(self, partition: str) -> state_module.ReplicaStatus | None:
        """A snapshot of one replica it hosts (role, LEO, HW, and if it leads: ISR, followers' LEOs); None if not hosted."""
        return self.state.status(partition, asyncio.get_running_loop().time())

    # ------------------------------------------------------------------ background work

    def _picture_changed(self, names: Collection[str] | None = None) -> None:
        """The SC's picture changed: for ``names`` (an Update's partitions), or anywhere (None: a
        Sync). Only those are looked at: twenty SPUs of thousands of replicas in one process
        must not walk every replica at every Update (their loop noticed an SC's death late)."""
        replicas = self.state.replicas
        if self._roles is None or names is None:
            roles = {name: (replica.role, replica.leader) for name, replica in replicas.items()}
            if self._roles is None:
                counts = {role.value: sum(1 for held, _ in roles.values() if held is role) for role in replica_module.Role}
                self.log.info("replicas assigned", **counts)
            else:
                # After the first picture, each change is news (a failover, a new topic): one line each.
                for name, (role, leader) in sorted(roles.items()):
                    if self._roles.get(name) != (role, leader):
                        self.log.info("replica role", partition=name, role=role.value, leader=leader, leo=replicas[name].leo)
                for name in sorted(self._roles.keys() - roles.keys()):
                    self.log.info("replica removed", partition=name)
            self._roles = roles
        else:
            for name in sorted(names):
                replica = replicas.get(name)
                if replica is None:
                    if self._roles.pop(name, None) is not None:
                        self.log.info("replica removed", partition=name)
                    continue
                now = (replica.role, replica.leader)
                if self._roles.get(name) != now:
                    self._roles[name] = now
                    self.log.info("replica role", partition=name, role=now[0].value, leader=now[1], leo=replica.leo)
        self._endpoint_changed.set()
        self.fetchers.reconcile()

    async def _listen(self) -> None:
        """Keep the fetch server on this SPU's private endpoint; retry with backoff if it cannot bind."""
        backoff = backoff_module.Backoff(self.settings.reconnect_initial, self.settings.reconnect_max)
        while True:
            await self._endpoint_changed.wait()
            self._endpoint_changed.clear()
            endpoint = self.state.endpoint_of(self.spu_id)
            if endpoint is None:
                self.log.warning("the SC does not describe this SPU's private endpoint; not listening yet")
                continue
            address = (self.listen_host or endpoint.host, endpoint.port)
            if address == self.server.address:
                continue
            try:
                await self.server.listen(*address)
                backoff.reset()
            except OSError as error:
                delay = backoff.next_delay()
                self.log.error(
                    "cannot listen on the private endpoint", host=address[0], port=address[1], error=str(error), retry_in=round(delay, 3)
                )
                await asyncio.sleep(delay)
                self._endpoint_changed.set()

    async def _checkpoint(self) -> None:
        while True:
            await asyncio.sleep(self.settings.checkpoint_interval)
            assert self._journal is not None
            try:
                self._journal.compact(self.state.logs())
            except OSError as error:
                self.log.error("cannot save offsets", path=str(self.checkpoint_path), error=str(error))


    async def _tick(self) -> None:
        """Leaders look at their in-sync sets as time passes (a follower may have gone quiet)."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.settings.tick_interval)
            self.state.tick(loop.time())
            self.after_change()


async def append_bursts(
    state: state_module.SpuState, settings: settings_module.SpuSettings, after: Callable[[], None] = lambda: None
) -> None:
    """Bursts of ``append_records`` records in every partition ``state`` leads, every ``append_interval`` s,
    forever; ``after`` each (the simulator journals and records what moved)."""
    loop = asyncio.get_running_loop()
    next_at = loop.time() + settings.append_interval
    while True:
        await asyncio.sleep(max(0.0, next_at - loop.time()))
        next_at += settings.append_interval
        if settings.append_records:
            state.append(settings.append_records, loop.time())
            after()


async def run_until_signalled(spus: Sequence[SimulatedSpu]) -> None:
    """Run ``spus`` until SIGTERM or SIGINT, then stop them all (each saves its offsets)."""
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    started: list[SimulatedSpu] = []
    try:
        for spu in spus:
            await spu.start()
            started.append(spu)
        await stopping.wait()
        structlog.get_logger(__name__).info("stopping", spus=[spu.spu_id for spu in started])
    finally:
        await asyncio.gather(*(spu.stop() for spu in started), return_exceptions=True)
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
