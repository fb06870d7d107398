"""The Gloo engine under a gradsync group is made within the group's timeout, and a rank that
died while the ranks connected is named (``distributed.gloo_engine``). Gloo's connect is
replaced here by one that never returns, or fails as Gloo does, so the bound and the naming are
checked without a race to win."""

import datetime
import struct
import subprocess
import sys
import threading
import time

import pytest
import torch.distributed as dist

from gradsync.distributed import gloo_engine
from gradsync.distributed.work import RankFailure
from gradsync.runtime.transport import hosts

TIMEOUT = datetime.timedelta(seconds=1)
PREFIX = "gradsync/gloo/0/"


@pytest.fixture
def store(monkeypatch):
    monkeypatch.setattr(gloo_engine, "MARGIN_S", 0.2)
    return dist.HashStore()


def gloo_that(behaviour):
    """A stand-in for ``dist.ProcessGroupGloo``: never returns ("hang"), or fails as Gloo's
    connectFullMesh does when a peer's socket is gone ("refused")."""
    held = threading.Event()

    def make(*args):
        if behaviour == "hang":
            held.wait(30)
        raise RuntimeError("Gloo connectFullMesh failed with [pair.cc:152] timed out connecting: "
                           "SO_ERROR: Connection refused")
    return make


def post(store, rank, record):
    dist.PrefixStore(PREFIX + "whereabouts/", store).set(str(rank), record)


def dead_record():
    """A record of a process of this host that has ended."""
    pid = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                             text=True).stdout)
    return hosts.identity() + struct.pack("<qq", pid, 12345)


@pytest.mark.parametrize("behaviour", ["hang", "refused"])
def test_a_rank_that_died_while_the_ranks_connected_is_named_within_the_bound(store, monkeypatch, behaviour):
    monkeypatch.setattr(dist, "ProcessGroupGloo", gloo_that(behaviour))
    post(store, 1, dead_record())
    post(store, 2, hosts.record())                     # alive: this very process
    start = time.monotonic()
    with pytest.raises(RankFailure) as caught:
        gloo_engine.make_gloo(store, PREFIX, 0, 3, TIMEOUT)
    took = time.monotonic() - start
    assert caught.value.peer == 1 and "rank(s) [1] died while the group's ranks connected" in str(caught.value)
    assert took <= TIMEOUT.total_seconds() + 0.2 + 1.0                # its bound, and the half second it lingers
    # the others read who it was: first writer wins
    posted = dist.PrefixStore(PREFIX + "whereabouts/", store).get("failure").decode()
    assert posted.startswith("1|rank 0: rank(s) [1] died")


def test_a_rank_still_held_by_gloo_takes_the_failure_another_rank_posted_at_once(store, monkeypatch):
    monkeypatch.setattr(dist, "ProcessGroupGloo", gloo_that("hang"))
    dist.PrefixStore(PREFIX + "whereabouts/", store).set("failure", "1|rank 2: rank(s) [1] died while ...")
    start = time.monotonic()
    with pytest.raises(RankFailure) as caught:
        gloo_engine.make_gloo(store, PREFIX, 0, 3, datetime.timedelta(seconds=30))
    assert time.monotonic() - start < 5          # not the 30 s timeout
    assert caught.value.peer == 1 and str(caught.value).startswith("rank 0: setup abandoned: rank 2: rank(s) [1]")


def test_gloos_own_error_is_kept_where_no_rank_of_this_host_is_gone(store, monkeypatch):
    monkeypatch.setattr(dist, "ProcessGroupGloo", gloo_that("refused"))
    post(store, 1, hosts.record())
    with pytest.raises(RuntimeError, match="connectFullMesh failed") as caught:
        gloo_engine.make_gloo(store, PREFIX, 0, 2, TIMEOUT)
    assert not isinstance(caught.value, RankFailure)


def test_a_rank_that_never_came_is_named_from_gloos_store_timeout():
    store = dist.HashStore()
    store.set_timeout(datetime.timedelta(seconds=1))
    with pytest.raises(RankFailure) as caught:
        gloo_engine.make_gloo(store, PREFIX, 0, 2, TIMEOUT)      # the real Gloo: rank 1 never posts its address
    assert caught.value.peer == 1 and "rank(s) [1] did not join the group within its timeout" in str(caught.value)


def test_the_real_engine_is_made_and_sums():
    import torch

    store = dist.HashStore()
    engine = gloo_engine.make_gloo(store, PREFIX, 0, 1, datetime.timedelta(seconds=10))
    x = torch.ones(3)
    engine.allreduce([x]).wait()
    assert x.tolist() == [1.0, 1.0, 1.0]
