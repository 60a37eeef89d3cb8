"""List order kept current from the store, continue tokens (round trip and every way a token can be
wrong), and shared answers (one build for concurrent identical lists, kept within the byte budget)."""

from __future__ import annotations

import asyncio
import base64
import json
import random

import pytest
from hypothesis import given, strategies as st

from controller.api import admission, listing
from store import local, models
from tests import builders
from tests.builders import partition, topic


class Table:
    """A kind table the test writes, with revisions."""

    def __init__(self, kind: str) -> None:
        self.store = local.LocalStore()
        self.table = self.store[kind]
        self.table.resync([], 0)
        self.revision = 0

    def apply(self, *objs: models.AnyObject) -> None:
        for obj in objs:
            self.revision += 1
            self.table.apply(obj, self.revision)

    def delete(self, name: str) -> None:
        self.revision += 1
        self.table.delete(name, self.revision)


def expected_partitions(names: set[str]) -> list[str]:
    return sorted(names, key=lambda name: (name.rpartition("-")[0], int(name.rpartition("-")[2])))


def test_partitions_are_in_topic_then_index_order_after_every_kind_of_change() -> None:
    written = Table("partitions")
    index = listing.SortedNames(written.table)
    random_order = random.Random(7)
    names = [f"{name}-{number}" for name in ("b", "a", "a-b", "ab") for number in (0, 2, 10, 1)]
    random_order.shuffle(names)
    written.apply(*(partition(name) for name in names))
    assert index.current() == expected_partitions(set(names))
    live = set(names)
    for step in range(200):  # a few at a time: inserted and removed in place
        choice = random_order.random()
        if choice < 0.4:
            name = f"{random_order.choice(['a', 'b', 'c', 'a-b'])}-{random_order.randrange(30)}"
            written.apply(partition(name))
            live.add(name)
        elif choice < 0.8 and live:
            name = random_order.choice(sorted(live))
            written.delete(name)
            live.discard(name)
        else:  # a changed spec of an existing partition: no move
            if live:
                name = random_order.choice(sorted(live))
                written.apply(models.Partition.model_validate({"name": name, "spec": {"leader": 1, "replicas": [1]}}))
        if step % 3 == 0:
            assert index.current() == expected_partitions(live), step
    many = {f"z-{number}" for number in range(listing.RESORT_AT + 1)}  # past RESORT_AT: sorted again
    written.apply(*(partition(name) for name in many))
    assert index.current() == expected_partitions(live | many)
    written.table.resync([(partition("only-3"), 1000, 1000)], 1000)  # a full relist
    assert index.current() == ["only-3"]
    index.close()
    assert not written.table._listeners


def test_spus_sort_by_id_even_when_an_id_changes() -> None:
    written = Table("spus")
    index = listing.SortedNames(written.table)
    written.apply(builders.spu(5, name="e"), builders.spu(1, name="z"), builders.spu(3, name="a"))
    assert index.current() == ["z", "a", "e"]
    written.apply(builders.spu(0, name="e"))
    assert index.current() == ["e", "z", "a"]
    written.delete("z")
    assert index.current() == ["e", "a"]


# The keys a listing hands out: object names as the models allow them (ASCII, at most 63 characters).
NAMES = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?", fullmatch=True)


@given(
    kind_and_key=st.one_of(
        st.tuples(st.just("partitions"), st.tuples(NAMES, st.integers(0, models.MAX_PARTITIONS - 1))),
        st.tuples(st.just("spus"), st.tuples(st.integers(0, 2**31 - 1), NAMES)),
        st.tuples(st.sampled_from(["topics", "spu-groups"]), st.tuples(NAMES)),
    ),
    topic_name=st.one_of(st.none(), NAMES),
)
def test_tokens_round_trip(kind_and_key: tuple[str, tuple[object, ...]], topic_name: str | None) -> None:
    kind, key = kind_and_key
    token = listing.encode_token(kind, topic_name, key)
    assert token.isascii() and set(token) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
    assert listing.decode_token(token, kind, topic_name) == key


def forged(document: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(document).encode()).rstrip(b"=").decode()


NOT_OURS = "it is not a token this SC issued"


