"""The live page (/ui) in a real headless Chromium, on real processes: an SC (`sc run`, memory store,
credentials required) and simulator SPUs (`sc spu run`) in two racks. The page is logged into with a
read token, an SPU is killed (SIGKILL), and the DOM must show it Offline with its leaderships moved
within 2 s; then the page is used with the keyboard and at a phone's width. A second SC holds 10,000
partitions, and how long the page takes to show them is printed (not asserted).
Screenshots: test-artifacts/browser/."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests

from store import embedded_etcd
from tests.functional.test_deploy import wait_for
from tests.fixtures import processes
from tests.fixtures.browser import DESKTOP, PHONE, browser, resize, screenshot, script_errors  # noqa: F401 (fixture)

READ_TOKEN = "live-page-reader-0123456789"
ADMIN_TOKEN = "live-page-admin-0123456789"
RACKS = {0: "r1", 1: "r1", 2: "r2", 3: "r2"}
# The requirement: a killed SPU shows Offline, its leaderships moved, within this many seconds. How
# long it took is printed, not asserted (a headless Chromium, an SC and 4 SPUs share the machine
# with another test); what is asserted is how: the SC noticed the closed connection at once (no
# heartbeat timeout), and the page was told by its streams.
FAILOVER_SHOWN_SECONDS = 2.0
# Seconds the test waits for what the page shows: patience, far beyond what it takes.
PATIENCE = 30


@dataclass
class Cluster:
    work: Path
    public_port: int
    private_port: int
    sc: subprocess.Popen[bytes] | None = None
    spus: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.public_port}"

    def _spawn(self, args: list[str], log_name: str) -> subprocess.Popen[bytes]:
        return processes.spawn_cli(args, self.work / log_name)

    def start_sc(self) -> None:
        tokens = self.work / "tokens"
        tokens.write_text(f"reader read {READ_TOKEN}\nops admin {ADMIN_TOKEN}\n")
        self.sc = self._spawn(
            [
                "run", "--store", "memory", "--no-history", "--bind-host", "127.0.0.1",
                "--public-port", str(self.public_port), "--private-port", str(self.private_port),
                "--auth-tokens", str(tokens), "--spu-heartbeat-timeout", "2", "--log-format", "json", "--log-level", "warning",
            ],
            "sc.log",
        )
        wait_for(lambda: self.healthy(), 30, "the SC to start")

    def healthy(self) -> bool:
        return answers(f"{self.url}/healthz")

    def start_spu(self, spu_id: int) -> None:
        self.spus[spu_id] = self._spawn(
            [
                "spu", "run", "--id", str(spu_id), "--sc-private", f"127.0.0.1:{self.private_port}",
                "--append-interval", "0.5", "--append-records", "5", "--log-format", "json", "--log-level", "warning",
            ],
            f"spu-{spu_id}.log",
        )

    def call(self, method: str, path: str, body: Any = None) -> Any:
        answer = requests.request(method, f"{self.url}{path}", json=body, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=60)
        assert answer.status_code < 300, answer.text
        return answer.json()

    def register_spus(self, racks: dict[int, str]) -> None:
        ports = embedded_etcd.free_ports(2 * len(racks))
        for index, (spu_id, rack) in enumerate(racks.items()):
            spec = {
                "id": spu_id, "rack": rack, "publicEndpoint": {"host": "127.0.0.1", "port": ports[2 * index]},
                "privateEndpoint": {"host": "127.0.0.1", "port": ports[2 * index + 1]},
            }
            self.call("POST", "/v1/spus", {"name": f"spu-{spu_id}", "spec": spec})

    def stop(self) -> None:
        processes.stop_all([*self.spus.values(), *([self.sc] if self.sc is not None else [])])


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    public_port, private_port = embedded_etcd.free_ports(2)
    running = Cluster(tmp_path, public_port, private_port)
    try:
        running.start_sc()
        yield running
    finally:
        running.stop()


def answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=2).status_code == 200
    except requests.ConnectionError:
        return False


def settled(cluster: Cluster, partitions: int) -> bool:
    found = cluster.call("GET", "/v1/partitions")
    return len(found) == partitions and all(
        p["status"]["resolution"] == "Online" and len(p["status"]["isr"] or p["spec"]["replicas"]) == len(p["spec"]["replicas"])
        for p in found
    )


# ---------------------------------------------------------------------------- in the browser


def dom(driver: Any, script: str) -> Any:
    return driver.execute_script(script)


CARDS = """return Array.from(document.querySelectorAll('[data-spu-id]')).map(card => ({
    id: Number(card.dataset.spuId), status: card.dataset.status, leaders: Number(card.dataset.leaders),
    replicas: Number(card.dataset.replicas), rack: card.closest('[data-rack]').dataset.rack,
    leaderBand: card.dataset.leaderBand, replicaBand: card.dataset.replicaBand}))"""
RISK = """return Object.fromEntries(Array.from(document.querySelectorAll('#risk li[data-key]')).map(li => [li.dataset.key, Number(li.dataset.count)]))"""


def band(count: int, mean: float) -> str:
    """Kafka UI's skew bands: amber from 10% off the mean, red from 20%."""
    skew = abs(count - mean) / mean * 100 if mean else 0.0
    return "red" if skew >= 20 else "amber" if skew >= 10 else "ok"


