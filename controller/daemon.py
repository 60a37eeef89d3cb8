"""`sc run`: the SC daemon. Opens the store (embedded etcd, external etcd or memory), joins the
store's SC candidates, runs the Reader and the public API, runs the controllers and takes SPUs
while it leads the store (a hot standby otherwise), and shuts down in order on SIGTERM/SIGINT.
"""

from __future__ import annotations

import asyncio
import gc
import signal
import socket
from pathlib import Path
from typing import Any

import structlog
from aiohttp import web

from connection_manager import health as health_module
from connection_manager import lrs
from connection_manager import server as cm_server
from connection_manager import tls, transport
from controller import config, context as context_module, metrics, placement_plugins
from controller.api import auth, cluster as cluster_roles, credentials as credentials_file, routes as api
from controller.pipeline import pipeline
from controller.api.fluvio import listener as fluvio_listener, server as fluvio_server
from store import active_sc, attribution, embedded_etcd, etcd, history, kv, local, memory
from store import supervisor as supervisor_module

log = structlog.get_logger(__name__)

# Watch events a memory store keeps (`--store memory`): it compacts the older half past this, as
# etcd's auto-compaction does (the embedded etcd compacts hourly), so a long run's history does
# not grow with every write. The Reader, far behind by this much, lists again.
MEMORY_HISTORY_EVENTS = 200_000

# The cyclic garbage collector's first-generation threshold for a running daemon (Python's
# default is 700). The SC allocates a few objects per watch event and per action, almost none
# of them in cycles; at the default, provisioning 10,000 partitions ran ~350 collections that
# traversed the whole local store, 0.3 s of a 3.5 s run. Freezing what startup built (the
# mirrored store, the imported modules) takes it out of every later full collection.
GC_GEN0_THRESHOLD = 50_000