@pytest.mark.parametrize(
    ("token", "message"),
    [
        ("", f"{NOT_OURS} (it does not decode)"),
        ("!!!", f"{NOT_OURS} (it does not decode)"),
        ("a", f"{NOT_OURS} (it does not decode)"),
        ("x" * 600, f"{NOT_OURS} (too long, or not ASCII)"),
        ("é", f"{NOT_OURS} (too long, or not ASCII)"),
        (base64.urlsafe_b64encode(b"\xff\xfe").decode(), f"{NOT_OURS} (it does not decode)"),
        (forged([1, 2]), NOT_OURS),
        (forged({"v": 2, "kind": "partitions", "topic": None, "after": ["a", 1]}), NOT_OURS),
        (forged({"v": 1, "kind": "partitions", "topic": None, "after": ["a", 1], "x": 1}), NOT_OURS),
        (
            forged({"v": 1, "kind": "topics", "topic": None, "after": ["a"]}),
            "it was issued for a listing of topics, not of partitions: pass the same kind and filter",
        ),
        (
            forged({"v": 1, "kind": "partitions", "topic": "b", "after": ["b", 1]}),
            "it was issued for a listing of partitions of topic 'b', not of partitions: pass the same kind and filter",
        ),
        (forged({"v": 1, "kind": "partitions", "topic": None, "after": ["a"]}), f"{NOT_OURS} (its position is malformed)"),
        (forged({"v": 1, "kind": "partitions", "topic": None, "after": ["a", "1"]}), f"{NOT_OURS} (its position is malformed)"),
        (forged({"v": 1, "kind": "partitions", "topic": None, "after": ["a", True]}), f"{NOT_OURS} (its position is malformed)"),
        (forged({"v": 1, "kind": "partitions", "topic": None, "after": ["a", -1]}), f"{NOT_OURS} (its position is malformed)"),
        (forged({"v": 1, "kind": "partitions", "topic": None, "after": ["a", 1.5]}), f"{NOT_OURS} (its position is malformed)"),
        (forged({"v": 1, "kind": "partitions", "topic": None, "after": ["a" * 200, 1]}), f"{NOT_OURS} (its position is malformed)"),
        (forged({"v": 1, "kind": "partitions", "topic": None, "after": {"a": 1}}), f"{NOT_OURS} (its position is malformed)"),
    ],
)
def test_tokens_that_are_not_ours_or_not_for_this_listing_are_refused(token: str, message: str) -> None:
    with pytest.raises(listing.TokenError) as refused:
        listing.decode_token(token, "partitions", None)
    assert str(refused.value) == message


@given(st.text(max_size=700))
def test_any_text_as_a_token_decodes_or_is_refused(token: str) -> None:
    try:
        key = listing.decode_token(token, "partitions", None)
    except listing.TokenError:
        return
    assert isinstance(key, tuple) and len(key) == 2


@pytest.mark.looptime
async def test_concurrent_identical_lists_share_one_build_and_the_next_is_cached() -> None:
    written = Table("topics")
    written.apply(*(topic(f"t{number:02d}") for number in range(30)))
    gate = admission.Gate(limit=1, queue=100, wait=60)
    lists = listing.Lists(written.store, gate, cache_bytes=1 << 20)
    try:
        answers = await asyncio.gather(*(lists.whole("topics", None, lambda obj: obj, 0) for _ in range(20)))
        assert len({answer.body for answer in answers}) == 1
        assert [item["name"] for item in json.loads(answers[0].body)] == [f"t{number:02d}" for number in range(30)]
        assert answers[0].revision == written.revision
        assert (lists.encodings["topics"], lists.answers.served) == (30, {"built": 1, "shared": 19})
        again = await lists.whole("topics", None, lambda obj: obj, 0)
        assert again is answers[0] and lists.answers.served["cached"] == 1
        written.apply(topic("t99"))
        changed = await lists.whole("topics", None, lambda obj: obj, 0)
        assert json.loads(changed.body)[-1]["name"] == "t99"
        assert (lists.encodings["topics"], lists.answers.bytes) == (61, listing.kept_bytes(changed))  # the older one went
        # Shown differently (newer live offsets): the kept answer while it is young, then built again.
        assert await lists.whole("topics", None, lambda obj: obj, 1) is changed
        await asyncio.sleep(listing.SHOWN_REUSE_SECONDS)
        assert await lists.whole("topics", None, lambda obj: obj, 2) is not changed
        assert lists.encodings["topics"] == 92
        assert gate.admitted == {"list": 3}
    finally:
        await lists.close()


