// The SC's live cluster page: keeps SPUs, topics, partitions and the SC's decisions from the watch
// streams (WebSockets on /v1/watch/...), and draws the page from them. It never polls a list route.
// Everything from the cluster is set as text (textContent), never parsed as HTML.
"use strict";

(() => {
  const TOKEN_KEY = "sc.token";
  const SUBPROTOCOL = "sc.v1";
  const OBJECT_KINDS = ["spus", "topics", "partitions"];
  const KINDS = [...OBJECT_KINDS, "events"];
  // Drawing is at most this often: a failover changes hundreds of partitions in a burst.
  const DRAW_INTERVAL_MS = 100;
  const TOPICS_PER_PAGE = 20;
  const PARTITIONS_PER_PAGE = 50;
  const DECISIONS_KEPT = 200;
  const RISK_NAMES_SHOWN = 8;
  const MOVES_SHOWN = 20;
  const CLUSTER_REFRESH_MS = 5000;
  const RECONNECT_MIN_MS = 250;
  const RECONNECT_MAX_MS = 5000;
  // Skew bands against the mean (Kafka UI's): amber from 10%, red from 20%.
  const AMBER = 10;
  const RED = 20;

  const state = {
    spus: new Map(),
    topics: new Map(),
    partitions: new Map(),
    decisions: [],
    synced: new Set(),
    firstSync: false,
    lastChange: null,
    cluster: { status: "loading" },
    rebalance: { status: "loading" },
    plan: null,
    topicPage: 0,
    openTopic: null,
    partitionPage: 0,
    moving: "",
  };
  const streams = new Map();
  // When each stream first synced and how long the first full drawing took, in ms after navigation
  // started (the browser test prints them).
  const timings = {};
  window.scTimings = timings;

  const $ = (id) => document.getElementById(id);

  // ------------------------------------------------------------------ credentials

  function token() {
    return sessionStorage.getItem(TOKEN_KEY) || "";
  }

  function base64url(text) {
    let binary = "";
    for (const byte of new TextEncoder().encode(text)) binary += String.fromCharCode(byte);
    return btoa(binary).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
  }

  function headers(extra) {
    const result = Object.assign({}, extra || {});
    if (token()) result.Authorization = "Bearer " + token();
    return result;
  }

  async function api(method, path, body) {
    const init = { method, headers: headers(body === undefined ? {} : { "Content-Type": "application/json" }), cache: "no-store" };
    if (body !== undefined) init.body = JSON.stringify(body);
    const response = await fetch(path, init);
    let answer = null;
    try {
      answer = await response.json();
    } catch (error) {
      answer = null;
    }
    if (response.status === 401) showLogin(errorMessage(answer, "the SC refused the credential"));
    return { status: response.status, body: answer };
  }

  function errorMessage(answer, fallback) {
    return answer && answer.error && answer.error.message ? answer.error.message : fallback;
  }

  function showLogin(message) {
    $("login").hidden = false;
    $("login-error").textContent = token() ? message : "";
    document.body.dataset.state = "login";
    for (const stream of streams.values()) stream.stop();
    streams.clear();
    setConnection("Needs a credential", false);
    $("token").focus();
  }

  async function start() {
    // /v1/cluster answers 401 without a valid credential, and tells whether this SC knows HA.
    await loadCluster();
    if (!$("login").hidden) return;
    document.body.dataset.state = "live";
    $("forget-token").hidden = !token();
    for (const kind of KINDS) {
      if (!streams.has(kind)) {
        const stream = new Stream(kind);
        streams.set(kind, stream);
        stream.open();
      }
    }
    loadRebalance();
  }

  // ------------------------------------------------------------------ watch streams

  class Stream {
    constructor(kind) {
      this.kind = kind;
      this.socket = null;
      this.retryMs = RECONNECT_MIN_MS;
      this.stopped = false;
      this.pending = null; // objects of a new snapshot, until its SYNC
    }

    open() {
      const url = new URL("/v1/watch/" + this.kind, location.href);
      url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
      const protocols = token() ? [SUBPROTOCOL, "bearer." + base64url(token())] : [SUBPROTOCOL];
      const socket = new WebSocket(url.href, protocols);
      this.socket = socket;
      this.pending = this.kind === "events" ? [] : new Map();
      // With the page's subprotocol a message holds a batch of events, one JSON per line.
      socket.onmessage = (message) => {
        for (const line of message.data.split("\n")) if (line) this.receive(JSON.parse(line));
      };
      socket.onclose = () => this.closed(socket);
    }

    stop() {
      this.stopped = true;
      if (this.socket) this.socket.close();
    }

    closed(socket) {
      if (socket !== this.socket || this.stopped) return;
      state.synced.delete(this.kind);
      setConnection("Reconnecting to the SC…", false);
      const wait = this.retryMs;
      this.retryMs = Math.min(this.retryMs * 2, RECONNECT_MAX_MS);
      setTimeout(async () => {
        if (this.stopped) return;
        // A refused credential and an SC that is away both close the socket: ask which it was.
        await loadCluster();
        if (!this.stopped && $("login").hidden) this.open();
      }, wait);
    }

    receive(event) {
      if (event.type === "SYNC") {
        if (this.kind === "events") {
          state.decisions = this.pending.slice(-DECISIONS_KEPT);
          drawDecisions(true);
        } else {
          state[this.kind] = this.pending;
        }
        this.pending = null;
        this.retryMs = RECONNECT_MIN_MS;
        if (!state.synced.has(this.kind) && !(this.kind in timings)) timings[this.kind] = Math.round(performance.now());
        state.synced.add(this.kind);
        if (state.synced.size === KINDS.length) loadCluster();
        changed();
        return;
      }
      if (this.kind === "events") {
        if (this.pending !== null) this.pending.push(event.object);
        else {
          addDecision(event.object);
          // Another SC leads, or none does: the SC panel asks /v1/cluster again at once.
          if (event.object && event.object.kind === "sc") loadCluster();
        }
        return;
      }
      const table = this.pending !== null ? this.pending : state[this.kind];
      if (event.type === "DELETED") table.delete(event.object.name);
      else table.set(event.object.name, event.object);
      if (this.pending === null) changed();
    }
  }

  function setConnection(text, live) {
    const element = $("connection");
    element.textContent = text;
    element.dataset.live = String(live);
  }

  // ------------------------------------------------------------------ drawing, at most every DRAW_INTERVAL_MS

  let drawTimer = null;
  let lastDraw = 0;

  function changed() {
    state.lastChange = new Date();
    if (drawTimer !== null) return;
    const wait = Math.max(0, lastDraw + DRAW_INTERVAL_MS - performance.now());
    drawTimer = setTimeout(() => {
      drawTimer = null;
      lastDraw = performance.now();
      draw();
    }, wait);
  }

  function draw() {
    // Until every kind of object has arrived once, a drawing would show a cluster that is not there.
    if (!state.firstSync && !OBJECT_KINDS.every((kind) => state.synced.has(kind))) return;
    const drawStarted = performance.now();
    const view = derive();
    // Rebuilt parts keep the keyboard focus on the element with the same key.
    const focused = document.activeElement && document.activeElement.dataset ? document.activeElement.dataset.key : undefined;
    drawHeader(view);
    drawRacks(view);
    drawTopics(view);
    drawRisk(view);
    drawMoves(view);
    if (focused) {
      const again = document.querySelector('[data-key="' + CSS.escape(focused) + '"]');
      if (again) again.focus();
    }
    const live = state.synced.size === KINDS.length;
    setConnection(live ? "Live · last change " + state.lastChange.toLocaleTimeString() : "Reconnecting to the SC…", live);
    if (live && !state.firstSync) {
      state.firstSync = true;
      // For the browser test: the page has drawn everything the streams gave it.
      window.scLoadedMs = performance.now();
      timings.firstDrawMs = Math.round(performance.now() - drawStarted);
      document.body.dataset.synced = "true";
    }
  }

  // ------------------------------------------------------------------ what the page shows, computed from the streams

  function inSync(partition) {
    const status = partition.status || {};
    return (status.partitionEpoch || 0) === 0 ? partition.spec.replicas : status.isr || [];
  }

  function derive() {
    const spus = [...state.spus.values()].sort((a, b) => a.spec.id - b.spec.id);
    const online = new Set(spus.filter((spu) => spuStatus(spu) === "Online").map((spu) => spu.spec.id));
    const rackOf = new Map(spus.map((spu) => [spu.spec.id, spu.spec.rack || null]));
    const perSpu = new Map(spus.map((spu) => [spu.spec.id, { replicas: 0, leaders: 0, movesIn: 0, movesOut: 0 }]));
    const topics = new Map();
    const counts = { total: 0, online: 0, underReplicated: 0, leaderless: 0 };
    const rackRisk = new Map();
    const spuRisk = new Map();
    const moving = [];
    for (const partition of state.partitions.values()) {
      const spec = partition.spec;
      const status = partition.status || {};
      const isOnline = status.resolution === "Online";
      const synced = inSync(partition);
      // A moving partition holds its old and new replicas at once: it is short only of its target's
      // count (KIP-455: the replicas being added do not make it under-replicated).
      const moveTarget = spec.reassignment && Array.isArray(spec.reassignment.target) ? spec.reassignment.target : null;
      const under = synced.length < (moveTarget ? moveTarget.length : spec.replicas.length);
      counts.total += 1;
      if (isOnline) counts.online += 1;
      else counts.leaderless += 1;
      if (under) counts.underReplicated += 1;
      for (const id of spec.replicas) {
        const load = perSpu.get(id);
        if (load) load.replicas += 1;
      }
      if (isOnline && perSpu.has(spec.leader)) perSpu.get(spec.leader).leaders += 1;
      const move = spec.reassignment;
      if (move && Array.isArray(move.target) && Array.isArray(move.previous)) {
        moving.push(partition.name);
        for (const id of move.target) if (!move.previous.includes(id) && perSpu.has(id)) perSpu.get(id).movesIn += 1;
        for (const id of move.previous) if (!move.target.includes(id) && perSpu.has(id)) perSpu.get(id).movesOut += 1;
      }
      const topicName = partition.name.slice(0, partition.name.lastIndexOf("-"));
      let topic = topics.get(topicName);
      if (!topic) {
        topic = { partitions: [], online: 0, underReplicated: 0, leaderless: 0 };
        topics.set(topicName, topic);
      }
      topic.partitions.push(partition);
      if (isOnline) topic.online += 1;
      else topic.leaderless += 1;
      if (under) topic.underReplicated += 1;
      // Rack-loss risk: only partitions online now can be taken offline.
      if (!isOnline) continue;
      const live = synced.filter((id) => online.has(id));
      if (live.length === 0) continue;
      const racks = new Set(live.map((id) => rackKey(rackOf.get(id))));
      if (racks.size === 1) push(rackRisk, [...racks][0], partition.name);
      if (live.length === 1) push(spuRisk, live[0], partition.name);
    }
    const spuCount = spus.length || 1;
    let replicaSum = 0;
    let leaderSum = 0;
    for (const load of perSpu.values()) {
      replicaSum += load.replicas;
      leaderSum += load.leaders;
    }
    return {
      spus, online, perSpu, topics, counts, rackRisk, spuRisk, moving,
      meanReplicas: replicaSum / spuCount,
      meanLeaders: leaderSum / spuCount,
    };
  }

  function push(map, key, value) {
    if (!map.has(key)) map.set(key, []);
    map.get(key).push(value);
  }

  function rackKey(rack) {
    return rack === null || rack === undefined ? "(no rack)" : rack;
  }

  function spuStatus(spu) {
    return (spu.status && spu.status.resolution) || "Init";
  }

  function skew(count, mean) {
    return mean > 0 ? ((count - mean) / mean) * 100 : 0;
  }

  function band(percent) {
    const size = Math.abs(percent);
    return size >= RED ? "red" : size >= AMBER ? "amber" : "ok";
  }

  function partitionOrder(a, b) {
    return partitionIndex(a) - partitionIndex(b);
  }

  function partitionIndex(partition) {
    return Number(partition.name.slice(partition.name.lastIndexOf("-") + 1));
  }

  // ------------------------------------------------------------------ DOM helpers (text only)

  function element(tag, attributes, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attributes || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (name === "className") node.className = value;
      else if (name.startsWith("data-") || name.startsWith("aria-") || name === "role" || name === "scope" || name === "colspan" || name === "type" || name === "title") {
        node.setAttribute(name, String(value));
      } else node[name] = value;
    }
    for (const child of children) {
      if (child === null || child === undefined || child === false) continue;
      node.append(typeof child === "string" || typeof child === "number" ? String(child) : child);
    }
    return node;
  }

  function replace(container, ...children) {
    container.replaceChildren(...children.filter((child) => child !== null && child !== undefined && child !== false));
  }

  function text(id, value) {
    const node = $(id);
    const shown = String(value);
    if (node.textContent !== shown) node.textContent = shown;
  }

  function ids(list) {
    return list && list.length ? list.join(", ") : "–";
  }

  function signed(percent) {
    const rounded = Math.round(percent);
    return (rounded > 0 ? "+" : "") + rounded + "%";
  }

  // ------------------------------------------------------------------ header

  function drawHeader(view) {
    text("spus-online", view.online.size);
    text("spus-total", view.spus.length);
    const offline = view.spus.filter((spu) => spuStatus(spu) !== "Online").map((spu) => spu.name);
    text("spus-note", offline.length ? "not online: " + offline.slice(0, RISK_NAMES_SHOWN).join(", ") + (offline.length > RISK_NAMES_SHOWN ? " and " + (offline.length - RISK_NAMES_SHOWN) + " more" : "") : "");
    $("spus-card").dataset.health = view.spus.length === 0 ? "unknown" : offline.length ? "warn" : "ok";
    const counts = view.counts;
    text("partitions-total", counts.total);
    text("partitions-online", counts.online);
    text("partitions-under-replicated", counts.underReplicated);
    text("partitions-leaderless", counts.leaderless);
    $("partitions-card").dataset.health = counts.leaderless ? "bad" : counts.underReplicated ? "warn" : "ok";
    const byResolution = new Map();
    for (const topic of state.topics.values()) {
      const resolution = (topic.status && topic.status.resolution) || "Init";
      byResolution.set(resolution, (byResolution.get(resolution) || 0) + 1);
    }
    text("topics-total", state.topics.size);
    replace(
      $("topics-by-resolution"),
      ...[...byResolution.entries()].sort().map(([resolution, count]) =>
        element("div", { "data-resolution": resolution }, element("dt", {}, resolution), element("dd", {}, count)),
      ),
    );
    const troubled = [...byResolution.keys()].some((resolution) => !["Provisioned", "Deleting"].includes(resolution));
    $("topics-card").dataset.health = troubled ? "warn" : "ok";
  }

  // ------------------------------------------------------------------ the SC panel (GET /v1/cluster, from the HA work)

  let clusterTimer = null;

  async function loadCluster() {
    clearTimeout(clusterTimer);
    clusterTimer = setTimeout(loadCluster, CLUSTER_REFRESH_MS);
    let answer;
    try {
      answer = await api("GET", "/v1/cluster");
    } catch (error) {
      state.cluster = { status: "unreachable" };
      drawCluster();
      return;
    }
    if (answer.status === 401) return;
    $("login").hidden = true;
    if (answer.status === 200) state.cluster = { status: "ok", body: answer.body };
    else if (answer.status === 404) state.cluster = { status: "absent" };
    else state.cluster = { status: "error", message: errorMessage(answer.body, "HTTP " + answer.status) };
    drawCluster();
  }

  // "since" as ISO 8601 text, or as seconds since the epoch.
  function since(value) {
    const at = typeof value === "number" ? new Date(value * 1000) : new Date(value);
    return Number.isNaN(at.getTime()) ? String(value) : at.toLocaleString();
  }

  function drawCluster() {
    const panel = $("sc-panel");
    const card = $("sc-card");
    const cluster = state.cluster;
    if (cluster.status === "absent") {
      card.dataset.health = "unknown";
      replace(panel, element("p", { className: "muted", "data-sc": "absent" }, "Roles are not available on this SC (it has no /v1/cluster)."));
      return;
    }
    if (cluster.status === "unreachable") {
      card.dataset.health = "bad";
      replace(panel, element("p", { className: "error", "data-sc": "unreachable" }, "The SC does not answer."));
      return;
    }
    if (cluster.status !== "ok") {
      card.dataset.health = "warn";
      replace(panel, element("p", { className: "error" }, cluster.message || "Loading…"));
      return;
    }
    const body = cluster.body || {};
    const self = body.self || {};
    const leader = body.leader;
    const standbys = Array.isArray(body.standbys) ? body.standbys : [];
    if (!leader) {
      card.dataset.health = "bad";
      replace(panel, element("p", { className: "alarm", "data-sc": "no-leader" }, "No active controller"),
        element("p", { className: "muted" }, "This SC: " + (self.id || "?") + " (" + (self.role || "?") + ")"));
      return;
    }
    card.dataset.health = "ok";
    replace(
      panel,
      element("p", { "data-sc": "leader" }, element("strong", {}, "Active: " + leader.id), " ", element("span", { className: "muted" }, leader.address || "")),
      element("p", { className: "muted" }, "since " + since(leader.since) + " · epoch " + leader.epoch),
      element("p", { className: "muted", "data-sc": "standbys" }, "Standbys: " + (standbys.length ? standbys.map((standby) => standby.id + (standby.address ? " (" + standby.address + ")" : "")).join(", ") : "none")),
      element("p", { className: "muted", "data-sc": "self" }, "This page's SC: " + (self.id || "?") + " (" + (self.role || "?") + ")"),
    );
  }

  // ------------------------------------------------------------------ racks of SPU cards

  function drawRacks(view) {
    const racks = new Map();
    for (const spu of view.spus) push(racks, rackKey(spu.spec.rack), spu);
    const columns = [...racks.entries()].sort(([a], [b]) => a.localeCompare(b)).map(([rack, spus]) =>
      element(
        "section",
        { className: "rack", "aria-label": "rack " + rack, "data-rack": rack },
        element("h3", {}, rack, " ", element("span", { className: "muted" }, "(" + spus.length + ")")),
        ...spus.map((spu) => spuCard(spu, view)),
      ),
    );
    if (!columns.length) columns.push(element("p", { className: "muted" }, "No SPU registered yet."));
    replace($("racks"), ...columns);
  }

  function spuCard(spu, view) {
    const id = spu.spec.id;
    const load = view.perSpu.get(id);
    const status = spuStatus(spu);
    const replicaSkew = skew(load.replicas, view.meanReplicas);
    const leaderSkew = skew(load.leaders, view.meanLeaders);
    const spuStatusBody = spu.status || {};
    const flags = [];
    if (spuStatusBody.decommission) flags.push(element("span", { className: "flag", "data-flag": "decommission" }, "decommission " + spuStatusBody.decommission));
    if (spu.spec.drain || spuStatusBody.drain) flags.push(element("span", { className: "flag", "data-flag": "drain" }, spuStatusBody.drain || "draining"));
    if (load.movesIn || load.movesOut) flags.push(element("span", { className: "flag", "data-flag": "moves" }, "moves: " + load.movesIn + " in, " + load.movesOut + " out"));
    return element(
      "article",
      {
        className: "spu",
        "data-spu-id": id,
        "data-status": status,
        "data-replicas": load.replicas,
        "data-leaders": load.leaders,
        "data-replica-band": band(replicaSkew),
        "data-leader-band": band(leaderSkew),
        "aria-label": "SPU " + id + ", " + status,
      },
      element("header", {}, element("strong", {}, spu.name), " ", element("span", { className: "muted" }, "#" + id),
        element("span", { className: "status", "data-status": status }, status)),
      element(
        "dl",
        { className: "load" },
        element("div", { "data-band": band(replicaSkew) }, element("dt", {}, "replicas"), element("dd", {}, load.replicas + " ", element("small", {}, signed(replicaSkew)))),
        element("div", { "data-band": band(leaderSkew) }, element("dt", {}, "leaders"), element("dd", {}, load.leaders + " ", element("small", {}, signed(leaderSkew)))),
      ),
      flags.length ? element("p", { className: "flags" }, ...flags) : null,
      spuStatusBody.reason ? element("p", { className: "muted small" }, spuStatusBody.reason) : null,
    );
  }

  // ------------------------------------------------------------------ topics and partitions

  function topicRows(view) {
    const filter = $("topic-filter").value.trim().toLowerCase();
    const problemsOnly = $("topic-problems").checked;
    const names = new Set([...state.topics.keys(), ...view.topics.keys()]);
    const rows = [];
    for (const name of [...names].sort()) {
      if (filter && !name.toLowerCase().includes(filter)) continue;
      const topic = state.topics.get(name);
      const load = view.topics.get(name) || { partitions: [], online: 0, underReplicated: 0, leaderless: 0 };
      const resolution = (topic && topic.status && topic.status.resolution) || (topic ? "Init" : "–");
      const problem = load.underReplicated > 0 || load.leaderless > 0 || (topic && resolution !== "Provisioned");
      if (problemsOnly && !problem) continue;
      rows.push({ name, topic, load, resolution, problem });
    }
    return rows;
  }

  function drawTopics(view) {
    const rows = topicRows(view);
    const pages = Math.max(1, Math.ceil(rows.length / TOPICS_PER_PAGE));
    state.topicPage = Math.min(state.topicPage, pages - 1);
    const shown = rows.slice(state.topicPage * TOPICS_PER_PAGE, (state.topicPage + 1) * TOPICS_PER_PAGE);
    const body = [];
    for (const row of shown) {
      const open = state.openTopic === row.name;
      const spec = row.topic ? row.topic.spec : {};
      const rf = spec.replicationFactor || (row.load.partitions[0] ? row.load.partitions[0].spec.replicas.length : "–");
      body.push(
        element(
          "tr",
          { "data-topic": row.name, className: row.problem ? "problem" : "" },
          element("th", { scope: "row" },
            element("button", { type: "button", className: "disclose", "aria-expanded": String(open), "data-key": "topic:" + row.name, onclick: () => toggleTopic(row.name) }, row.name)),
          element("td", { title: (row.topic && row.topic.status && row.topic.status.reason) || "" }, row.resolution),
          element("td", { className: "num" }, row.load.partitions.length),
          element("td", { className: "num" }, rf),
          element("td", { className: "num" }, row.load.online),
          element("td", { className: "num", "data-band": row.load.underReplicated ? "amber" : "ok" }, row.load.underReplicated),
          element("td", { className: "num", "data-band": row.load.leaderless ? "red" : "ok" }, row.load.leaderless),
        ),
      );
      if (open) body.push(element("tr", { className: "detail" }, element("td", { colspan: 7 }, partitionTable(row))));
    }
    if (!body.length) body.push(element("tr", {}, element("td", { colspan: 7, className: "muted" }, rows.length ? "" : "No topic matches.")));
    replace($("topic-rows"), ...body);
    text("topics-page", rows.length ? "Page " + (state.topicPage + 1) + " of " + pages + " · " + rows.length + " topics" : "");
    $("topics-previous").disabled = state.topicPage === 0;
    $("topics-next").disabled = state.topicPage >= pages - 1;
  }

  function toggleTopic(name) {
    state.openTopic = state.openTopic === name ? null : name;
    state.partitionPage = 0;
    draw();
  }

  function lag(partition) {
    const status = partition.status || {};
    const leader = status.leader;
    if (!leader || leader.leo < 0) return "–";
    const followers = (status.replicas || []).filter((replica) => replica.leo >= 0);
    if (!followers.length) return "–";
    return String(Math.max(...followers.map((replica) => Math.max(0, leader.leo - replica.leo))));
  }

  function partitionTable(row) {
    const partitions = row.load.partitions.slice().sort(partitionOrder);
    const pages = Math.max(1, Math.ceil(partitions.length / PARTITIONS_PER_PAGE));
    state.partitionPage = Math.min(state.partitionPage, pages - 1);
    const shown = partitions.slice(state.partitionPage * PARTITIONS_PER_PAGE, (state.partitionPage + 1) * PARTITIONS_PER_PAGE);
    const table = element(
      "table",
      { className: "partitions", "aria-label": "partitions of " + row.name },
      element("thead", {}, element("tr", {}, ...["Partition", "Status", "Leader", "Replicas", "In sync", "Epoch", "Lag", "Moving to"].map((title) => element("th", { scope: "col" }, title)))),
      element(
        "tbody",
        {},
        ...shown.map((partition) => {
          const status = partition.status || {};
          const synced = inSync(partition);
          return element(
            "tr",
            { "data-partition": partition.name, "data-leader": partition.spec.leader, "data-status": status.resolution || "Offline" },
            element("td", {}, partition.name),
            element("td", { "data-band": status.resolution === "Online" ? "ok" : "red" }, status.resolution || "Offline"),
            element("td", {}, partition.spec.leader),
            element("td", {}, ids(partition.spec.replicas)),
            element("td", { "data-band": synced.length < partition.spec.replicas.length ? "amber" : "ok" }, ids(synced)),
            element("td", { className: "num" }, status.leaderEpoch || 0),
            element("td", { className: "num" }, lag(partition)),
            element("td", {}, partition.spec.reassignment && Array.isArray(partition.spec.reassignment.target) ? ids(partition.spec.reassignment.target) : ""),
          );
        }),
      ),
    );
    const pager = element(
      "nav",
      { className: "pager", "aria-label": "partition pages of " + row.name },
      element("button", { type: "button", disabled: state.partitionPage === 0, "data-key": "partitions-previous", onclick: () => { state.partitionPage -= 1; draw(); } }, "Previous"),
      element("span", {}, "Partitions " + (state.partitionPage * PARTITIONS_PER_PAGE + 1) + "–" + (state.partitionPage * PARTITIONS_PER_PAGE + shown.length) + " of " + partitions.length),
      element("button", { type: "button", disabled: state.partitionPage >= pages - 1, "data-key": "partitions-next", onclick: () => { state.partitionPage += 1; draw(); } }, "Next"),
    );
    return element("div", { className: "table-wrap" }, table, pages > 1 ? pager : null);
  }

  // ------------------------------------------------------------------ rack-loss risk

  function drawRisk(view) {
    const racks = new Set(view.spus.map((spu) => rackKey(spu.spec.rack)));
    const parts = [];
    const rackList = element("ul", { className: "risk", "data-risk": "racks" });
    for (const rack of [...racks].sort()) {
      const names = view.rackRisk.get(rack) || [];
      rackList.append(riskItem("Losing rack " + rack, names, "rack:" + rack));
    }
    parts.push(element("h3", {}, "One rack"));
    if (racks.size < 2) parts.push(element("p", { className: "muted" }, "Every SPU is in one rack: losing it loses every partition."));
    else parts.push(rackList);
    const spuList = element("ul", { className: "risk", "data-risk": "spus" });
    const atRisk = [...view.spuRisk.entries()].sort((a, b) => b[1].length - a[1].length);
    for (const [id, names] of atRisk) spuList.append(riskItem("Losing SPU " + id, names, "spu:" + id));
    parts.push(element("h3", {}, "One SPU"));
    parts.push(atRisk.length ? spuList : element("p", { className: "muted", "data-risk": "spus-none" }, "No partition depends on a single live in-sync SPU."));
    replace($("risk"), ...parts);
  }

  function riskItem(label, names, key) {
    const shown = names.slice(0, RISK_NAMES_SHOWN).join(", ") + (names.length > RISK_NAMES_SHOWN ? " and " + (names.length - RISK_NAMES_SHOWN) + " more" : "");
    return element(
      "li",
      { "data-key": key, "data-count": names.length, "data-band": names.length ? "red" : "ok" },
      element("strong", {}, label + ": " + (names.length ? names.length + " partition" + (names.length === 1 ? "" : "s") + " offline" : "nothing offline")),
      names.length ? element("span", { className: "muted small" }, " (" + shown + ")") : null,
    );
  }

  // ------------------------------------------------------------------ decisions

  function addDecision(decision) {
    state.decisions.push(decision);
    if (state.decisions.length > DECISIONS_KEPT) state.decisions.splice(0, state.decisions.length - DECISIONS_KEPT);
    drawDecisions(false);
  }

  let decisionsTimer = null;

  function drawDecisions(now) {
    if (!now) {
      if (decisionsTimer === null) decisionsTimer = setTimeout(() => { decisionsTimer = null; drawDecisions(true); }, DRAW_INTERVAL_MS);
      return;
    }
    const filter = $("decision-filter").value.trim().toLowerCase();
    const electionsOnly = $("decision-elections").checked;
    const items = [];
    for (let index = state.decisions.length - 1; index >= 0; index -= 1) {
      const decision = state.decisions[index];
      if (electionsOnly && decision.verb !== "elect") continue;
      const words = [decision.verb, decision.kind, decision.name, decision.cause, decision.reason, decision.outcome, decision.detail].join(" ").toLowerCase();
      if (filter && !words.includes(filter)) continue;
      items.push(decisionItem(decision));
    }
    text("decisions-note", state.decisions.length ? "" : "No decision yet (this SC shows the ones it took since it started).");
    replace($("decisions"), ...items);
  }

  function decisionItem(decision) {
    const at = new Date(decision.time * 1000);
    return element(
      "li",
      { "data-verb": decision.verb, "data-cause": decision.cause || "", "data-outcome": decision.outcome, "data-name": decision.name },
      element("time", { dateTime: at.toISOString() }, at.toLocaleTimeString()),
      " ",
      element("span", { className: "verb" }, decision.verb),
      " ",
      element("span", { className: "target" }, decision.kind + "/" + decision.name),
      decision.cause ? element("span", { className: "cause" }, decision.cause) : null,
      decision.outcome !== "applied" ? element("span", { className: "failed" }, decision.outcome + (decision.detail ? ": " + decision.detail : "")) : null,
      element("p", { className: "reason" }, decision.reason),
    );
  }

  // ------------------------------------------------------------------ rebalance (GET/POST/DELETE /v1/cluster/rebalance)

  let rebalanceTimer = null;

  async function loadRebalance() {
    let answer;
    try {
      answer = await api("GET", "/v1/cluster/rebalance");
    } catch (error) {
      return;
    }
    if (answer.status === 200) state.rebalance = { status: "ok", body: answer.body };
    else if (answer.status === 404) state.rebalance = { status: "absent" };
    else if (answer.status !== 401) state.rebalance = { status: "error", message: errorMessage(answer.body, "HTTP " + answer.status) };
    drawRebalance();
  }

  // Progress is read again when the set of moving partitions changes (the watch says when), not on a clock.
  function drawMoves(view) {
    const moving = view.moving.sort().join(",");
    if (moving !== state.moving) {
      state.moving = moving;
      clearTimeout(rebalanceTimer);
      rebalanceTimer = setTimeout(loadRebalance, 300);
    }
  }

  function drawRebalance() {
    const status = $("rebalance-status");
    const rebalance = state.rebalance;
    const absent = rebalance.status === "absent";
    for (const id of ["rebalance-plan", "rebalance-start", "rebalance-cancel", "max-moves"]) $(id).disabled = absent;
    if (absent) {
      replace(status, element("p", { className: "muted", "data-rebalance": "absent" }, "Rebalance is not available on this SC (it has no /v1/cluster/rebalance)."));
      return;
    }
    if (rebalance.status === "error") {
      replace(status, element("p", { className: "error" }, rebalance.message));
      return;
    }
    if (rebalance.status !== "ok") return;
    const body = rebalance.body || {};
    const total = body.total || 0;
    const done = body.done || 0;
    const inFlight = Array.isArray(body.inFlight) ? body.inFlight : [];
    replace(
      status,
      element("p", { "data-rebalance": body.state || "idle" }, element("strong", {}, "State: " + (body.state || "idle")), total ? " · " + done + " of " + total + " moves done" : ""),
      total ? element("progress", { max: total, value: done, "aria-label": "rebalance progress" }) : null,
      inFlight.length ? element("p", { className: "muted small" }, "In flight: " + inFlight.slice(0, MOVES_SHOWN).join(", ") + (inFlight.length > MOVES_SHOWN ? " and " + (inFlight.length - MOVES_SHOWN) + " more" : "")) : null,
    );
    $("rebalance-cancel").disabled = body.state !== "running";
  }

  function rebalanceBody() {
    const value = $("max-moves").value.trim();
    return value ? { maxMovesPerSpu: Number(value) } : {};
  }

  async function rebalanceAction(method, query, confirmText) {
    if (confirmText && !window.confirm(confirmText)) return null;
    text("rebalance-message", "…");
    let answer;
    try {
      answer = await api(method, "/v1/cluster/rebalance" + query, method === "POST" ? rebalanceBody() : undefined);
    } catch (error) {
      text("rebalance-message", "The SC does not answer.");
      return null;
    }
    if (answer.status === 404) {
      state.rebalance = { status: "absent" };
      drawRebalance();
      text("rebalance-message", "");
      return null;
    }
    if (answer.status >= 400) {
      text("rebalance-message", errorMessage(answer.body, "HTTP " + answer.status));
      return null;
    }
    text("rebalance-message", "");
    return answer.body;
  }

  async function planRebalance() {
    const plan = await rebalanceAction("POST", "?dryRun=true");
    if (plan) {
      state.plan = plan;
      drawPlan();
    }
  }

  async function startRebalance() {
    const plan = await rebalanceAction("POST", "", "Start the rebalance? Replicas will move between SPUs.");
    if (plan) {
      state.plan = plan;
      drawPlan();
      loadRebalance();
    }
  }

  async function cancelRebalance() {
    if ((await rebalanceAction("DELETE", "", "Cancel the rebalance? Unfinished moves revert.")) !== null) loadRebalance();
  }

  function drawPlan() {
    const plan = state.plan;
    if (!plan) return;
    const moves = Array.isArray(plan.moves) ? plan.moves : [];
    const before = (plan.before && plan.before.replicasPerSpu) || {};
    const after = (plan.after && plan.after.replicasPerSpu) || {};
    const spuIds = [...new Set([...Object.keys(before), ...Object.keys(after)])].sort((a, b) => Number(a) - Number(b));
    replace(
      $("rebalance-plan-view"),
      element("p", { "data-plan-moves": plan.replicaMoves },
        element("strong", {}, plan.replicaMoves + " replica move" + (plan.replicaMoves === 1 ? "" : "s")), " (lower bound " + plan.lowerBound + ")"),
      spuIds.length
        ? element("table", { className: "plan", "aria-label": "replicas per SPU before and after" },
          element("thead", {}, element("tr", {}, element("th", { scope: "col" }, "SPU"), element("th", { scope: "col" }, "before"), element("th", { scope: "col" }, "after"))),
          element("tbody", {}, ...spuIds.map((id) => element("tr", {}, element("td", {}, id), element("td", { className: "num" }, before[id] ?? "–"), element("td", { className: "num" }, after[id] ?? "–")))))
        : null,
      moves.length
        ? element("ul", { className: "moves" }, ...moves.slice(0, MOVES_SHOWN).map((move) => element("li", {}, move.partition + ": " + ids(move.from) + " → " + ids(move.to))))
        : element("p", { className: "muted" }, "Nothing to move: the cluster is balanced."),
      moves.length > MOVES_SHOWN ? element("p", { className: "muted small" }, "and " + (moves.length - MOVES_SHOWN) + " more") : null,
    );
  }

  // ------------------------------------------------------------------ wiring

  function init() {
    $("login-form").addEventListener("submit", (event) => {
      event.preventDefault();
      sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
      $("token").value = "";
      start();
    });
    $("forget-token").addEventListener("click", () => {
      sessionStorage.removeItem(TOKEN_KEY);
      location.reload();
    });
    $("topic-filter").addEventListener("input", () => { state.topicPage = 0; draw(); });
    $("topic-problems").addEventListener("change", () => { state.topicPage = 0; draw(); });
    $("topics-previous").addEventListener("click", () => { state.topicPage = Math.max(0, state.topicPage - 1); draw(); });
    $("topics-next").addEventListener("click", () => { state.topicPage += 1; draw(); });
    $("decision-filter").addEventListener("input", () => drawDecisions(true));
    $("decision-elections").addEventListener("change", () => drawDecisions(true));
    $("rebalance-plan").addEventListener("click", planRebalance);
    $("rebalance-start").addEventListener("click", startRebalance);
    $("rebalance-cancel").addEventListener("click", cancelRebalance);
    start();
  }

  init();
})();