def expected_risk(cluster: Cluster) -> dict[str, int]:
    """For each rack and SPU, the online partitions whose live in-sync replicas are all there (from the API)."""
    spus = cluster.call("GET", "/v1/spus")
    online = {spu["spec"]["id"] for spu in spus if spu["status"]["resolution"] == "Online"}
    rack_of = {spu["spec"]["id"]: spu["spec"]["rack"] for spu in spus}
    risk = {f"rack:{rack}": 0 for rack in set(rack_of.values())}
    for partition in cluster.call("GET", "/v1/partitions"):
        status = partition["status"]
        if status["resolution"] != "Online":
            continue
        in_sync = partition["spec"]["replicas"] if status["partitionEpoch"] == 0 else status["isr"]
        live = [spu_id for spu_id in in_sync if spu_id in online]
        if live and len({rack_of[spu_id] for spu_id in live}) == 1:
            risk[f"rack:{rack_of[live[0]]}"] += 1
        if len(live) == 1:
            risk[f"spu:{live[0]}"] = risk.get(f"spu:{live[0]}", 0) + 1
    return risk


def header(driver: Any) -> dict[str, str]:
    ids = ("spus-online", "spus-total", "partitions-total", "partitions-online", "partitions-under-replicated", "partitions-leaderless", "topics-total")
    return {name: driver.find_element("id", name).text for name in ids}


