"""Settings: flags over SC_* environment variables over the TOML file over defaults."""

from __future__ import annotations

import argparse
import os
import socket
from pathlib import Path

import pytest

from controller import config, daemon, logs
from controller.cli import main as cli


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
    assert config.read_tokens(token) == ("s3cret",)
    assert config.read_tokens(None) is None
    # One token, written as before (no newline, or a Windows one): read as before.
    token.write_text("s3cret with inner spaces\r\n")
    assert config.read_tokens(token) == ("s3cret with inner spaces",)
    token.write_text("\n")
    with pytest.raises(ValueError, match=f"the SPU token file '{token}' is empty"):
        config.read_tokens(token)
    with pytest.raises(ValueError, match="cannot read the SPU token file '/nonexistent/token'"):
        config.read_tokens(Path("/nonexistent/token"))


def test_the_spu_token_file_may_list_several_tokens_one_a_line_for_a_rotation(tmp_path: Path) -> None:
    """During a rotation the file holds the new token and the old one: both are accepted."""
    token = tmp_path / "token"
    token.write_text("# the new one, since 2026-11-29\n  new-token-0123456789\n\n# the old one, until every SPU has the new\nold-token-0123456789 \n")
    assert config.read_tokens(token) == ("new-token-0123456789", "old-token-0123456789")


