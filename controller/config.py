"""The SC's settings: flags, environment variables (SC_*) and an optional TOML config file.

Precedence, highest first: command-line flags, environment, config file, defaults.
"""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated, Any

import pydantic
from pydantic import Field
from pydantic_settings import BaseSettings, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict, TomlConfigSettingsSource

from store import kv


class StoreKind(str, enum.Enum):
    ETCD = "etcd"
    MEMORY = "memory"


class LogFormat(str, enum.Enum):
    AUTO = "auto"  # console on a terminal, JSON otherwise
    CONSOLE = "console"
    JSON = "json"


Port = Annotated[int, Field(ge=0, le=65535)]
Seconds = Annotated[float, Field(gt=0)]


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
    resync_interval: Seconds = 60.0
    spu_offline_grace: Seconds = 30.0
    spu_heartbeat_timeout: Seconds = 10.0
    spu_token_file: Path | None = None
    spu_max_frame_bytes: Annotated[int, Field(ge=1024)] = 4 * 1024 * 1024
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


def load(config_file: Path | None = None, **overrides: Any) -> Settings:
    """Settings from flags (``overrides``; None means "not given"), SC_* variables and the file."""
    if config_file is None:
        return Settings(**_given(overrides))
    if not config_file.is_file():
        raise ValueError(f"config file {str(config_file)!r} does not exist")

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

    return FileSettings(**_given(overrides))


def _given(overrides: dict[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in overrides.items() if value is not None}
