"""kv.RequestSize counts a request exactly as etcd receives it: checked against the encoded messages
the etcd backend sends (pure: no connection is made)."""

from __future__ import annotations

import pytest
from etcd3aio import _protobuf as etcdpb

from store import etcd, kv

PREFIXES = ["/sc/", "/sc-test/" + "p" * 200 + "/"]
VALUE_LENGTHS = [0, 1, 127, 128, 16_383, 16_384, 2_097_151, 2_097_152]
REVISIONS = [0, 1, 127, 128, 2**35]


def encoded(prefix: str, compares: list[kv.Compare], operations: list[kv.Operation]) -> int:
    """The size of the TxnRequest the etcd backend builds for this transaction."""
    request = etcdpb.TxnRequest(
        compare=[
            etcdpb.Compare(result=etcd._EQUAL, target=etcd._MOD, key=(prefix + compare.key).encode(), mod_revision=compare.mod_revision)
            for compare in compares
        ],
        success=[etcd._request_op((prefix + operation.key).encode(), operation) for operation in operations],
    )
    return request.ByteSize()


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("value_length", VALUE_LENGTHS)
def test_a_put_with_its_compare_counts_as_encoded(prefix: str, value_length: int) -> None:
    size = kv.RequestSize(prefix, kv.DEFAULT_MAX_REQUEST_BYTES)
    for revision in REVISIONS:
        compares = [kv.Compare("topics/orders", revision)]
        operations: list[kv.Operation] = [kv.Put("topics/orders", b"x" * value_length)]
        assert size.txn_bytes(compares, operations) == encoded(prefix, compares, operations)


@pytest.mark.parametrize("prefix", PREFIXES)
def test_a_mixed_transaction_counts_as_encoded(prefix: str) -> None:
    size = kv.RequestSize(prefix, kv.DEFAULT_MAX_REQUEST_BYTES)
    compares = [kv.Compare(f"partitions/t-{index}", index * 1000) for index in range(40)]
    operations: list[kv.Operation] = [kv.Put(f"partitions/t-{index}", b"v" * index * 37) for index in range(60)]
    operations += [kv.Delete(f"partitions/gone-{index}") for index in range(60)]
    operations.append(kv.Put("topics/é-unicode", "é".encode() * 300))
    assert size.txn_bytes(compares, operations) == encoded(prefix, compares, operations)
    assert size.txn_bytes([], []) == encoded(prefix, [], []) == 0


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("value_length", VALUE_LENGTHS)
def test_a_create_counts_as_the_group_commit_encodes_it(prefix: str, value_length: int) -> None:
    size = kv.RequestSize(prefix, kv.DEFAULT_MAX_REQUEST_BYTES)
    op = etcd._create_op((prefix + "topics/orders").encode(), b"x" * value_length)
    assert size.create_bytes("topics/orders", value_length) == etcdpb.TxnRequest(success=[op]).ByteSize()


@pytest.mark.parametrize("prefix", PREFIXES)
def test_a_guarded_group_commit_counts_as_encoded(prefix: str) -> None:
    """Creates sharing one transaction under guards (the active SC's fence): each create, plus each
    guard's compare and the read-back of its key."""
    size = kv.RequestSize(prefix, kv.DEFAULT_MAX_REQUEST_BYTES)
    for revision in REVISIONS:
        guards = [kv.Compare("meta/active-sc", revision), kv.Compare("meta/other", 0)]
        creates = [(f"topics/t-{index}", index * 1000) for index in range(5)]
        ops = [etcd._create_op((prefix + key).encode(), b"x" * length) for key, length in creates]
        expected = size.guards_bytes(guards) + sum(size.create_bytes(key, length) for key, length in creates)
        assert expected == etcd._group_commit(prefix.encode(), guards, ops).ByteSize()
        assert size.guards_bytes([]) == 0


def test_the_check_refuses_one_byte_above_the_budget() -> None:
    size = kv.RequestSize("/sc/", 10_000)
    assert size.budget == 10_000 - kv.REQUEST_ENVELOPE_BYTES
    fitting = next(length for length in range(10_000, 0, -1) if size.txn_bytes([], [kv.Put("k", b"x" * length)]) <= size.budget)
    size.check([], [kv.Put("k", b"x" * fitting)])
    with pytest.raises(kv.TooLarge) as raised:
        size.check([], [kv.Put("k", b"x" * (fitting + 1))])
    assert (raised.value.size, raised.value.limit) == (size.budget + 1, 10_000)


@pytest.mark.parametrize("prefix", PREFIXES)
def test_the_batching_bound_is_never_below_the_exact_count(prefix: str) -> None:
    size = kv.RequestSize(prefix, kv.DEFAULT_MAX_REQUEST_BYTES)
    for value_length in VALUE_LENGTHS:
        for revision in REVISIONS:
            for key in ("k", "partitions/" + "p" * 300 + "-99999", "topics/é"):
                exact = size.compare_bytes(key, revision) + size.put_bytes(key, value_length)
                bound = size.writes_bound(1, len(key.encode()), value_length)
                assert exact <= bound <= exact + 2 * 49, (key, value_length, revision)
                assert size.delete_bytes(key) + size.compare_bytes(key, revision) <= size.writes_bound(1, len(key.encode()), 0)


@pytest.mark.parametrize("prefix", PREFIXES)
def test_the_checks_quick_bound_is_never_below_the_exact_count(prefix: str) -> None:
    """check() counts exactly only when its quick bound is over the budget: a bound below the exact
    size would let a too-large transaction through."""
    size = kv.RequestSize(prefix, kv.DEFAULT_MAX_REQUEST_BYTES)
    keys = ("k", "partitions/" + "p" * 300 + "-99999", "topics/é", "topics/" + "本" * 700)
    for value_length in VALUE_LENGTHS:
        for revision in (*REVISIONS, 2**63 - 1):
            for key in keys:
                compares = [kv.Compare(key, revision)]
                for operations in ([kv.Put(key, b"x" * value_length)], [kv.Delete(key)], []):
                    exact = size.txn_bytes(compares, operations)
                    assert exact <= size.bound(compares, operations), (key, value_length, revision, operations)
                    assert size.txn_bytes([], operations) <= size.bound([], operations)
    mixed_compares = [kv.Compare(f"partitions/t-{index}", index * 10**9) for index in range(128)]
    mixed: list[kv.Operation] = [kv.Put(f"partitions/t-{index}", b"v" * index * 97) for index in range(64)]
    mixed += [kv.Delete(f"topics/gone-{'é' * index}") for index in range(64)]
    assert size.txn_bytes(mixed_compares, mixed) <= size.bound(mixed_compares, mixed)


def test_the_check_counts_exactly_when_the_bound_is_over_the_budget() -> None:
    """A transaction that fits though its bound does not passes; one a byte over is refused with its
    exact size."""
    size = kv.RequestSize("/sc/", 10_000)
    compares = [kv.Compare(f"k{index}", 0) for index in range(40)]
    def puts(length: int) -> list[kv.Operation]:
        return [kv.Put(f"k{index}", b"x" * length) for index in range(40)]
    fitting = max(length for length in range(300) if size.txn_bytes(compares, puts(length)) <= size.budget)
    assert size.bound(compares, puts(fitting)) > size.budget  # the exact count decides
    size.check(compares, puts(fitting))
    with pytest.raises(kv.TooLarge) as raised:
        size.check(compares, puts(fitting + 1))
    assert raised.value.size == size.txn_bytes(compares, puts(fitting + 1)) > size.budget
