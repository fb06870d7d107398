"""Who a rank names when its wait fails, decided against a real torch store with no processes:
the ranks that checked in are alive, the notice in the store wins, a timeout names whoever is
missing rather than the peer it waited for."""

import time

import pytest
import torch.distributed as dist

from gradsync.runtime.transport import naming
from gradsync.runtime.transport.distributed import DistributedTransport, Pending

TIMEOUT = RuntimeError("[/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 3000ms for recv operation")
CLOSED = RuntimeError("[/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:4242")


@pytest.fixture
def store(monkeypatch):
    store = dist.HashStore()
    monkeypatch.setattr(naming, "rendezvous_store", lambda: store)
    return store


def transport_of(rank: int, size: int) -> DistributedTransport:
    """A transport as the collective holds it, without a process group behind it."""
    t = DistributedTransport.__new__(DistributedTransport)
    t.rank, t.size, t.failure_key, t._timer = rank, size, "gradsync/failure/test", None
    t.group = None                               # no process group: no host map to read
    return t


def alive(store, *ranks):
    for r in ranks:
        store.set(f"gradsync/failure/test/alive/{r}", "1")


def test_a_timeout_names_the_rank_that_never_checked_in_not_the_live_peer_it_waited_for(store):
    alive(store, 0)                              # rank 0 waited for rank 2 and timed out too
    error = transport_of(1, 3).failure_of(TIMEOUT, Pending(None, 0, "recv", 7), time.monotonic())
    assert error.peer == 2 and "[2] did not check in" in str(error)
    assert store.get("gradsync/failure/test").decode().startswith("2|")   # the others read it


def test_a_timeout_names_the_peer_waited_for_when_several_are_missing(store):
    start = time.monotonic()
    error = transport_of(1, 4).failure_of(TIMEOUT, Pending(None, 3, "recv", 7), time.monotonic())
    assert error.peer == 3 and "receive from rank 3 did not answer before the timeout" in str(error)
    assert 0.9 < time.monotonic() - start < 3.0  # the roll call waited its second for the others


def test_a_timeout_takes_the_notice_of_a_rank_that_saw_the_death(store):
    store.set("gradsync/failure/test", "2|rank 0: receive from rank 2 closed its connection")
    error = transport_of(1, 3).failure_of(TIMEOUT, Pending(None, 0, "recv", 7), time.monotonic())
    assert error.peer == 2 and "collective abandoned: rank 0: receive from rank 2" in str(error)


def test_a_closed_connection_names_the_peer_and_tells_the_others(store):
    alive(store, 0)
    error = transport_of(1, 3).failure_of(CLOSED, Pending(None, 2, "recv", 7), time.monotonic())
    assert error.peer == 2 and "closed its connection" in str(error)
    assert store.get("gradsync/failure/test").decode().startswith("2|")