async def test_a_list_waiting_for_the_gate_is_not_answered_from_before_a_change() -> None:
    written = Table("topics")
    written.apply(topic("a"))
    gate = admission.Gate(limit=1, queue=100, wait=60)
    lists = listing.Lists(written.store, gate, cache_bytes=1 << 20)
    try:
        holder = gate.slot("placement")
        await holder.__aenter__()
        first = asyncio.create_task(lists.whole("topics", None, lambda obj: obj, 0))
        await asyncio.sleep(0)
        written.apply(topic("b"))  # before the build took its objects: a later list may share it
        second = asyncio.create_task(lists.whole("topics", None, lambda obj: obj, 0))
        await asyncio.sleep(0)
        await holder.__aexit__(None, None, None)
        assert [item["name"] for item in json.loads((await first).body)] == ["a", "b"]
        assert (await second) is (await first)
        written.apply(topic("c"))
        third = await lists.whole("topics", None, lambda obj: obj, 0)
        assert [item["name"] for item in json.loads(third.body)] == ["a", "b", "c"]
    finally:
        await lists.close()


async def test_answers_larger_than_the_budget_are_not_kept_and_old_ones_go_first() -> None:
    written = Table("partitions")
    written.apply(*(partition(f"{name}-0") for name in ("a", "b", "c")))
    lists = listing.Lists(written.store, admission.Gate(limit=1, queue=10, wait=60), cache_bytes=0)
    try:
        await lists.whole("partitions", None, lambda obj: obj, 0)
        assert lists.answers.bytes == 0
        assert (await lists.whole("partitions", None, lambda obj: obj, 0)).body.startswith(b"[")
        assert lists.answers.served == {"built": 2}
    finally:
        await lists.close()
    # Room for two of these answers, not three (each costs its body and listing.ENTRY_BYTES).
    lists = listing.Lists(written.store, admission.Gate(limit=1, queue=10, wait=60), cache_bytes=2 * listing.ENTRY_BYTES + 400)
    try:
        one = await lists.whole("partitions", "a", lambda obj: obj, 0)
        two = await lists.whole("partitions", "b", lambda obj: obj, 0)
        assert lists.answers.bytes == listing.kept_bytes(one) + listing.kept_bytes(two) <= lists.answers.limit_bytes
        three = await lists.whole("partitions", "c", lambda obj: obj, 0)  # the least recently used goes
        assert lists.answers.bytes == listing.kept_bytes(two) + listing.kept_bytes(three)
        await lists.whole("partitions", "b", lambda obj: obj, 0)
        assert lists.answers.served == {"built": 3, "cached": 1}
    finally:
        await lists.close()


async def test_pages_resume_after_the_last_key() -> None:
    written = Table("partitions")
    names = {f"{name}-{number}" for name in ("a", "b") for number in range(12)}
    written.apply(*(partition(name) for name in names))
    lists = listing.Lists(written.store, admission.Gate(limit=1, queue=10, wait=60), cache_bytes=0)
    try:
        seen: list[str] = []
        after = None
        while True:
            page = await lists.page("partitions", None, after, 5, lambda obj: obj)
            seen += [item["name"] for item in json.loads(page.body)]
            if page.next_after is None:
                break
            after = page.next_after
        assert seen == expected_partitions(names)
        only_b = await lists.page("partitions", "b", ("b", 9), 5, lambda obj: obj)
        assert ([item["name"] for item in json.loads(only_b.body)], only_b.next_after) == (["b-10", "b-11"], None)
        exact = await lists.page("partitions", "a", None, 12, lambda obj: obj)
        assert exact.next_after is None
    finally:
        await lists.close()


async def test_answers_of_many_filters_count_what_they_cost_not_only_their_bodies() -> None:
    """Each distinct `?topic=` keeps its answer: empty ones for topics deleted or never there cost
    ~560 bytes of memory each but were counted as 2, so some 33 million fitted in 64 MiB."""
    written = Table("partitions")
    written.apply(partition("a-0"))
    budget = 100 * listing.ENTRY_BYTES
    lists = listing.Lists(written.store, admission.Gate(limit=1, queue=10, wait=60), cache_bytes=budget)
    try:
        for number in range(1000):
            assert (await lists.whole("partitions", f"never-{number}", lambda obj: obj, 0)).body == b"[]"
        assert len(lists.answers._kept) <= 100 and lists.answers.bytes <= budget
    finally:
        await lists.close()