class Daemon:
    def __init__(self, settings: config.Settings) -> None:
        self.settings = settings
        # Every long-lived task of this SC runs under it (see store/supervisor.py).
        self.supervisor = supervisor_module.Supervisor()
        self.etcd_server: embedded_etcd.EmbeddedEtcd | None = None
        self.context: context_module.Context | None = None
        self.pipeline: pipeline.Pipeline | None = None
        self.public_port: int | None = None
        self.history: history.Recorder | None = None
        self.private_port: int | None = None
        self.connections: cm_server.ConnectionManager | None = None
        self.fluvio: fluvio_server.FluvioServer | None = None
        self.ports: tuple[transport.Port, transport.Port] | None = None  # public, private
        self._runner: web.AppRunner | None = None
        self._etcd_supervision: asyncio.Task[None] | None = None
        self.active: active_sc.ActiveSc | None = None
        self._keeper: asyncio.Task[None] | None = None
        # Follows the claim's role changes: starts and ends this SC's terms as the leader.
        self._role: asyncio.Task[None] | None = None
        self.roles: cluster_roles.RoleFeed | None = None  # who leads, told in the decision feed
        self._term = 0  # the ActiveSc term this SC's controllers run for (0: none, a standby)
        # Both ports' TLS contexts (None: plaintext), reloaded on SIGHUP and when the files change.
        self.tls: tls.Contexts | None = None
        # The secret files read again on SIGHUP and when they change: the TLS files, the
        # credentials, the SPU token (those configured).
        self.reloadables: list[tls.Reloadable[Any]] = []
        self._file_watch: asyncio.Task[None] | None = None
        # The reloads SIGHUP started and that have not ended (stop() cancels them), and whether
        # the SC is stopping (a SIGHUP then starts none).
        self._signalled_reloads: set[asyncio.Task[None]] = set()
        self._stopping = False

    async def start(self) -> None:
        try:
            # The plug-ins first: a configuration that cannot load stops the SC before it touches anything.
            placers = placement_plugins.load(self.settings.placement_plugins, self.settings.placement_entry_points)
            if placers:
                log.info("placement plug-ins loaded", plugins=sorted(placers))
            # Then the certificates and credentials: files that do not load stop the SC before it binds.
            authenticator = self._open_security()
            # The history next: a second SC on the same data dir is refused before it starts anything.
            await self._open_history()
            raw_store = await self._open_store()
            self.active = active_sc.ActiveSc(raw_store, self.settings.active_sc_lease_ttl)
            # Everything but the claim itself writes through the guard: nothing while not active.
            kv_store: kv.KVStore = active_sc.GuardedStore(raw_store, self.active)
            if self.history is not None:
                # The API's writes carry who asked for them into the history.
                kv_store = attribution.AttributedStore(kv_store, self.history)
            loop = asyncio.get_running_loop()
            self.context = context_module.Context(
                settings=self.settings,
                kv_store=kv_store,
                local_store=local.LocalStore(),
                metrics=metrics.Metrics(),
                history=self.history,
                supervisor=self.supervisor,
                active=self.active,
                placers=placers,
                authenticator=authenticator,
            )
            self.context.metrics.watch_local_store(self.context.local_store)
            self.context.metrics.watch_reloads(self.reloadables)
            # Who leads, as the mirror sees it, in the decision feed (the live page's SC panel).
            self.roles = cluster_roles.RoleFeed(self.context)
            self.context.metrics.watch_tasks(self.context.supervisor)
            self.context.metrics.watch_active(self.active)
            if self.history is not None:
                self.context.metrics.watch_history(self.history)
            health = health_module.HealthView(started_at=loop.time())
            public, private = self.ports = _ports(self.settings)
            self.context.metrics.watch_ports(public, private)
            self.connections = cm_server.ConnectionManager(
                self.context.local_store,
                health,
                lrs.LiveReplicas(),
                tokens=config.read_tokens(self.settings.spu_token_file),
                allow_remote_without_token=self.settings.spu_allow_remote_without_token,
                heartbeat_timeout=self.settings.spu_heartbeat_timeout,
                offsets_interval=self.settings.spu_offsets_interval,
                offsets_entries_per_second=self.settings.spu_offsets_entries_per_second,
                max_frame_bytes=self.settings.spu_max_frame_bytes,
                frame_bytes_per_second=self.settings.spu_frame_bytes_per_second,
                supervisor=self.context.supervisor,
                listener=private,
                certificate_identity=self.settings.tls_client_ca is not None,
            )
            self.context.connections = self.connections
            if self.settings.spu_token_file is not None:
                self.reloadables.append(SpuTokenFile(self.settings.spu_token_file, self.connections))
            self.context.metrics.watch_connections(self.connections)
            self.pipeline = pipeline.Pipeline(self.context, health, self.connections)
            # The API answers /healthz with 503 until the pipeline has synced.
            self._runner = web.AppRunner(api.build_app(self.context), access_log=None)
            await self._runner.setup()
            # One port, two protocols: Fluvio's binary admin protocol next to the HTTP API.
            fluvio = self.fluvio = fluvio_server.FluvioServer(self.context)
            # A standby sends Fluvio's writes on to the leader (Fluvio's protocol has no redirect).
            fluvio.admin.forward_to = self._fluvio_leader
            public_host, held_on_loopback = config.public_bind(self.settings)
            contexts = self.tls
            site = fluvio_listener.SniffingSite(
                self._runner, public_host, self.settings.public_port, fluvio, public,
                tls=(lambda: contexts.public) if contexts is not None else None,
            )  # fmt: skip
            await site.start()
            self.public_port = _bound_port(self._runner, self.settings.public_port)
            if held_on_loopback is not None:
                log.warning(held_on_loopback, port=self.public_port)
            log.info("public API listening", host=public_host, port=self.public_port, tls=contexts is not None)
            # The private port is bound before this SC joins (its address is part of its identity);
            # it refuses every SPU while this SC does not lead.
            self.connections.standby_refusal = self._standby_refusal
            private_host = config.private_bind(self.settings)
            await self.connections.start(
                private_host, self.settings.private_port, (lambda: contexts.private) if contexts is not None else None
            )
            self.private_port = self.connections.port
            advertise = self.settings.advertise_host
            await self.active.join(
                _address(_advertised(public_host, advertise), self.public_port), _address(_advertised(private_host, advertise), self.private_port)
            )
            self._keeper = self.supervisor.spawn("active-sc-lease", self.active.run)
            # The mirror first: a leader's controllers start on it, a standby serves reads from it.
            await self.pipeline.start_reader()
            self._role = self.supervisor.spawn("sc-role", self._follow_role)
            if self.reloadables:
                self._file_watch = self.supervisor.spawn("file-reload", lambda: tls.watch(self.reloadables))
            # A single SC leads at once (after a crashed predecessor's claim expired: its TTL at
            # most); ready once it leads, or once another SC is known to be ahead of it, or after
            # that TTL and one more second as a standby (a claim no candidate holds stays until deleted).
            try:
                async with asyncio.timeout(self.active.ttl + 1):
                    await self.active.settled.wait()
            except TimeoutError:
                log.warning("the store's claim outlived the wait for it: this SC runs as a standby until it ends")
                self.active.settled.set()
            while self.active.state is active_sc.State.ACTIVE and self._term != self.active.term:
                await asyncio.sleep(0.005)  # the role task starts the term at its next turn
            log.info(
                "SC ready", public_port=self.public_port, private_port=self.private_port, store=self.settings.store.value,
                role="leader" if self._term else "standby",
            )
        except BaseException:
            await self.stop()
            raise

    async def _follow_role(self) -> None:
        """Start a term when this SC wins the claim, end it when it loses it (the process goes on:
        a standby keeps its mirror and serves reads). Level-triggered on ActiveSc.changed."""
        active = self.active
        assert active is not None
        while True:
            active.changed.clear()
            if self._term and (active.state is not active_sc.State.ACTIVE or active.term != self._term):
                await self._step_down()
            if not self._term and active.state is active_sc.State.ACTIVE:
                await self._lead()
            await active.changed.wait()

    async def _lead(self) -> None:
        active, context = self.active, self.context
        assert active is not None and context is not None and self.pipeline is not None
        takeover = active.takeover
        assert takeover is not None
        # Once the mirror has this SC's own claim: the controllers' first pass sees everything
        # written under the claims before it.
        while context.local_store.meta.revision < takeover.epoch and active.state is active_sc.State.ACTIVE:
            await asyncio.sleep(0.005)
        if active.state is not active_sc.State.ACTIVE:
            return
        self._term = active.term
        self.pipeline.lead(active.term)
        assert self.connections is not None
        self.connections.role_changed()  # the SPUs whose registration it holds are accepted now
        context.metrics.takeovers.labels(takeover.cause).inc()
        previous = takeover.previous
        log.warning(
            "this SC leads its store: controllers started on the mirror, SPUs accepted",
            epoch=takeover.epoch, cause=takeover.cause, term=active.term,
            previous_leader=previous.id if previous is not None else None, previous_epoch=takeover.previous_epoch,
        )  # fmt: skip
        if self.roles is not None and active.identity is not None:
            self.roles.took_over(takeover, active.identity)
        if context.history is not None and active.identity is not None:
            context.history.record_takeover(
                active.identity.id, active.identity.address, takeover.epoch, takeover.cause,
                previous.id if previous is not None else None, takeover.previous_epoch,
            )  # fmt: skip

    async def _step_down(self) -> None:
        active, context = self.active, self.context
        assert active is not None and context is not None and self.pipeline is not None and self.connections is not None
        self._term = 0
        await self.pipeline.step_down()
        self.connections.end_term("this SC is not the leader of its store any more: connect to the new leader")
        self.connections.role_changed()
        cause = active.step_down_cause or "stopped"
        log.error("this SC stepped down to a standby: controllers stopped, SPU connections closed", cause=cause, epoch=active.epoch)
        if context.history is not None and active.identity is not None:
            context.history.record_step_down(active.identity.id, active.epoch, cause)

    def _standby_refusal(self) -> tuple[str, str | None] | None:
        """Why an SPU is refused now (None while this SC leads), and the leader's private
        HOST:PORT when known (the SPU goes there)."""
        if self._term:
            assert self.active is not None
            problem = self.active.problem()
            if problem is None:
                return None
            # Leading as far as it knows, but not sure of it (paused or cut off past its lease):
            # another SC may lead, and the Sync would come from a mirror that lags its writes. Held
            # as by a standby that knows no leader: taken once the claim is renewed, else refused.
            return f"this SC cannot tell whether it still leads its store ({problem}): try again shortly", None
        leader = self._other_leader()
        if leader is None:
            return "this SC is a standby and no other SC leads the store right now: try again shortly", None
        where = f"its private port is {leader.private}" if leader.private else f"its public address is {leader.address}"
        return f"this SC is a standby: the leader is SC {leader.id} ({where}); connect there", leader.private or None

    def _fluvio_leader(self) -> str | None:
        """Where this SC's Fluvio writes go (fluvio.admin.Admin.forward_to): None while it holds the
        claim (it applies them), else the leader's public HOST:PORT ("" when no other SC leads)."""
        assert self.active is not None
        if self.active.state is active_sc.State.ACTIVE:
            return None
        leader = self._other_leader()
        return leader.address if leader is not None else ""

    def _other_leader(self) -> active_sc.Identity | None:
        """The leader in this SC's mirror, unless none is, or it is this SC or an earlier process
        at its address (sending a client there would come back here)."""
        assert self.context is not None and self.active is not None
        claim = self.context.local_store.meta.values.get(active_sc.KEY)
        leader = active_sc.Identity.decode(claim[0]) if claim is not None else None
        identity = self.active.identity
        if leader is None or (identity is not None and (leader.host, leader.address) == (identity.host, identity.address)):
            return None
        return leader

    def _open_security(self) -> auth.Authenticator:
        """The TLS contexts and the public port's credentials, from their files (warning when a
        secret file is readable by other users)."""
        settings = self.settings
        tls.warn_if_readable_by_others(settings.tls_key, "TLS private key")
        tls.warn_if_readable_by_others(settings.auth_tokens, "credentials file (auth_tokens)")
        tls.warn_if_readable_by_others(settings.spu_token_file, "SPU token file")
        if settings.tls_cert is not None and settings.tls_key is not None:
            self.tls = tls.Contexts(tls.Files(settings.tls_cert, settings.tls_key, settings.tls_client_ca))
            self.reloadables.append(self.tls)
        credentials = auth.load(settings.auth_tokens) if settings.auth_tokens is not None else None
        authenticator = auth.Authenticator(credentials, client_certificates=settings.tls_client_ca is not None)
        if credentials is not None and settings.auth_tokens is not None:
            log.info("public port credentials loaded", tokens=len(credentials.tokens), certificates=len(credentials.certificates))
            self.reloadables.append(credentials_file.CredentialsFile(settings.auth_tokens, authenticator))
        return authenticator

    async def _open_store(self) -> kv.KVStore:
        settings = self.settings
        if settings.store is config.StoreKind.MEMORY:
            log.warning("using the in-memory store: nothing survives a restart")
            return memory.MemoryStore(settings.key_prefix, settings.etcd_max_request_bytes, history_limit=MEMORY_HISTORY_EVENTS)
        endpoints = settings.etcd_endpoints
        if not endpoints:
            data_dir = Path(settings.data_dir)
            data_dir.mkdir(parents=True, exist_ok=True)
            self.etcd_server = embedded_etcd.EmbeddedEtcd(
                data_dir,
                client_port=settings.embedded_etcd_client_port,
                peer_port=settings.embedded_etcd_peer_port,
                max_request_bytes=settings.etcd_max_request_bytes,
            )
            try:
                await self.etcd_server.start_async()
            except embedded_etcd.PortInUse as busy:
                raise embedded_etcd.PortInUse(
                    busy.role, busy.host, busy.port, busy.owner,
                    f"stop that process, or give this SC another {busy.role} port with "
                    f"--embedded-etcd-{busy.role}-port (or SC_EMBEDDED_ETCD_{busy.role.upper()}_PORT)",
                ) from None
            self._etcd_supervision = self.supervisor.spawn("etcd-supervisor", self.etcd_server.supervise)
            endpoints = self.etcd_server.endpoints
            log.info("embedded etcd started", data_dir=str(data_dir), endpoints=endpoints)
        store = await etcd.EtcdStore.open(
            endpoints,
            settings.key_prefix,
            settings.etcd_request_timeout,
            max_request_bytes=settings.etcd_max_request_bytes,
            attempt_timeout=settings.etcd_attempt_timeout,
        )
        try:
            # Now rather than at the first transaction too long or too large, which would fail for ever.
            await store.check_limits(config.MIN_ETCD_REQUEST_BYTES)
        except BaseException:
            await store.close()
            raise
        return store

    async def _open_history(self) -> None:
        settings = self.settings
        directory = settings.history_dir
        if directory is None and settings.store is config.StoreKind.ETCD and not settings.etcd_endpoints:
            # The data dir is this SC's own only when it runs its embedded etcd there.
            directory = Path(settings.data_dir) / "history"
        if directory is None or not settings.record_history:
            return
        self.history = await asyncio.to_thread(history.Recorder.open, directory)
        await self.history.start(self.supervisor)
        log.info("recording the metadata history", directory=str(directory), resume_revision=self.history.resume_revision)

    async def stop(self) -> None:
        self._stopping = True
        if self._role is not None:
            self._role.cancel()
            await asyncio.gather(self._role, return_exceptions=True)
            self._role = None
        if self.connections is not None:
            await self.connections.stop()
        if self.pipeline is not None:
            # Draining is writing: pointless (and up to its whole timeout) while writes are refused.
            if self._term and self.active is not None and self.active.problem() is None:
                await self.pipeline.stop()
            else:
                await self.pipeline.stop(drain_timeout=0.0)
            self._term = 0
        if self.history is not None:
            await self.history.close()  # after the pipeline: its last actions are recorded
            self.history = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        # A reload still reading in its thread is dropped (its thread ends on its own, and the
        # process waits for it before it exits); nothing it read is put in place.
        if self._file_watch is not None:
            self._file_watch.cancel()
            await asyncio.gather(self._file_watch, return_exceptions=True)
            self._file_watch = None
        await supervisor_module.cancel_and_wait(*self._signalled_reloads)
        if self._keeper is not None:
            self._keeper.cancel()
            await asyncio.gather(self._keeper, return_exceptions=True)
            self._keeper = None
        if self.active is not None:
            await self.active.release()  # after the last write: the next SC need not wait
        if self.context is not None:
            await self.context.kv_store.close()
        if self._etcd_supervision is not None:
            await supervisor_module.cancel_and_wait(self._etcd_supervision)
        if self.etcd_server is not None:
            await asyncio.to_thread(self.etcd_server.stop)
            self.etcd_server = None

    async def reload_files(self) -> None:
        """What SIGHUP does: read every secret file again now, one after the other (each in a
        worker thread, put in place on the loop)."""
        for reloadable in self.reloadables:
            await reloadable.reload()

    def _reload_on_signal(self) -> None:
        """SIGHUP's handler: the reload runs as a task of its own (a handler must not wait), and
        none starts once the SC is stopping."""
        if self._stopping:
            log.info("SIGHUP while stopping: the files are not read again")
            return
        reload = asyncio.get_running_loop().create_task(self.reload_files(), name="sighup-reload")
        self._signalled_reloads.add(reload)
        reload.add_done_callback(self._signalled_reload_ended)

    def _signalled_reload_ended(self, reload: asyncio.Task[None]) -> None:
        self._signalled_reloads.discard(reload)
        if not reload.cancelled() and (error := reload.exception()) is not None:
            log.error("SIGHUP's reload failed", error=repr(error))

    async def run_until_signalled(self) -> None:
        loop = asyncio.get_running_loop()
        stopping = asyncio.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stopping.set)
        # SIGHUP: load the TLS, credentials and SPU token files again now (they are also looked at
        # every few seconds), in worker threads.
        loop.add_signal_handler(signal.SIGHUP, self._reload_on_signal)
        # Process-wide settings, so only here (the `sc run` process), not in start().
        gc.set_threshold(GC_GEN0_THRESHOLD, *gc.get_threshold()[1:])
        transport.raise_file_limit()
        await self.start()
        gc.freeze()
        try:
            # Losing the store's claim is no reason to stop: this SC goes on as a standby.
            await stopping.wait()
            log.info("stopping: draining actions, closing connections")
        finally:
            await self.stop()
            log.info("stopped")


