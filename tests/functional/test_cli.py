"""`sc` as an operator runs it: a separate process against a running SC (in-memory store), for what
only a process shows: global flags anywhere, --version, errors as JSON with their exit codes, usage
errors naming the subcommand, a closed pipe, and which modules a command loads."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from importlib import metadata

import pytest

from controller import config
from tests.fixtures.daemon import COMMON_SETTINGS, Running, running

# Modules `sc --help` and the admin commands must not load: the daemon, the SPU simulator, aiohttp's
# server, the Fluvio codec, the Spark audit's pyspark and pyarrow.
HEAVY_MODULES = (
    "controller.daemon", "connection_manager.spu.simulator", "aiohttp.web", "controller.api.fluvio.messages",
    "pyspark", "pyarrow",
)  # fmt: skip


@pytest.fixture
async def sc() -> AsyncIterator[Running]:
    async with running(config.Settings(store=config.StoreKind.MEMORY, **COMMON_SETTINGS)) as handle:
        yield handle


def environment() -> dict[str, str]:
    """This process's environment without SC_* (an SC_ADDR of the caller's must not decide)."""
    return {name: value for name, value in os.environ.items() if not name.startswith("SC_")}


async def sc_command(*argv: str, stdout: int = asyncio.subprocess.PIPE) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of ``python -m controller.cli ARGV``."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "controller.cli", *argv,
        stdout=stdout, stderr=asyncio.subprocess.PIPE, env=environment(),
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode is not None
    return process.returncode, (out or b"").decode(), err.decode()


async def create_topic(sc: Running, name: str) -> None:
    status, body = await sc.call("POST", "/v1/topics?timeout=0", {"name": name, "spec": {"partitions": 1, "replicationFactor": 1}})
    assert status in (201, 202), body


@pytest.mark.parametrize(
    "placement",
    [
        ["--sc", "{url}", "-o", "json", "topic", "list"],
        ["topic", "list", "--sc", "{url}", "-o", "json"],
        ["-o", "json", "topic", "list", "--sc", "{url}"],
        ["--sc={url}", "topic", "list", "--output=json"],
        # The flag nearest the command wins, as with kubectl.
        ["--sc", "http://127.0.0.1:1", "topic", "list", "--sc", "{url}", "-o", "json"],
    ],
)
async def test_global_flags_go_before_or_after_the_command(sc: Running, placement: list[str]) -> None:
    await create_topic(sc, "orders")
    code, out, err = await sc_command(*(argument.format(url=sc.url) for argument in placement))
    assert (code, [topic["name"] for topic in json.loads(out)], err) == (0, ["orders"], "")


async def test_version() -> None:
    assert await sc_command("--version") == (0, f"sc {metadata.version('streaming-controller')}\n", "")


async def test_with_json_output_an_error_is_a_json_object_on_stdout(sc: Running) -> None:
    assert await sc_command("topic", "describe", "nope", "--sc", sc.url) == (1, "", "error: topic 'nope' not found\n")
    code, out, err = await sc_command("-o", "json", "topic", "describe", "nope", "--sc", sc.url)
    assert (code, json.loads(out), err) == (1, {"error": {"code": "NotFound", "message": "topic 'nope' not found"}}, "")
    code, out, err = await sc_command("topic", "list", "-o", "json", "--sc", "http://127.0.0.1:1")
    assert (code, json.loads(out)["error"]["code"], err) == (1, "Unreachable", "")
    # A usage error too, wherever -o json is written.
    code, out, err = await sc_command("topic", "create", "t", "-o", "json", "--sc", sc.url)
    assert (code, err) == (2, "")
    assert json.loads(out) == {
        "error": {
            "code": "Usage",
            "message": "sc topic create: a computed topic needs --partitions and --replication-factor "
            "(or give --replica-assignment FILE)",
        }
    }
    code, out, err = await sc_command("-o", "json", "topic", "list", "--bogus", "--sc", sc.url)
    assert (code, json.loads(out), err) == (
        2, {"error": {"code": "Usage", "message": "sc topic list: unrecognized arguments: --bogus"}}, ""
    )  # fmt: skip


async def test_a_topic_left_without_enough_spus_is_a_failure(sc: Running) -> None:
    reason = "replication factor 2 needs 2 online SPUs, none is online: 2 more needed"
    code, out, err = await sc_command("topic", "create", "orders", "-p", "1", "-r", "2", "--sc", sc.url)
    assert (code, out.splitlines()[1].split(None, 4)) == (1, ["orders", "InsufficientResources", "1", "2", reason])
    assert err == (
        f"error: topic 'orders' is not provisioned: {reason}; it was kept and will be provisioned once enough "
        "SPUs are online (or delete it: sc topic delete orders)\n"
    )
    code, out, err = await sc_command("topic", "create", "other", "-p", "1", "-r", "2", "-o", "json", "--sc", sc.url)
    assert (code, err) == (1, "")
    assert json.loads(out) == {
        "error": {
            "code": "InsufficientResources",
            "message": f"topic 'other' is not provisioned: {reason}; it was kept and will be provisioned once enough "
            "SPUs are online (or delete it: sc topic delete other)",
        }
    }


async def test_a_mistyped_flag_prints_the_subcommands_usage(sc: Running) -> None:
    code, out, err = await sc_command("topic", "list", "--sc", sc.url, "--topci", "a")
    assert (code, out) == (2, "")
    assert err.splitlines()[0].startswith("usage: sc topic list ")
    assert err.splitlines()[-1] == "sc topic list: error: unrecognized arguments: --topci a"
    code, out, err = await sc_command("--sc", sc.url, "partition", "list", "--topci", "a")
    assert (code, err.splitlines()[0].startswith("usage: sc partition list "), err.splitlines()[-1]) == (
        2, True, "sc partition list: error: unrecognized arguments: --topci a"
    )  # fmt: skip


async def test_a_closed_pipe_ends_the_command_quietly(sc: Running) -> None:
    await create_topic(sc, "orders")
    reading, writing = os.pipe()
    os.close(reading)  # `| head -1` having exited: every write fails with EPIPE
    try:
        code, _, err = await sc_command("topic", "list", "--sc", sc.url, stdout=writing)
    finally:
        os.close(writing)
    assert (code, err) == (141, "")  # 128 + SIGPIPE, as a shell reports a command a pipe ended


COMMAND_MODULES = tuple(f"controller.cli.{name}" for name in ("run", "topic", "spu", "spu_group", "partition", "placement", "audit", "demo"))


def loaded_modules_probe(*argv: str) -> str:
    """A script running `sc ARGV` in this process, then printing which of HEAVY_MODULES and
    COMMAND_MODULES it loaded (the command modules show the probe sees what is loaded)."""
    return (
        "import contextlib, io, json, sys\n"
        "from controller.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        f"    main.main({list(argv)!r})\n"
        f"print(json.dumps(sorted(name for name in {HEAVY_MODULES + COMMAND_MODULES!r} if name in sys.modules)))\n"
    )


@pytest.mark.parametrize(
    ("argv", "loaded"),
    [
        (["--help"], []),
        (["topic", "--help"], ["controller.cli.topic"]),
        (["topic", "list", "--sc", "{url}"], ["controller.cli.topic"]),
        (["-o", "json", "partition", "list", "--sc", "{url}"], ["controller.cli.partition"]),
        (["spu", "list", "--sc", "{url}"], ["controller.cli.spu"]),
        (["run", "--help"], ["controller.cli.run"]),
    ],
)
async def test_a_command_loads_its_own_module_only_and_nothing_heavy(sc: Running, argv: list[str], loaded: list[str]) -> None:
    probe = loaded_modules_probe(*(argument.format(url=sc.url) for argument in argv))
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", probe, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=environment()
    )
    out, err = await asyncio.wait_for(process.communicate(), 120)
    assert (process.returncode, json.loads(out), err.decode()) == (0, loaded, "")
