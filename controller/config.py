"""The SC's settings: flags, environment variables (SC_*) and an optional TOML config file.

Precedence, highest first: command-line flags, environment, config file, defaults.
"""

from __future__ import annotations

import enum
import ipaddress
import json
import logging
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import pydantic
from pydantic import Field
from pydantic_settings import BaseSettings, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict, TomlConfigSettingsSource

from controller import placement_plugins
from store import kv, models


class StoreKind(str, enum.Enum):
    ETCD = "etcd"
    MEMORY = "memory"


class LogFormat(str, enum.Enum):
    AUTO = "auto"  # console on a terminal, JSON otherwise
    CONSOLE = "console"
    JSON = "json"


Port = Annotated[int, Field(ge=0, le=65535)]
# Finite: an infinite timeout or interval would reach asyncio, etcd and the SPUs' frames.
Seconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]
# The least etcd_max_request_bytes (see the setting): a cluster taking smaller requests is refused at start.
MIN_ETCD_REQUEST_BYTES = 512 * 1024


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SC_", extra="forbid", frozen=True)

    # Each setting's description is the help of its `sc run` flag (controller/cli/run.py).
    bind_host: str | None = Field(
        None,
        description="address both ports bind to; none: all interfaces, except the public port while no credential is configured: 127.0.0.1",
    )
    # Part of this SC's identity in the candidates' queue: a standby's redirects and refusals name
    # the leader's. Behind 0.0.0.0 in a container or pod, this host's name may not resolve for others.
    advertise_host: str | None = Field(
        None,
        description="the host name (or IP) other SCs, SPUs and clients reach this SC at, on both ports; none: bind_host, or this host's name when binding every interface",
    )
    public_port: Port = Field(9003, description="HTTP API, /metrics and Fluvio's protocol (0: any free port)")
    private_port: Port = Field(9004, description="where SPUs connect (0: any free port)")
    store: StoreKind = Field(StoreKind.ETCD, description="etcd, or memory (nothing survives a restart)")
    # NoDecode: SC_ETCD_ENDPOINTS is written like the flag (comma-separated), not as a JSON list.
    etcd_endpoints: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="comma-separated http://host:port of an existing etcd cluster; none: the embedded etcd"
    )
    key_prefix: str = Field(kv.DEFAULT_PREFIX, description="where this cluster's objects live in etcd (starts and ends with /)")
    data_dir: Path = Field(Path("./sc-data"), description="the embedded etcd's data (and the history under it)")
    # The metadata history (store/history.py).
    history_dir: Path | None = Field(
        None, description="the metadata history; none: <data_dir>/history with the embedded etcd, no history otherwise"
    )
    record_history: bool = Field(True, description="record the metadata history")
    embedded_etcd_client_port: Port = Field(12379, description="the embedded etcd's client port (on 127.0.0.1)")
    embedded_etcd_peer_port: Port = Field(12380, description="the embedded etcd's peer port")
    etcd_request_timeout: Seconds = Field(
        5.0, description="seconds an etcd request may take, retries included, before it counts as unavailable"
    )
    # One attempt of an etcd request, retried within etcd_request_timeout (store/etcd.py).
    etcd_attempt_timeout: Seconds = Field(
        0.5, description="seconds before one attempt of an etcd request is abandoned and retried (or 4 times its slowest recent answer, if longer)"
    )
    # The active-SC claim: store/active_sc.py.
    active_sc_lease_ttl: Annotated[int, Field(ge=2, le=3600)] = Field(
        10, description="seconds the active-SC claim outlives its SC's last keep-alive: how long a crashed SC delays the next start"
    )
    # The memory store enforces it too. At least 512 KiB: a transaction of 128 partitions of the
    # largest shape (replication factor 128, 10-digit SPU ids) must fit.
    etcd_max_request_bytes: Annotated[int, Field(ge=MIN_ETCD_REQUEST_BYTES)] = Field(
        kv.DEFAULT_MAX_REQUEST_BYTES,
        description="etcd's --max-request-bytes (the embedded etcd runs with it; set it to an external cluster's own); at least 524288",
    )
    resync_interval: Seconds = Field(60.0, description="seconds between full controller resyncs")
    spu_offline_grace: Seconds = Field(30.0, description="seconds an SPU recorded Online may take to reconnect after an SC start")
    spu_heartbeat_timeout: Seconds = Field(10.0, description="seconds of SPU silence before it is marked offline")
    # An SPU sends live offsets at most this often, and only those that changed (for people: no
    # decision depends on them). The SC's cost of a busy cluster's offsets scales with its inverse.
    spu_offsets_interval: Seconds = Field(1.0, description="seconds between an SPU's live offsets reports (only the offsets that changed)")
    # What all SPUs together may send: an SPU is given the longer interval that keeps the cluster's
    # offsets within it (partitions / this), so the SC's cost of offsets does not grow with the
    # partition count (at 100,000 busy partitions a 1 s interval took most of its core).
    spu_offsets_entries_per_second: Annotated[int, Field(ge=1)] = Field(
        20_000, description="per-partition offsets all SPUs together send per second at most (the interval grows with the partitions)"
    )
    # An SPU's frames by their bytes: far above what an SPU sends, a bound on what one that floods
    # (a bug, a stolen token) costs the SC (~20% of its core at the default).
    spu_frame_bytes_per_second: Annotated[int, Field(ge=1)] = Field(
        1024 * 1024,
        description="bytes per second of an SPU's frames the SC reads, beyond a burst of twice spu_max_frame_bytes",
    )
    spu_token_file: Path | None = Field(None, description="file holding the shared token every SPU must present (in a rotation, the new and the old: one a line)")
    # Without a token the private port accepts SPUs from loopback only, unless this says otherwise.
    spu_allow_remote_without_token: bool = Field(
        False, description="without a token, accept SPUs from other hosts too (anyone reaching the port can then be any SPU)"
    )
    spu_max_frame_bytes: Annotated[int, Field(ge=1024)] = Field(
        4 * 1024 * 1024, description="largest frame an SPU may send; a larger one closes that connection"
    )
    # TLS on both ports (PEM files, reloaded when they change or on SIGHUP; connection_manager/tls.py).
    tls_cert: Path | None = Field(
        None, description="PEM certificate (chain) of both ports: they then speak TLS 1.2 or later only (reloaded on change and SIGHUP)"
    )
    tls_key: Path | None = Field(None, description="PEM private key of tls_cert")
    # Client certificates signed by this CA: required of SPUs on the private port (CN or DNS SAN
    # spu-<id>), optional on the public port, where a mapped one is a credential.
    tls_client_ca: Path | None = Field(
        None, description="PEM CA of client certificates: SPUs must present one naming spu-<id>; on the public port one is a credential"
    )
    # controller/api/auth.py.
    auth_tokens: Path | None = Field(
        None, description="credentials of the public port: lines NAME ROLE TOKEN or NAME ROLE cert:CN (roles read, admin, admin:PREFIX)"
    )
    public_bind_without_auth: bool = Field(
        False, description="bind the public port to bind_host even with no credential configured (anyone reaching it may change everything)"
    )
    # Slow or silent clients on both ports (connection_manager/transport.py).
    client_header_timeout: Seconds = Field(
        10.0, description="seconds a client has to send a request's line and headers, or a Fluvio frame's length and API key"
    )
    client_body_timeout: Seconds = Field(
        30.0, description="seconds a request body or Fluvio frame may pause; the whole may take this plus 1 s per 64 KiB"
    )
    client_idle_timeout: Seconds = Field(60.0, description="seconds a connection may wait between requests")
    # None: derived from the open-file limit at start (transport.derive_limits).
    max_connections_public: Annotated[int, Field(ge=1)] | None = Field(
        None, description="connections the public port holds at once; none: derived from the open-file limit"
    )
    max_connections_private: Annotated[int, Field(ge=1)] | None = Field(
        None, description="connections the private port holds at once; none: derived from the open-file limit"
    )
    max_connections_per_address: Annotated[int, Field(ge=1)] | None = Field(
        None, description="connections one client address may hold on each port; none: a quarter of the public port's"
    )
    # None: the system's largest (net.core.somaxconn on Linux; transport.listen_backlog), which
    # also caps a larger value.
    listen_backlog: Annotated[int, Field(ge=1, lt=1 << 31)] | None = Field(
        None, description="connections the kernel queues on each port before the SC accepts them; none: the system's largest (somaxconn)"
    )
    max_buffered_request_bytes: Annotated[int, Field(ge=1024 * 1024)] = Field(
        128 * 1024 * 1024, description="bytes of large request bodies and Fluvio frames buffered at once"
    )
    unclean_leader_election: bool = Field(
        False, description="let an out-of-sync replica lead when no in-sync one is online (may lose committed records)"
    )
    leader_rebalance_batch: Annotated[int, Field(ge=0)] = Field(100, description="preferred-leader moves per controller pass (0: none)")
    # Each move copies a partition to its new SPUs: two at once per SPU keeps a rebalance going
    # without one SPU's disk and network serving nothing but catch-up fetches.
    rebalance_max_moves_per_spu: Annotated[int, Field(ge=1, le=10_000)] = Field(
        2, description="replica moves of a rebalance or decommission in flight per SPU at once (the API body may say otherwise)"
    )
    # Expensive reads (whole lists, placement and dry runs, rebalance plans, Fluvio List) admitted at once, how many
    # more may wait for a slot and for how long; beyond, HTTP 429 with Retry-After.
    max_expensive_requests: Annotated[int, Field(ge=1)] = Field(
        8, description="whole lists, pages, placements, dry runs and rebalance plans (HTTP and Fluvio) computed at once"
    )
    max_expensive_queue: Annotated[int, Field(ge=0)] = Field(
        64, description="more of them that may wait for a slot; beyond, 429 with Retry-After"
    )
    expensive_queue_seconds: Seconds = Field(5.0, description="how long one may wait for a slot before its 429")
    # All kinds together.
    list_cache_bytes: Annotated[int, Field(ge=0)] = Field(
        64 * 1024 * 1024, description="bytes of encoded whole-list answers kept for identical lists of an unchanged store"
    )
    max_watchers: Annotated[int, Field(ge=1)] = Field(
        1024, description="watch streams open at once (HTTP, WebSocket, Fluvio); beyond, 429"
    )
    max_watchers_per_address: Annotated[int, Field(ge=1)] = Field(256, description="watch streams open at once from one client address")
    watch_buffer_bytes: Annotated[int, Field(ge=64 * 1024)] = Field(
        16 * 1024 * 1024, description="bytes of changes an HTTP watcher may have not taken yet; beyond, it is dropped"
    )
    client_stall_seconds: Seconds = Field(
        30.0, description="a watcher or list reader that takes no bytes for this long is dropped (connection aborted)"
    )
    log_format: LogFormat = Field(LogFormat.AUTO, description="auto (console on a terminal, JSON otherwise), console or json")
    log_level: str = Field("info", description="debug, info, warning or error")
    # NoDecode: SC_PLACEMENT_PLUGINS is written like the flags (NAME=module:Class,...), not as JSON.
    placement_plugins: Annotated[dict[str, str], NoDecode] = Field(
        default_factory=dict,
        description="load a placement plug-in at start, which topics then name as placement strategy NAME (the flag once per plug-in)",
    )
    placement_entry_points: bool = Field(
        False,
        description="also load the placement plug-ins installed packages declare (entry points streaming_controller.placement)",
    )

    @pydantic.model_validator(mode="after")
    def _tls_pairs(self) -> Settings:
        if (self.tls_cert is None) != (self.tls_key is None):
            given, missing = ("tls_cert", "tls_key") if self.tls_key is None else ("tls_key", "tls_cert")
            raise ValueError(f"{given} is set but {missing} is not: TLS needs both the certificate and its key")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ValueError("tls_client_ca is set without tls_cert and tls_key: client certificates need TLS")
        return self

    @property
    def has_credentials(self) -> bool:
        """Whether the public port can tell who calls it (a tokens file, or client certificates)."""
        return self.auth_tokens is not None or self.tls_client_ca is not None

    @pydantic.field_validator("etcd_endpoints", mode="before")
    @classmethod
    def _split_endpoints(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [endpoint.strip() for endpoint in value.split(",") if endpoint.strip()]
        return value

    @pydantic.field_validator("etcd_endpoints")
    @classmethod
    def _host_port(cls, endpoints: list[str]) -> list[str]:
        normalised = []
        for endpoint in endpoints:
            bare = endpoint.removeprefix("http://").removeprefix("https://").rstrip("/")
            host, _, port = bare.rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"etcd endpoint {endpoint!r} is not of the form http://host:port")
            normalised.append(bare)
        return normalised

    @pydantic.field_validator("placement_plugins", mode="before")
    @classmethod
    def _plugin_pairs(cls, value: Any) -> Any:
        """NAME=module:Class items (comma-separated in the variable, one per flag) as a mapping."""
        if isinstance(value, str):
            value = [item.strip() for item in value.split(",") if item.strip()]
        if not isinstance(value, list):
            return value
        return placement_plugins.parse_references(value)

    @pydantic.field_validator("placement_plugins")
    @classmethod
    def _plugin_names_and_references(cls, plugins: dict[str, str]) -> dict[str, str]:
        for name, reference in plugins.items():
            models.validate_plugin_name(name)
            if not models.is_module_reference(reference):
                raise ValueError(f"placement plug-in {name!r}: {reference!r} is not written module:Class")
        return plugins

    @pydantic.field_validator("advertise_host")
    @classmethod
    def _host_shape(cls, host: str | None) -> str | None:
        if host is not None and not _is_host(host):
            raise ValueError(
                f"advertise host {host!r} is not a host name or IP address: give the name other SCs, SPUs and "
                "clients reach this SC at, without scheme or port (like sc-0.sc-peers)"
            )
        return host

    @pydantic.field_validator("log_level")
    @classmethod
    def _known_level(cls, level: str) -> str:
        if level.upper() not in logging.getLevelNamesMapping():  # what logs.configure takes
            raise ValueError(f"log level {level!r} is unknown: use debug, info, warning or error")
        return level

    @pydantic.field_validator("key_prefix")
    @classmethod
    def _prefix_shape(cls, prefix: str) -> str:
        if not prefix.startswith("/") or not prefix.endswith("/"):
            raise ValueError(f"key prefix {prefix!r} must start and end with '/', like /sc/")
        return prefix