def test_a_killed_spu_shows_offline_with_its_leaderships_moved_as_the_sc_decides(browser: Any, cluster: Cluster) -> None:  # noqa: F811
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    cluster.register_spus(RACKS)
    for spu_id in RACKS:
        cluster.start_spu(spu_id)
    wait_for(lambda: all(s["status"]["resolution"] == "Online" for s in cluster.call("GET", "/v1/spus")), 30, "4 SPUs online")
    cluster.call("POST", "/v1/topics", {"name": "orders", "spec": {"partitions": 12, "replicationFactor": 2}})
    cluster.call("POST", "/v1/topics", {"name": "payments", "spec": {"partitions": 4, "replicationFactor": 3}})
    wait_for(lambda: settled(cluster, 16), 30, "16 partitions online and in sync")

    # The page asks for a token, and says so when it is refused.
    browser.get(f"{cluster.url}/ui")
    WebDriverWait(browser, 10).until(lambda d: d.find_element("id", "login").is_displayed())
    token_field = browser.find_element("id", "token")
    assert browser.switch_to.active_element == token_field  # the page puts the keyboard there
    token_field.send_keys("not-a-token-of-this-sc\n")
    WebDriverWait(browser, 5).until(lambda d: "the bearer token is not valid" in d.find_element("id", "login-error").text)
    screenshot(browser, "0-token-refused-1280x800")
    token_field.send_keys(READ_TOKEN + "\n")
    WebDriverWait(browser, 20).until(lambda d: d.find_element("tag name", "body").get_attribute("data-synced") == "true")
    WebDriverWait(browser, 5).until(lambda d: sorted(card["status"] for card in dom(d, CARDS)) == ["Online"] * 4)
    cards = {card["id"]: card for card in dom(browser, CARDS)}
    partitions = cluster.call("GET", "/v1/partitions")
    leaders = {p["name"]: p["spec"]["leader"] for p in partitions}
    assert {spu_id: (card["rack"], card["leaders"], card["replicas"]) for spu_id, card in cards.items()} == {
        spu_id: (RACKS[spu_id], list(leaders.values()).count(spu_id), sum(spu_id in p["spec"]["replicas"] for p in partitions))
        for spu_id in RACKS
    }
    expected = {
        "spus-online": "4", "spus-total": "4", "partitions-total": "16", "partitions-online": "16",
        "partitions-under-replicated": "0", "partitions-leaderless": "0", "topics-total": "2",
    }
    # The cluster was settled a moment ago, but on a loaded machine a follower may lag behind its
    # leader's lag time meanwhile (shown under-replicated) and catch up again: the page follows.
    with contextlib.suppress(TimeoutException):
        WebDriverWait(browser, 20, poll_frequency=0.1).until(lambda d: header(d) == expected)
    assert header(browser) == expected
    # The SC panel shows the active SC (GET /v1/cluster); the rebalance panel, that no run is going on.
    WebDriverWait(browser, 5).until(lambda d: d.find_element("css selector", "#sc-panel [data-sc]").get_attribute("data-sc") == "leader")
    sc_panel = browser.find_element("css selector", "#sc-panel")
    assert "Standbys: none" in sc_panel.text and "(leader)" in sc_panel.text, sc_panel.text
    assert browser.find_element("css selector", "#rebalance-status [data-rebalance]").get_attribute("data-rebalance") == "idle"
    screenshot(browser, "1-cluster-1280x800")

    victim = max(RACKS, key=lambda spu_id: (cards[spu_id]["leaders"], -spu_id))
    led = sorted(name for name, leader in leaders.items() if leader == victim)
    assert led
    killed_at = time.monotonic()
    cluster.spus[victim].send_signal(signal.SIGKILL)
    cluster.spus[victim].wait(10)

    def failed_over(driver: Any) -> bool:
        now = {card["id"]: card for card in dom(driver, CARDS)}
        return (
            now[victim]["status"] == "Offline"
            and now[victim]["leaders"] == 0
            and sum(card["leaders"] for card in now.values()) == 16
            and driver.find_element("id", "partitions-leaderless").text == "0"
        )

    WebDriverWait(browser, PATIENCE, poll_frequency=0.05).until(failed_over)
    shown_after = time.monotonic() - killed_at
    print(f"\nlive page: SPU {victim} shown Offline, its leaderships moved, {shown_after:.2f} s after its SIGKILL (requirement: {FAILOVER_SHOWN_SECONDS} s)")
    # At once, not after 2 s of silence: the SC dropped nobody for a heartbeat timeout.
    metrics = requests.get(f"{cluster.url}/metrics", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=60).text
    assert "sc_spu_heartbeat_timeouts_total 0.0" in metrics.splitlines(), [line for line in metrics.splitlines() if "heartbeat" in line]
    assert header(browser)["spus-online"] == "3"
    cards = {card["id"]: card for card in dom(browser, CARDS)}
    assert {spu_id: card["leaderBand"] for spu_id, card in cards.items()} == {
        spu_id: band(card["leaders"], 16 / 4) for spu_id, card in cards.items()
    }
    assert cards[victim]["leaderBand"] == "red"
    # What losing a rack or an SPU would take offline, now that one SPU is gone (the API's state
    # settles after the election: the page must agree with it once it has).
    WebDriverWait(browser, 5).until(lambda d: dom(d, RISK) == expected_risk(cluster))
    assert any(count > 0 for count in dom(browser, RISK).values())
    # The decisions feed says why each leadership moved.
    elected = "return Array.from(document.querySelectorAll('#decisions li[data-verb=elect][data-cause=spu-offline]')).map(li => li.dataset.name)"
    WebDriverWait(browser, PATIENCE).until(lambda d: set(led) <= set(dom(d, elected)))
    reasons = dom(browser, "return Array.from(document.querySelectorAll('#decisions li[data-verb=elect] .reason')).map(p => p.textContent)")
    assert any(f"SPU {victim} went offline" in reason for reason in reasons), reasons
    screenshot(browser, "2-spu-killed-1280x800")

    # With the keyboard: filter to one topic, open it, and read its partitions' leaders.
    topic = led[0].rpartition("-")[0]
    topic_filter = browser.find_element("id", "topic-filter")
    topic_filter.send_keys(topic)
    WebDriverWait(browser, 10).until(lambda d: [row.get_attribute("data-topic") for row in d.find_elements("css selector", "#topic-rows tr[data-topic]")] == [topic])
    topic_filter.send_keys(Keys.TAB)  # the "only with problems" box, then the topic's own button
    browser.switch_to.active_element.send_keys(Keys.TAB)
    opened = browser.switch_to.active_element
    assert opened.get_attribute("data-key") == f"topic:{topic}"
    opened.send_keys(Keys.ENTER)
    rows = "return Object.fromEntries(Array.from(document.querySelectorAll('tr[data-partition]')).map(tr => [tr.dataset.partition, Number(tr.dataset.leader)]))"
    WebDriverWait(browser, 10).until(lambda d: len(dom(d, rows)) > 0)
    shown = dom(browser, rows)
    now = {p["name"]: p["spec"]["leader"] for p in cluster.call("GET", f"/v1/partitions?topic={topic}")}
    assert shown == now
    assert all(shown[name] != victim for name in led if name in shown)
    # The focus stays on the topic's button while the page redraws.
    assert browser.switch_to.active_element.get_attribute("data-key") == f"topic:{topic}"
    screenshot(browser, "3-topic-open-1280x800")

    resize(browser, *PHONE)
    try:
        topic_filter.clear()
        time.sleep(0.3)  # a picture for people, of a page already drawn
        assert dom(browser, "return document.documentElement.scrollWidth") <= PHONE[0]
        screenshot(browser, "4-phone-390x844-table")
        browser.execute_script("window.scrollTo(0, 0)")
        screenshot(browser, "5-phone-390x844-top")
    finally:
        resize(browser, *DESKTOP)

    # The SC goes away: the page says so, and once an SC answers on the port again it shows that
    # SC's state (a fresh memory store: nothing), not what it had.
    assert cluster.sc is not None
    cluster.sc.send_signal(signal.SIGTERM)
    cluster.sc.wait(20)
    WebDriverWait(browser, 5).until(lambda d: d.find_element("id", "connection").get_attribute("data-live") == "false")
    cluster.start_sc()
    WebDriverWait(browser, 15).until(
        lambda d: d.find_element("id", "connection").get_attribute("data-live") == "true"
        and (header(d)["spus-total"], header(d)["partitions-total"]) == ("0", "0")
    )
    assert script_errors(browser) == []