class SpuTokenFile(tls.Reloadable[tuple[str, ...]]):
    """The SPU token file, read again (in a worker thread) when it changes and on SIGHUP: one of the
    tokens it lists now is asked of the SPUs that register from then on (ConnectionManager.set_tokens)."""

    def __init__(self, path: Path, connections: cm_server.ConnectionManager) -> None:
        self.connections = connections
        what = "SPU token file"
        super().__init__("spu_token", what, (path,), ((path, what),), "SPUs register with the previous token")

    def read(self) -> tuple[str, ...]:
        tokens = config.read_tokens(self.paths[0])
        assert tokens is not None  # read_tokens gives None for no file only
        return tokens

    def put(self, built: tuple[str, ...]) -> None:
        self.connections.set_tokens(built)


def _ports(settings: config.Settings) -> tuple[transport.Port, transport.Port]:
    """The public and private ports' limits and timeouts: the settings', or derived from the
    open-file limit, so that both stay below it and the private port keeps a share of its own."""
    files = transport.file_limit()
    limits = transport.derive_limits(
        files, settings.max_connections_public, settings.max_connections_private, settings.max_connections_per_address
    )
    timeouts = transport.Timeouts(settings.client_header_timeout, settings.client_body_timeout, settings.client_idle_timeout)
    buffered = settings.max_buffered_request_bytes
    backlog = settings.listen_backlog or transport.listen_backlog()
    reserve = transport.reserved_descriptors(files)
    if limits.public + limits.private > files - reserve:
        log.warning(
            "the connection limits leave fewer descriptors than the reserve: accepting may fail and pause",
            open_file_limit=files, public=limits.public, private=limits.private, reserve=reserve,
        )
    log.info(
        "connection limits", open_file_limit=files, public=limits.public, private=limits.private,
        per_address=limits.per_address, listen_backlog=backlog, header_timeout=timeouts.header, body_timeout=timeouts.body, idle_timeout=timeouts.idle,
    )  # fmt: skip
    return (
        transport.Port(transport.PUBLIC, transport.Limits(limits.public, limits.per_address, buffered, backlog), timeouts),
        transport.Port(transport.PRIVATE, transport.Limits(limits.private, limits.per_address, buffered, backlog), timeouts),
    )


def _advertised(host: str, advertise_host: str | None) -> str:
    """The host other SCs, SPUs and clients reach this one at: advertise_host when set (a container's
    or pod's own name may not resolve for others), else the host bound, or this host's name when it
    binds every interface."""
    if advertise_host is not None:
        return advertise_host
    return socket.gethostname() if host in ("", "0.0.0.0", "::") else host


def _address(host: str, port: int | None) -> str:
    """HOST:PORT as the claim's readers split it (SPUs, the Fluvio forwarder, a redirect's URL): an IPv6
    address in brackets. The port is bound when this is called (None only before)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _bound_port(runner: web.AppRunner, configured: int) -> int:
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            return int(address[1])
    return configured
