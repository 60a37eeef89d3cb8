"""The stores the daemon wraps around its backend (the active-SC guard, the history's attribution)
are the backend to every reader: same limits, same prefix, same health, every method forwarded.
A wrapper that falls back on KVStore's defaults lies about the store it wraps. The guard also
reserves the bytes of its fence in every request, for whatever is wrapped around it too."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from store import active_sc, attribution, history, kv, memory

LIMIT = 600_000  # not the default: a wrapper reporting the default is caught


class Stopped(memory.MemoryStore):
    def stopped(self) -> kv.StoreError | None:
        return kv.StoreError("the backend stopped for good")


def wrappers(inner: kv.KVStore, tmp_path: Path) -> list[kv.KVStore]:
    guarded = active_sc.GuardedStore(inner, active_sc.ActiveSc(inner))
    recorder = history.Recorder.open(tmp_path / "history")
    return [guarded, attribution.AttributedStore(inner, recorder), attribution.AttributedStore(guarded, recorder)]


def test_a_wrapper_reports_the_limit_the_prefix_and_the_health_of_what_it_wraps(tmp_path: Path) -> None:
    inner = Stopped(prefix="/other/", max_request_bytes=LIMIT)
    fence = kv.request_size(inner).compare_bytes(active_sc.KEY, 2**63 - 1)
    guarded, attributed, attributed_guarded = wrappers(inner, tmp_path)
    for store, reserved in ((guarded, fence), (attributed, 0), (attributed_guarded, fence)):
        assert (store.prefix, store.max_request_bytes) == ("/other/", LIMIT), type(store).__name__
        assert kv.request_size(store) == kv.RequestSize("/other/", LIMIT, reserved), type(store).__name__
        assert str(store.stopped()) == "the backend stopped for good", type(store).__name__


@pytest.mark.parametrize("wrapper", [active_sc.GuardedStore, attribution.AttributedStore])
def test_a_wrapper_overrides_every_method_of_the_store_interface(wrapper: type[kv.KVStore]) -> None:
    """A method KVStore gains later must not be left to its default in a wrapper."""
    interface = {
        name for name, member in vars(kv.KVStore).items() if inspect.isfunction(member) and not name.startswith("_")
    }
    missing = sorted(name for name in interface if getattr(wrapper, name) is getattr(kv.KVStore, name))
    assert missing == []