def test_the_page_with_10000_partitions_loads_and_its_load_time_is_printed(browser: Any, cluster: Cluster) -> None:  # noqa: F811
    from selenium.webdriver.support.ui import WebDriverWait

    # SPUs registered but never started: the partitions exist (a manual assignment needs no live
    # SPU), leaderless, which is what the page must also show well.
    cluster.register_spus({spu_id: f"r{spu_id % 3}" for spu_id in range(6)})
    topics, per_topic = 10, 1000
    for number in range(topics):
        assignment = [{"id": index, "replicas": [(index + number) % 6, (index + number + 1) % 6]} for index in range(per_topic)]
        cluster.call("POST", "/v1/topics", {"name": f"load-{number}", "spec": {"replicaAssignment": assignment}})
    wait_for(lambda: len(cluster.call("GET", "/v1/partitions")) == topics * per_topic, 60, "10,000 partitions")

    browser.get(f"{cluster.url}/ui")
    browser.execute_script("sessionStorage.setItem('sc.token', arguments[0])", READ_TOKEN)
    started = time.monotonic()
    browser.get(f"{cluster.url}/ui")
    WebDriverWait(browser, 30).until(lambda d: d.find_element("tag name", "body").get_attribute("data-synced") == "true")
    waited = time.monotonic() - started
    loaded_ms = browser.execute_script("return window.scLoadedMs")
    assert header(browser)["partitions-total"] == "10000"
    assert len(browser.find_elements("css selector", "#topic-rows tr[data-topic]")) == topics
    timings = browser.execute_script("return window.scTimings")
    print(
        f"\nlive page with 10,000 partitions: drawn {loaded_ms:.0f} ms after navigation started ({waited:.2f} s from the test's get); "
        f"streams synced at (ms) {json.dumps(timings)}"
    )
    # Responsive with them: a filter redraws the table at once.
    browser.find_element("id", "topic-filter").send_keys("load-7")
    WebDriverWait(browser, 10).until(lambda d: len(d.find_elements("css selector", "#topic-rows tr[data-topic]")) == 1)
    screenshot(browser, "6-10000-partitions-1280x800")
    assert script_errors(browser) == []



