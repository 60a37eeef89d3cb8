"""Settings: flags over SC_* environment variables over the TOML file over defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller import config


def test_etcd_endpoints_from_the_environment_are_comma_separated_like_the_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SC_ETCD_ENDPOINTS", "http://a:2379, http://b:2379")
    assert config.load().etcd_endpoints == ["a:2379", "b:2379"]


def test_precedence_flags_then_environment_then_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config_file = tmp_path / "sc.toml"
    config_file.write_text('public_port = 7003\nprivate_port = 7004\nspu_heartbeat_timeout = 3.5\nkey_prefix = "/file/"\n')
    monkeypatch.setenv("SC_PRIVATE_PORT", "8004")
    monkeypatch.setenv("SC_KEY_PREFIX", "/env/")
    settings = config.load(config_file, key_prefix="/flag/", public_port=None)
    assert (settings.public_port, settings.private_port, settings.spu_heartbeat_timeout, settings.key_prefix) == (
        7003, 8004, 3.5, "/flag/"
    )


def test_the_spu_token_file_is_read_and_must_hold_a_token(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("  s3cret\n")
    assert config.read_token(token) == "s3cret"
    assert config.read_token(None) is None
    token.write_text("\n")
    with pytest.raises(ValueError, match=f"the SPU token file '{token}' is empty"):
        config.read_token(token)
    with pytest.raises(ValueError, match="cannot read the SPU token file '/nonexistent/token'"):
        config.read_token(Path("/nonexistent/token"))
