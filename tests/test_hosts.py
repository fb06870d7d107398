"""Which ranks share a host: identities, the grouping read from them, and what it decides."""

import logging

import pytest

from gradsync.runtime.transport import hosts
from gradsync.runtime.transport.hosts import IDENTITY_BYTES, HostMap, from_identities, identity
from gradsync.runtime.transport.hosts import launcher_local_size, local_size
from gradsync.runtime.transport import auto_kind

LAUNCHER_VARIABLES = ("GRADSYNC_LOCAL_SIZE", "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE")


@pytest.fixture
def no_launcher(monkeypatch):
    for key in LAUNCHER_VARIABLES:
        monkeypatch.delenv(key, raising=False)


def test_identity_is_fixed_size_and_the_override_decides_alone(monkeypatch):
    monkeypatch.delenv("GRADSYNC_HOST", raising=False)
    real = identity()
    monkeypatch.setenv("GRADSYNC_HOST", "machine0")
    a = identity()
    monkeypatch.setenv("GRADSYNC_HOST", "machine1")
    b = identity()
    monkeypatch.setenv("GRADSYNC_HOST", "m" * 500)                  # a long name is cut, not grown
    assert {len(real), len(a), len(b), len(identity())} == {IDENTITY_BYTES}
    assert len({real, a, b}) == 3
    assert from_identities([a, real, a, b]).host == (0, 1, 0, 2)
    assert from_identities([a, b]).names == ("machine0", "machine1")


def test_consecutive_equal_blocks_give_the_local_size():
    assert HostMap((0, 0, 0, 1, 1, 1), ("a", "b")).local_size() == 3
    assert HostMap((0, 1, 2), ("a", "b", "c")).local_size() == 1
    assert HostMap((0,) * 4, ("a",)).local_size() == 4


@pytest.mark.parametrize("host, why", [((0, 1, 0, 1), "rank 1 runs on b but the ranks of one host are not consecutive"),
                                       ((0, 0, 0, 1), "hosts hold different numbers of ranks (a: 3, b: 1)")])
def test_other_placements_say_why_they_have_no_local_size(host, why):
    found = HostMap(host, ("a", "b"))
    assert found.local_size() is None and why in found.why_not()


def test_the_launcher_decides_first_then_the_group(monkeypatch, no_launcher):
    assert launcher_local_size(8) is None and local_size(8) == 8
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "2(x4)")
    assert launcher_local_size(8) == 2
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")                      # does not divide 8: not taken
    assert launcher_local_size(8) == 2
    monkeypatch.setenv("GRADSYNC_LOCAL_SIZE", "4")
    assert hosts.local_size(8, group=False) == 4


def test_ranks_not_placed_host_by_host_count_one_machine_each(monkeypatch, no_launcher, caplog):
    import torch.distributed as dist

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(hosts, "host_map", lambda group, timeout: HostMap((0, 1, 0, 1), ("a", "b")))
    with caplog.at_level(logging.WARNING, logger="gradsync"):
        assert hosts.local_size(4, group=None) == 1
    assert "one machine per rank: rank 1 runs on b but the ranks of one host are not consecutive" in caplog.text
    monkeypatch.setattr(hosts, "host_map", lambda group, timeout: HostMap((0, 0, 1, 1), ("a", "b")))
    assert hosts.local_size(4, group=None) == 2
    assert hosts.local_size(4, group=False) == 4                     # no group to ask (MPI, threads)


def test_auto_runs_shared_memory_where_ranks_share_a_host():
    assert auto_kind(HostMap((0, 0, 0), ("a",))) == "shm"
    assert auto_kind(HostMap((0, 0, 1, 1), ("a", "b"))) == "mixed"
    assert auto_kind(HostMap((0, 1, 1), ("a", "b"))) == "mixed"     # one host with two is enough
    assert auto_kind(HostMap((0, 1, 2), ("a", "b", "c"))) == "gloo"
