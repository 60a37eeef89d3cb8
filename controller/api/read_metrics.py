"""The metrics of the public port's reads: the expensive-read gate, the list answers and the watch
streams, read at scrape time (registered with controller.metrics by the context that builds them).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from controller.api import admission, listing
from store import models

# Every label value the read metrics use, so each series exists from the start.
WATCH_PROTOCOLS = ("http", "websocket", "fluvio")
WATCH_DROP_REASONS = ("overflow", "stalled", "error")
LIST_SOURCES = ("cached", "shared", "built")
# What may be watched: each kind of object, and the SC's decisions (/v1/watch/events).
WATCH_KINDS = (*models.KINDS, "events")


class ReadsCollector(Collector):
    """The expensive-read gate, the list answers and the watch streams, read at scrape time."""

    def __init__(self, gate: admission.Gate, watchers: admission.Watchers, lists: listing.Lists) -> None:
        self.gate = gate
        self.watchers = watchers
        self.lists = lists

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        gate, watchers = self.gate, self.watchers
        running = GaugeMetricFamily("sc_expensive_requests_running", "Expensive reads (lists, placements, dry runs) running now")
        running.add_metric([], gate.running)
        yield running
        waiting = GaugeMetricFamily("sc_expensive_requests_waiting", "Expensive reads waiting for a slot")
        waiting.add_metric([], gate.waiting)
        yield waiting
        admitted = CounterMetricFamily("sc_expensive_requests", "Expensive reads admitted, by purpose", labels=["purpose"])
        refused = CounterMetricFamily(
            "sc_expensive_requests_refused", "Expensive reads refused (HTTP 429), by purpose", labels=["purpose"]
        )
        for purpose in admission.PURPOSES:
            admitted.add_metric([purpose], gate.admitted[purpose])
            refused.add_metric([purpose], gate.refused[purpose])
        yield admitted
        yield refused
        served = CounterMetricFamily(
            "sc_list_answers",
            "Whole-list answers (HTTP and Fluvio), by source: cached, shared with a concurrent identical list, built",
            labels=["source"],
        )
        for source in LIST_SOURCES:
            served.add_metric([source], self.lists.answers.served[source])
        yield served
        cached = GaugeMetricFamily("sc_list_cache_bytes", "Bytes of encoded list answers kept for identical lists")
        cached.add_metric([], self.lists.answers.bytes)
        yield cached
        list_encodings = CounterMetricFamily("sc_list_encodings", "Objects encoded for HTTP list answers, by kind", labels=["kind"])
        watch_encodings = CounterMetricFamily(
            "sc_watch_encodings", "Objects encoded for HTTP watch streams (once per change, whatever the watchers), by kind", labels=["kind"]
        )
        for kind in models.KINDS:
            list_encodings.add_metric([kind], self.lists.encodings[kind])
            watch_encodings.add_metric([kind], watchers.encodings[kind])
        yield list_encodings
        yield watch_encodings
        open_now = GaugeMetricFamily("sc_watchers", "Watch streams open now, by protocol and kind", labels=["protocol", "kind"])
        refused_watchers = CounterMetricFamily(
            "sc_watchers_refused", "Watch streams refused at a limit (max_watchers, max_watchers_per_address)", labels=["protocol"]
        )
        for protocol in WATCH_PROTOCOLS:
            for kind in WATCH_KINDS:
                open_now.add_metric([protocol, kind], watchers.open[(protocol, kind)])
            refused_watchers.add_metric([protocol], watchers.refused[protocol])
        yield open_now
        yield refused_watchers
        dropped = CounterMetricFamily(
            "sc_watchers_dropped",
            "Watch streams the SC ended: the client fell behind (overflow), took nothing (stalled), or the feed failed (error)",
            labels=["protocol", "reason"],
        )
        for protocol in WATCH_PROTOCOLS:
            for reason in WATCH_DROP_REASONS:
                dropped.add_metric([protocol, reason], watchers.dropped[(protocol, reason)])
        yield dropped