def test_a_rebalance_is_planned_started_and_followed_on_the_page(browser: Any, cluster: Cluster) -> None:  # noqa: F811
    """Two SPUs join a cluster of four: the page's dry run shows the plan the API gives (moves
    against the lower bound), starting it needs no command line, and the panel follows the run to
    its end while the new SPUs' cards fill."""
    from selenium.webdriver.support.ui import WebDriverWait

    cluster.register_spus(RACKS)
    for spu_id in RACKS:
        cluster.start_spu(spu_id)
    wait_for(lambda: all(s["status"]["resolution"] == "Online" for s in cluster.call("GET", "/v1/spus")), 30, "4 SPUs online")
    cluster.call("POST", "/v1/topics", {"name": "orders", "spec": {"partitions": 12, "replicationFactor": 2}})
    wait_for(lambda: settled(cluster, 12), 30, "12 partitions online and in sync")
    joining = {4: "r1", 5: "r2"}
    cluster.register_spus(joining)
    for spu_id in joining:
        cluster.start_spu(spu_id)
    wait_for(lambda: [s["status"]["resolution"] for s in cluster.call("GET", "/v1/spus")] == ["Online"] * 6, 30, "6 SPUs online")
    expected = cluster.call("POST", "/v1/cluster/rebalance?dryRun=true")
    assert expected["replicaMoves"] == expected["lowerBound"] > 0, expected

    browser.get(f"{cluster.url}/ui")
    WebDriverWait(browser, 10).until(lambda d: d.find_element("id", "login").is_displayed())
    browser.find_element("id", "token").send_keys(ADMIN_TOKEN + "\n")
    WebDriverWait(browser, 20).until(lambda d: d.find_element("tag name", "body").get_attribute("data-synced") == "true")
    # Read in one script each time: the panel is redrawn as the run moves.
    status = """const shown = document.querySelector('#rebalance-status [data-rebalance]');
        const progress = document.querySelector('#rebalance-status progress');
        return shown && {state: shown.dataset.rebalance, text: shown.textContent,
                         progress: progress && [Number(progress.value), Number(progress.max)]}"""
    WebDriverWait(browser, 5).until(lambda d: (dom(d, status) or {}).get("state") == "idle")
    browser.find_element("id", "rebalance-plan").click()
    planned = """const plan = document.querySelector('#rebalance-plan-view [data-plan-moves]');
        return plan && {moves: Number(plan.dataset.planMoves), text: plan.textContent}"""
    WebDriverWait(browser, 5).until(lambda d: dom(d, planned))
    plan = dom(browser, planned)
    assert plan["moves"] == expected["replicaMoves"], plan
    assert f"(lower bound {expected['lowerBound']})" in plan["text"], plan
    screenshot(browser, "6-rebalance-planned-1280x800")

    browser.execute_script("window.confirm = () => true")  # the page asks before it moves replicas
    browser.find_element("id", "rebalance-start").click()
    total = expected["replicaMoves"]

    under_replicated: set[str] = set()

    def finished(driver: Any) -> bool:
        # A partition being moved has its old and new replicas: only fewer in sync than its
        # target makes it under-replicated (here none: no SPU fails).
        under_replicated.add(driver.find_element("id", "partitions-under-replicated").text)
        shown = dom(driver, status) or {}
        return shown.get("state") == "done" and f"{total} of {total} moves done" in shown.get("text", "")

    WebDriverWait(browser, 60, poll_frequency=0.1).until(finished)
    assert under_replicated == {"0"}, under_replicated
    assert dom(browser, status)["progress"] == [total, total]
    WebDriverWait(browser, 5).until(lambda d: all(card["replicas"] > 0 for card in dom(d, CARDS) if card["id"] in joining))
    assert cluster.call("GET", "/v1/cluster/rebalance")["state"] == "done"
    screenshot(browser, "7-rebalance-done-1280x800")
    assert script_errors(browser) == []


