"""The SC's settings: flags, environment variables (SC_*) and an optional TOML config file.

Precedence, highest first: command-line flags, environment, config file, defaults.
"""

from __future__ import annotations

import enum
import json
import logging
import os
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


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SC_", extra="forbid", frozen=True)

    bind_host: str = "0.0.0.0"
    public_port: Port = 9003
    private_port: Port = 9004
    store: StoreKind = StoreKind.ETCD
    # NoDecode: SC_ETCD_ENDPOINTS is written like the flag (comma-separated), not as a JSON list.
    etcd_endpoints: Annotated[list[str], NoDecode] = Field(default_factory=list)
    key_prefix: str = kv.DEFAULT_PREFIX
    data_dir: Path = Path("./sc-data")
    # The metadata history (store/history.py); None: <data_dir>/history with the embedded etcd, else none.
    history_dir: Path | None = None
    record_history: bool = True
    embedded_etcd_client_port: Port = 12379
    embedded_etcd_peer_port: Port = 12380
    etcd_request_timeout: Seconds = 5.0
    # One attempt of an etcd request, retried within etcd_request_timeout (store/etcd.py).
    etcd_attempt_timeout: Seconds = 0.5
    # Seconds the active-SC claim outlives its SC's last keep-alive (store/active_sc.py).
    active_sc_lease_ttl: Annotated[int, Field(ge=2, le=3600)] = 10
    # etcd's --max-request-bytes (the embedded etcd runs with it; an external cluster must match).
    # The memory store enforces it too. At least 512 KiB: a transaction of 128 partitions of the
    # largest shape (replication factor 128, 10-digit SPU ids) must fit.
    etcd_max_request_bytes: Annotated[int, Field(ge=512 * 1024)] = kv.DEFAULT_MAX_REQUEST_BYTES
    resync_interval: Seconds = 60.0
    spu_offline_grace: Seconds = 30.0
    spu_heartbeat_timeout: Seconds = 10.0
    # An SPU sends live offsets at most this often, and only those that changed (for people: no
    # decision depends on them). The SC's cost of a busy cluster's offsets scales with its inverse.
    spu_offsets_interval: Seconds = 1.0
    spu_token_file: Path | None = None
    # Without a token the private port accepts SPUs from loopback only, unless this says otherwise.
    spu_allow_remote_without_token: bool = False
    spu_max_frame_bytes: Annotated[int, Field(ge=1024)] = 4 * 1024 * 1024
    # Slow or silent clients on both ports (connection_manager/transport.py).
    client_header_timeout: Seconds = 10.0
    client_body_timeout: Seconds = 30.0
    client_idle_timeout: Seconds = 60.0
    # None: derived from the open-file limit at start (transport.derive_limits).
    max_connections_public: Annotated[int, Field(ge=1)] | None = None
    max_connections_private: Annotated[int, Field(ge=1)] | None = None
    max_connections_per_address: Annotated[int, Field(ge=1)] | None = None
    max_buffered_request_bytes: Annotated[int, Field(ge=1024 * 1024)] = 128 * 1024 * 1024
    unclean_leader_election: bool = False
    leader_rebalance_batch: Annotated[int, Field(ge=0)] = 100
    # Expensive reads (whole lists, placement and dry runs, Fluvio List) admitted at once, how many
    # more may wait for a slot and for how long; beyond, HTTP 429 with Retry-After.
    max_expensive_requests: Annotated[int, Field(ge=1)] = 8
    max_expensive_queue: Annotated[int, Field(ge=0)] = 64
    expensive_queue_seconds: Seconds = 5.0
    # Encoded list answers kept for identical lists of an unchanged store (bytes, all kinds together).
    list_cache_bytes: Annotated[int, Field(ge=0)] = 64 * 1024 * 1024
    # Watch streams (HTTP, WebSocket, Fluvio) open at once, in all and from one client address.
    max_watchers: Annotated[int, Field(ge=1)] = 1024
    max_watchers_per_address: Annotated[int, Field(ge=1)] = 256
    # Changes queued for one HTTP watcher that has not taken them yet; beyond, it is dropped.
    watch_buffer_bytes: Annotated[int, Field(ge=64 * 1024)] = 16 * 1024 * 1024
    # A watcher or a list reader that accepts no bytes for this long is dropped (connection aborted).
    client_stall_seconds: Seconds = 30.0
    log_format: LogFormat = LogFormat.AUTO
    log_level: str = "info"
    # NoDecode: SC_PLACEMENT_PLUGINS is written like the flags (NAME=module:Class,...), not as JSON.
    placement_plugins: Annotated[dict[str, str], NoDecode] = Field(default_factory=dict)
    placement_entry_points: bool = False

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


def read_token(path: Path | None) -> str | None:
    """The shared SPU token from ``--spu-token-file`` (surrounding whitespace ignored)."""
    if path is None:
        return None
    try:
        token = path.read_text().strip()
    except OSError as error:
        raise ValueError(f"cannot read the SPU token file {str(path)!r}: {error.strerror}") from None
    if not token:
        raise ValueError(f"the SPU token file {str(path)!r} is empty")
    return token


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
                "(see the configuration reference in README.md)"
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
