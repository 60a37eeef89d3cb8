"""`sc cluster rebalance [--dry-run|--status|--cancel] [--max-moves-per-spu N]` and `sc spu decommission`
against a real API server: tables, JSON output, errors and exit codes."""

from __future__ import annotations

import json
import re

import pytest

from tests.unit import api_server
from tests.unit.api_server import server  # noqa: F401 (server is a fixture)
from tests.unit.test_admin_cli import Sc
from tests.unit.test_rebalance_api import three_on_four


class QuietSc(Sc):
    """The CLI's output without the SC's log lines (the API server runs in this process)."""

    async def __call__(self, *argv: str, address: bool = True) -> tuple[int, str, str]:
        code, out, err = await super().__call__(*argv, address=address)
        return code, _without_logs(out), _without_logs(err)


_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d \[")


def _without_logs(text: str) -> str:
    return "".join(line for line in text.splitlines(keepends=True) if not _LOG_LINE.match(line))


@pytest.fixture
def sc(server: api_server.ApiServer, capsys: pytest.CaptureFixture[str]) -> Sc:
    return QuietSc(server, capsys)


async def test_dry_run_prints_the_moves_the_load_and_the_bound(server: api_server.ApiServer, sc: Sc) -> None:
    await three_on_four(server)
    assert await sc("cluster", "rebalance", "--dry-run") == (
        0,
        "PARTITION  FROM  TO\n"
        "t-0        0,1   3,1\n"
        "t-3        0,1   0,3\n"
        "SPU  REPLICAS BEFORE  AFTER  LEADERS BEFORE  AFTER\n"
        "0    3                2      2               1\n"
        "1    3                2      1               1\n"
        "2    2                2      1               1\n"
        "3    0                2      0               1\n"
        "2 replica move(s); lower bound 2\n"
        "dry run: nothing was changed\n",
        "",
    )  # fmt: skip
    code, out, err = await sc("cluster", "rebalance", "--dry-run", "-o", "json")
    assert (code, err, json.loads(out)["replicaMoves"]) == (0, "", 2)


async def test_start_status_and_cancel(server: api_server.ApiServer, sc: Sc) -> None:
    await three_on_four(server)
    code, out, err = await sc("cluster", "rebalance", "--max-moves-per-spu", "4")
    assert (code, err) == (0, "")
    assert out.splitlines()[-1] == "started, at most 4 move(s) in flight per SPU: follow it with `sc cluster rebalance --status`"
    await server.mirrored()
    assert await sc("cluster", "rebalance", "--status") == (
        0, "state: running (rebalance)\nmoves: 0 done of 2, 2 not started\n", ""
    )  # fmt: skip
    code, out, _ = await sc("cluster", "rebalance", "--status", "-o", "json")
    assert json.loads(out)["state"] == "running"
    assert await sc("cluster", "rebalance") == (
        1, "", "error: a rebalance is running (2 moves): wait until it is done (GET /v1/cluster/rebalance) or cancel it "
        "(DELETE /v1/cluster/rebalance) first\n",
    )  # fmt: skip
    assert await sc("cluster", "rebalance", "--cancel") == (
        0, "rebalance cancelled: moves in flight go back to where they were\n", ""
    )  # fmt: skip
    code, out, _ = await sc("cluster", "rebalance", "--cancel", "-o", "json")
    assert (code, json.loads(out)["error"]["code"]) == (1, "NotRunning")
    code, _, err = await sc("cluster", "rebalance", "--status", "--cancel")
    assert (code, err.splitlines()[-1]) == (2, "sc cluster rebalance: error: argument --cancel: not allowed with argument --status")
    code, _, err = await sc("cluster", "rebalance", "--max-moves-per-spu", "0")
    assert (code, err) == (1, "error: maxMovesPerSpu: must be from 1 to 10000, got 0\n")


async def test_spu_decommission_by_id_or_name(server: api_server.ApiServer, sc: Sc) -> None:
    await three_on_four(server)
    code, out, err = await sc("spu", "decommission", "0")
    assert (code, err) == (0, "")
    assert out.splitlines()[-1] == (
        "SPU 0 (spu-0) is decommissioned: 3 move(s) started; follow them with `sc cluster rebalance --status`, "
        "and delete it once `sc spu list` shows its decommission Done"
    )
    await server.mirrored()
    code, out, _ = await sc("spu", "list")
    assert out.splitlines()[1].split()[:6] == ["0", "spu-0", "Custom", "-", "Online", "-"]
    assert out.splitlines()[1].split()[6] == "InProgress"
    code, out, _ = await sc("spu", "decommission", "spu-9", "-o", "json")
    assert (code, json.loads(out)["error"]["code"]) == (1, "NotFound")
