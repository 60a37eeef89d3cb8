"""Which SPU holds an SPU id when SPUs written behind the SC's back share one (store/spu_index.py)."""

from __future__ import annotations

import pytest

from store import local, models, spu_index
from tests import builders

KEY = "meta/spu-ids/7"


def held_by(name: str, revision: int = 40) -> tuple[bytes, int]:
    return spu_index.encode_holder(name), revision


def entries(*spus: tuple[models.Spu, int]) -> dict[str, local.Entry[models.Spu]]:
    table: local.KindStore[models.Spu] = local.KindStore("spus")
    for spu, revision in spus:
        table.apply(spu, revision)
    return dict(table.view)


SHARED = (
    (builders.spu(1, name="one"), 3),
    (builders.spu(7, name="late"), 9),
    (builders.spu(7, name="early"), 5),
    (builders.spu(7, name="also-early"), 5),  # same revision (one transaction): by name
    (builders.spu(2, name="two"), 4),
)


@pytest.mark.parametrize(
    ("meta", "holder_of_7"),
    [
        ({}, "also-early"),  # no index key: the first created, then the first by name
        ({KEY: held_by("late")}, "late"),  # the index names it
        ({KEY: held_by("gone")}, "also-early"),  # the index names an SPU that is not there
        ({KEY: (b"written by hand", 40)}, "also-early"),
    ],
)
def test_the_index_names_the_holder_of_a_shared_id_else_the_first_created(
    meta: dict[str, tuple[bytes, int]], holder_of_7: str
) -> None:
    spus = entries(*SHARED)
    held = spu_index.holders(spus, meta.get)
    assert {spu_id: entry.name for spu_id, entry in held.items()} == {1: "one", 2: "two", 7: holder_of_7}
    assert list(held) == [1, 2, 7]
    holder = spu_index.holder(spus, meta.get, 7)
    assert holder is not None and holder.name == holder_of_7
    assert spu_index.holder(spus, meta.get, 1) is spus["one"]
    assert spu_index.holder(spus, meta.get, 3) is None


def test_the_index_key_and_its_value() -> None:
    assert spu_index.index_key(7) == KEY
    assert spu_index.decode_holder(spu_index.encode_holder("spu-7")) == "spu-7"
    nested = b"[" * 100_000 + b"]" * 100_000  # deeper than the JSON parser recurses
    assert [spu_index.decode_holder(value) for value in (b"", b"[]", b'{"spu": 7}', b'{"other": "x"}', nested)] == [None] * 5