LOOPBACK = "127.0.0.1"
ALL_INTERFACES = "0.0.0.0"


def public_bind(settings: Settings) -> tuple[str, str | None]:
    """The address the public port binds to, and why it is loopback when it is held there (None when
    it is not): without a credential, anyone who reaches the port may change everything."""
    wanted = settings.bind_host or ALL_INTERFACES
    if settings.has_credentials or settings.public_bind_without_auth or _is_loopback_host(wanted):
        return wanted, None
    return LOOPBACK, (
        f"no credential is configured, so the public port listens on {LOOPBACK} only (not {wanted}); "
        "to accept clients from other hosts set auth_tokens (--auth-tokens) or tls_client_ca "
        "(--tls-client-ca), or set public_bind_without_auth = true to serve everyone unauthenticated"
    )


def private_bind(settings: Settings) -> str:
    """The private port's address: SPUs prove themselves there (token, certificate, else loopback only)."""
    return settings.bind_host or ALL_INTERFACES


# A DNS name: dot-separated labels of letters, digits and inner hyphens (RFC 1123).
_HOST_NAME = re.compile(r"(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*")


def _is_host(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return _HOST_NAME.fullmatch(host) is not None
    return True


def _is_loopback_host(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


# The SPU token file lists the tokens an SPU may present: one, or during a rotation the new one and
# the old. A bound, so that a file pasted into by mistake (a whole secrets store) is refused, not
# compared in full at every registration.
MAX_SPU_TOKENS = 16


def read_tokens(path: Path | None, what: str = "SPU token file") -> tuple[str, ...] | None:
    """The shared SPU tokens from ``--spu-token-file``, in the file's order: one a line, surrounding
    whitespace ignored, blank lines and lines starting with ``#`` skipped. A file of one token
    reads as it always did. An error names the file and the line, never a token."""
    if path is None:
        return None
    try:
        text = path.read_text()
    except OSError as error:
        raise ValueError(f"cannot read the {what} {str(path)!r}: {error.strerror}") from None
    if not text.strip():
        raise ValueError(f"the {what} {str(path)!r} is empty")
    # Only a newline ends a line: a token written before several were allowed holds any other character.
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    tokens: dict[str, int] = {}  # token -> its line
    for number, line in enumerate(lines, 1):
        token = line.strip()
        if not token or token.startswith("#"):
            continue
        if token in tokens:
            raise ValueError(
                f"the {what} {str(path)!r} line {number}: the token ({len(token)} characters, not shown) is "
                f"line {tokens[token]}'s too; list each token once (the new one, and the old one until every "
                "SPU has the new)"
            )
        tokens[token] = number
    if not tokens:
        raise ValueError(
            f"the {what} {str(path)!r} holds no token: each of its {len(lines)} lines is blank or a comment (#); "
            "write the token on a line of its own"
        )
    if len(tokens) > MAX_SPU_TOKENS:
        raise ValueError(
            f"the {what} {str(path)!r} holds {len(tokens)} tokens, more than {MAX_SPU_TOKENS}: keep the new token "
            "and the ones SPUs still present (a rotation needs two)"
        )
    return tuple(tokens)


class ConfigError(ValueError):
    """Invalid settings: ``problems`` holds one line per problem, each naming the setting, where its
    value came from (flag, variable or file), the value and what would be valid."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def load(config_file: Path | None = None, flags: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
    """Settings from flags (``overrides``; None means "not given"), SC_* variables and the file.

    ``flags`` names the flag of each setting as the user writes it (default ``--public-port`` for
    ``public_port``), for the errors. Raises ConfigError.
    """
    given = _given(overrides)
    try:
        return _load(config_file, given)
    except pydantic.ValidationError as error:
        sources = _Sources(given, dict(flags or {}), config_file)
        raise ConfigError([sources.describe(problem) for problem in error.errors(include_url=False)]) from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError([f"config file {config_file} is not valid TOML: {error}"]) from None
    except UnicodeDecodeError:
        raise ConfigError([f"config file {config_file} is not UTF-8 text"]) from None
    except OSError as error:
        raise ConfigError([f"cannot read config file {config_file}: {error.strerror}"]) from None


def _load(config_file: Path | None, given: dict[str, Any]) -> Settings:
    if config_file is None:
        return Settings(**given)
    if not config_file.is_file():
        raise ConfigError([f"config file {str(config_file)!r} does not exist"])

    class FileSettings(Settings):
        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            return (init_settings, env_settings, TomlConfigSettingsSource(settings_cls, toml_file=config_file))

    return FileSettings(**given)


def _given(overrides: dict[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in overrides.items() if value is not None}


# What a value must be, by pydantic's error type (the others keep pydantic's own message).
_MUST_BE = {
    "int_parsing": "must be a whole number", "int_parsing_size": "must be a whole number", "int_type": "must be a whole number",
    "int_from_float": "must be a whole number", "float_parsing": "must be a number", "float_type": "must be a number",
    "finite_number": "must be a finite number", "bool_parsing": "must be true or false", "bool_type": "must be true or false",
    "string_type": "must be a string", "list_type": "must be a list", "path_type": "must be a path",
    "less_than_equal": "must be at most {le}", "less_than": "must be less than {lt}",
    "greater_than_equal": "must be at least {ge}", "greater_than": "must be more than {gt}", "enum": "must be {expected}",
}


@dataclass(frozen=True, slots=True)
class _Sources:
    """Where each setting's value came from, by precedence: flag, SC_* variable, config file."""

    given: dict[str, Any]
    flags: dict[str, str]
    config_file: Path | None

    def describe(self, problem: Any) -> str:
        name = str(problem["loc"][0]) if problem["loc"] else "(settings)"
        if problem["type"] == "extra_forbidden":
            return (
                f"{name} (in {self.config_file}) = {_shown(problem['input'])}: is not a setting "
                "(see the configuration reference in docs/configuration.md)"
            )
        template = _MUST_BE.get(problem["type"])
        bounds = {key: f"{value:g}" if isinstance(value, float) else value for key, value in problem.get("ctx", {}).items()}
        reason = template.format(**bounds) if template else problem["msg"].removeprefix("Value error, ")
        return f"{name} ({self.source(name)}) = {_shown(problem['input'])}: {reason}"

    def source(self, name: str) -> str:
        if name in self.given:
            return self.flags.get(name, "--" + name.replace("_", "-"))
        variable = f"{Settings.model_config['env_prefix']}{name}".upper()
        spelled = [key for key in os.environ if key.upper() == variable]  # as pydantic-settings: any case
        if spelled:
            return spelled[0]
        return f"{name} in {self.config_file}" if self.config_file is not None else "default"


def _shown(value: Any) -> str:
    """A value as the user wrote it: text as is, a file's values as TOML/JSON; long ones cut."""
    text = value if isinstance(value, str) else f"{value:g}" if isinstance(value, float) else json.dumps(value, default=str)
    return text if len(text) <= 40 else f"{text[:20]}... ({len(text)} characters)"