def test_a_spu_token_file_of_comments_only_holds_no_token(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("# old-token-0123456789\n\n")
    with pytest.raises(ValueError) as raised:
        config.read_tokens(token)
    assert str(raised.value) == (
        f"the SPU token file '{token}' holds no token: each of its 2 lines is blank or a comment (#); "
        "write the token on a line of its own"
    )
    assert "old-token" not in str(raised.value)


def test_a_spu_token_listed_twice_is_refused_naming_both_lines_never_the_token(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("new-token-0123456789\n# rotated\nnew-token-0123456789\n")
    with pytest.raises(ValueError) as raised:
        config.read_tokens(token)
    assert str(raised.value) == (
        f"the SPU token file '{token}' line 3: the token (20 characters, not shown) is line 1's too; "
        "list each token once (the new one, and the old one until every SPU has the new)"
    )


def test_the_spu_token_file_holds_at_most_16_tokens(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("".join(f"token-{index:02}-0123456789\n" for index in range(config.MAX_SPU_TOKENS)))
    assert len(config.read_tokens(token) or ()) == config.MAX_SPU_TOKENS
    token.write_text("".join(f"token-{index:02}-0123456789\n" for index in range(17)))
    with pytest.raises(ValueError) as raised:
        config.read_tokens(token)
    assert str(raised.value) == (
        f"the SPU token file '{token}' holds 17 tokens, more than 16: keep the new token and the ones "
        "SPUs still present (a rotation needs two)"
    )
    assert "0123456789" not in str(raised.value)


@pytest.mark.parametrize("host", ["sc-0.sc-peers", "sc-1", "SC-A.example.com", "10.0.0.5", "fd00::1"])
def test_an_advertise_host_is_a_host_name_or_an_ip_address(host: str) -> None:
    assert config.Settings(advertise_host=host).advertise_host == host


@pytest.mark.parametrize("host", ["http://sc-0", "sc-0:9003", "sc-0.sc-peers/", "", "sc 0", "-sc", "sc-.peers", "a..b", "[fd00::1]"])
def test_an_advertise_host_with_a_scheme_a_port_or_no_host_shape_is_refused_by_name(host: str) -> None:
    with pytest.raises(config.ConfigError) as raised:
        config.load(advertise_host=host)
    assert raised.value.problems == [
        f"advertise_host (--advertise-host) = {host}: advertise host {host!r} is not a host name or IP address: "
        "give the name other SCs, SPUs and clients reach this SC at, without scheme or port (like sc-0.sc-peers)"
    ]


def test_the_advertised_host_is_the_advertise_host_else_the_bound_host_else_this_hosts_name() -> None:
    assert [daemon._advertised(bound, None) for bound in ("0.0.0.0", "::", "", "10.1.2.3")] == [socket.gethostname()] * 3 + ["10.1.2.3"]
    assert [daemon._advertised(bound, "sc-0.sc-peers") for bound in ("0.0.0.0", "127.0.0.1", "10.1.2.3")] == ["sc-0.sc-peers"] * 3
    # As HOST:PORT, an IPv6 address in brackets, as the claim's readers (SPUs, the Fluvio forwarder, a redirect's URL) take it.
    assert [daemon._address(host, 9004) for host in ("sc-0.sc-peers", "10.1.2.3", "fd00::1")] == ["sc-0.sc-peers:9004", "10.1.2.3:9004", "[fd00::1]:9004"]


# ---------------------------------------------------------------------------- errors: one line each, naming the source

FIVE_THOUSAND_DIGITS = "9" * 5000


@pytest.mark.parametrize(
    ("argv", "environment", "file_text", "expected"),
    [
        ([], {"SC_PUBLIC_PORT": "99999"}, None, ["public_port (SC_PUBLIC_PORT) = 99999: must be at most 65535"]),
        (["--public-port", "70000"], {}, None, ["public_port (--public-port) = 70000: must be at most 65535"]),
        ([], {}, "public_port = 99999\n", ["public_port (public_port in {file}) = 99999: must be at most 65535"]),
        (
            ["--private-port", "-1"],
            {"SC_RESYNC_INTERVAL": "abc"},
            "log_level = [1]\nbogus = 1\n",
            [
                "private_port (--private-port) = -1: must be at least 0",
                "resync_interval (SC_RESYNC_INTERVAL) = abc: must be a number",
                "log_level (log_level in {file}) = [1]: must be a string",
                "bogus (in {file}) = 1: is not a setting (see the configuration reference in docs/configuration.md)",
            ],
        ),
        # The environment is above the file: the value that counts, and its source, are the variable's.
        ([], {"SC_SPU_HEARTBEAT_TIMEOUT": "0"}, "spu_heartbeat_timeout = 3\n", ["spu_heartbeat_timeout (SC_SPU_HEARTBEAT_TIMEOUT) = 0: must be more than 0"]),
        ([], {"SC_RESYNC_INTERVAL": "inf"}, None, ["resync_interval (SC_RESYNC_INTERVAL) = inf: must be a finite number"]),
        (["--spu-offline-grace", "nan"], {}, None, ["spu_offline_grace (--spu-offline-grace) = nan: must be a finite number"]),
        ([], {"SC_STORE": "mysql"}, None, ["store (SC_STORE) = mysql: must be 'etcd' or 'memory'"]),
        (["--key-prefix", "sc"], {}, None, ["key_prefix (--key-prefix) = sc: key prefix 'sc' must start and end with '/', like /sc/"]),
        (["--log-level", "loud"], {}, None, ["log_level (--log-level) = loud: log level 'loud' is unknown: use debug, info, warning or error"]),
        ([], {"SC_SPU_MAX_FRAME_BYTES": "12"}, None, ["spu_max_frame_bytes (SC_SPU_MAX_FRAME_BYTES) = 12: must be at least 1024"]),
        (
            [], {"SC_PUBLIC_PORT": FIVE_THOUSAND_DIGITS}, None,
            ["public_port (SC_PUBLIC_PORT) = 99999999999999999999... (5000 characters): must be a whole number"],
        ),
        ([], {}, "public_port = \n", ["config file {file} is not valid TOML: Invalid value (at line 1, column 15)"]),
        ([], {}, "public_port = 9003\n\xff\n", ["config file {file} is not UTF-8 text"]),
    ],
)
def test_sc_run_prints_each_bad_setting_on_one_line_naming_its_source_with_status_2(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    environment: dict[str, str],
    file_text: str | None,
    expected: list[str],
) -> None:
    for name, value in environment.items():
        monkeypatch.setenv(name, value)

    async def must_not_start(self: daemon.Daemon) -> None:
        raise AssertionError(f"the configuration was accepted: {self.settings}")

    monkeypatch.setattr(daemon.Daemon, "run_until_signalled", must_not_start)
    config_file = tmp_path / "sc.toml"
    if file_text is not None:
        config_file.write_bytes(file_text.encode("latin-1"))
        argv = [*argv, "--config", str(config_file)]
    assert cli.main(["run", "--bind-host", "127.0.0.1", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        "error: invalid configuration: " + line.format(file=config_file) for line in expected
    ]
    assert captured.out == ""


# ---------------------------------------------------------------------------- `sc run`'s flags: made from Settings


def _run_parser() -> argparse.ArgumentParser:
    parser = cli.build_parser(commands=["run"])
    assert parser._subparsers is not None
    commands = parser._subparsers._group_actions[0]
    assert isinstance(commands, argparse._SubParsersAction)
    run: argparse.ArgumentParser = commands.choices["run"]
    return run


def test_every_setting_has_a_flag_whose_help_is_its_description_and_default() -> None:
    actions = {action.dest: action for action in _run_parser()._actions if action.option_strings}
    assert set(actions) == {"help", "config", *config.Settings.model_fields}
    assert (actions["public_port"].option_strings, actions["public_port"].help) == (
        ["--public-port"], "HTTP API, /metrics and Fluvio's protocol (0: any free port) (default 9003)"
    )  # fmt: skip
    assert (actions["record_history"].option_strings, actions["record_history"].help) == (["--no-history"], "do not record the metadata history")
    assert (actions["data_dir"].help, actions["history_dir"].help) == (
        "the embedded etcd's data (and the history under it) (default ./sc-data)",
        "the metadata history; none: <data_dir>/history with the embedded etcd, no history otherwise",
    )
    assert actions["store"].choices == ["etcd", "memory"]
    for name, field in config.Settings.model_fields.items():
        shown = actions[name].help
        assert field.description and shown and field.description in shown, name


def test_each_flag_reaches_its_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[config.Settings] = []

    async def record(self: daemon.Daemon) -> None:
        started.append(self.settings)

    monkeypatch.setattr(daemon.Daemon, "run_until_signalled", record)
    monkeypatch.setattr(logs, "configure", lambda log_format, level: None)  # the test process's logging stays as it is
    for name in list(os.environ):
        if name.upper().startswith("SC_"):
            monkeypatch.delenv(name)
    argv = [
        "run", "--store", "memory", "--bind-host", "127.0.0.1", "--public-port", "7003", "--no-history",
        "--etcd-endpoints", "http://a:2379,http://b:2379", "--etcd-attempt-timeout", "0.25", "--active-sc-lease-ttl", "20",
        "--spu-allow-remote-without-token", "--max-connections-public", "50", "--log-level", "warning",
        "--placement-plugin", "one=tests.placement_plugins:HighestFirst", "--placement-plugin", "two=pkg.mod:Placer",
    ]  # fmt: skip
    assert cli.main(argv) == 0
    (settings,) = started
    assert settings == config.Settings(
        store=config.StoreKind.MEMORY, bind_host="127.0.0.1", public_port=7003, record_history=False,
        etcd_endpoints=["a:2379", "b:2379"], etcd_attempt_timeout=0.25, active_sc_lease_ttl=20,
        spu_allow_remote_without_token=True, max_connections_public=50, log_level="warning",
        placement_plugins={"one": "tests.placement_plugins:HighestFirst", "two": "pkg.mod:Placer"},
    )  # fmt: skip