@pytest.mark.etcd
def test_the_sc_panel_shows_the_standby_and_follows_a_takeover(browser: Any, etcd_server: embedded_etcd.EmbeddedEtcd, tmp_path: Path) -> None:  # noqa: F811
    """Two SCs on one etcd; the page is served by the standby. The panel names the active SC, the
    standby with its address, and which this page's SC is; the leader is killed (SIGKILL) and the
    panel shows the standby leading with nobody else in line, told by the decision feed (no wait
    for the panel's own refresh). How long that took is printed."""
    from selenium.webdriver.support.ui import WebDriverWait

    from tests.fixtures.sc_run import ScRun

    ttl = 2
    prefix = f"/live-page-{tmp_path.name}/"
    common = ("--etcd-endpoints", etcd_server.client_url, "--key-prefix", prefix, "--active-sc-lease-ttl", str(ttl), "--log-level", "warning")
    first, second = (ScRun(tmp_path / name, None, *common) for name in ("sc-a", "sc-b"))
    try:
        for sc in (first, second):
            sc.start(logs_to_file=True)
            wait_for(lambda: answers(f"{sc.url}/healthz"), 30, f"{sc.data_dir.name} to start")
        leader_id = requests.get(f"{first.url}/v1/cluster", timeout=5).json()["self"]["id"]
        standby = requests.get(f"{second.url}/v1/cluster", timeout=5).json()["self"]
        assert standby["role"] == "standby", standby

        def panel(d: Any) -> dict[str, str]:
            """The panel's rows, read in one script: it is redrawn at any time, a row found first and read later may be gone."""
            return dict(dom(d, "return Array.from(document.querySelectorAll('#sc-panel [data-sc]')).map(row => [row.dataset.sc, row.innerText])"))

        browser.get(f"{second.url}/ui")
        WebDriverWait(browser, 20).until(lambda d: d.find_element("tag name", "body").get_attribute("data-synced") == "true")
        WebDriverWait(browser, 5).until(lambda d: panel(d).get("leader", "").startswith(f"Active: {leader_id}"))
        shown = panel(browser)
        assert shown["standbys"] == f"Standbys: {standby['id']} ({standby['address']})", shown
        assert shown["self"] == f"This page's SC: {standby['id']} (standby)", shown
        screenshot(browser, "8-sc-standby-1280x800")

        assert first.process is not None
        killed_at = time.monotonic()
        first.process.kill()
        first.process.wait()
        WebDriverWait(browser, ttl + 10).until(
            lambda d: panel(d).get("leader", "").startswith(f"Active: {standby['id']}")
            and panel(d).get("self") == f"This page's SC: {standby['id']} (leader)"
            and panel(d).get("standbys") == "Standbys: none"
        )
        shown_after = time.monotonic() - killed_at
        # The feed is drawn at most every DRAW_INTERVAL_MS, after the panel: waited for, not read at once.
        decisions = "return Array.from(document.querySelectorAll('#decisions li')).map(li => [li.dataset.verb, li.dataset.name, li.innerText])"
        WebDriverWait(browser, 5).until(
            lambda d: any(verb == "lead" and name == standby["id"] and f"after SC {leader_id}" in text for verb, name, text in dom(d, decisions)),
            message=f"no lead of SC {standby['id']} in the feed",
        )
        print(f"\nSC panel: the standby shown leading {shown_after:.2f} s after the leader was killed (lease TTL {ttl} s)")
        screenshot(browser, "9-sc-takeover-1280x800")
        assert script_errors(browser) == []
    finally:
        processes.stop_all([sc.process for sc in (first, second) if sc.process is not None])
