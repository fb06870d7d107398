"""Elastic data-parallel training on torchrun's elastic agent: lose a worker, keep training.

Each worker is one torchrun "node" (an elastic agent with one process) and all of them meet
in torch.distributed's c10d rendezvous, whose store this launcher hosts, so that no worker's
death takes it down. When a worker dies, the survivors' collective fails with ``PeerError``
(gradsync's bounded-time failure detection), their agents restart them, the rendezvous forms
a new round with the members still alive (at least ``min_workers``), and training continues
from the last committed step. A replacement agent that arrives later is admitted the same
way: the running agents see it waiting and restart into a larger round.

Commit protocol: after each optimizer step, rank 0 writes the model and optimizer state and
the step counter to one checkpoint file, atomically (write, then rename). Every (re)started
worker loads that file, so a step is either in it, and then applied by everyone, or not, and
then redone by everyone from the same state with the same global batch; no update is lost
or applied twice. Ranks then compare the step counter and a SHA-256 of their parameters and
optimizer state (an all_gather of 40 bytes, no pickling), and refuse to train on any
disagreement. The loss is scaled so that the averaged gradient is the global batch's mean
whatever the world size, so the run follows the fault-free trajectory up to float rounding.

The parts: ``job`` (the run directory's configuration and what is refused before anything
starts), ``worker`` (one rank, run by torchrun: ``python -m gradsync.training.elastic DIR``,
``... DIR --check`` only checks ``DIR/config.json``), ``agents`` (the torchrun agents and the
rendezvous store) and ``launcher`` (``train``: the agents, the fault drill, the result).
"""

from .job import CHECKPOINT, FAST_RENDEZVOUS, check, read_config
from .launcher import train
from .worker import _agree, worker   # _agree: the tests run the post-recovery check alone

__all__ = ["CHECKPOINT", "FAST_RENDEZVOUS", "check", "read_config", "train", "worker"]
