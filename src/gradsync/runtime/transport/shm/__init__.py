"""The shared-memory transport: ranks of one host exchange messages through one segment.

Loopback TCP moves 2.5-3 GB/s on this kind of machine while a memory copy moves 10-19 GB/s;
Open MPI, NCCL, DeepSpeed and vLLM all move intra-host messages through shared memory for
that reason. Here every ordered pair of ranks (src -> dst) has a channel in one segment:

- a *notice queue*, written by dst: "I have posted a receive for tag T of n bytes";
- a ring of ``slots`` *frames* of ``slot_bytes``, written by src: (tag, offset, n) + data.

A send is matched with a notice, then copied frame by frame into the ring: the one copy a
send makes. Only posted receives get frames, so, as on Gloo and the in-memory transport, a
message moves once both ends are posted, and a collective that works there works here. The
receiver leaves frames in the ring until it waits for their receive: the executor's REDUCE
then adds them straight from the ring into its buffer (``reduce_from``), a COPY or a plain
``wait`` copies them into the receive's tensor (its one copy). A rank with nothing to do
takes every frame of a full ring, so a sender never stays blocked on a receiver that waits
for something else. Both queues are single-producer single-consumer rings with monotonic
counters, each published with release order after the data it covers and read with acquire
order before it (``ring``), so the protocol holds on ARM as on x86.

Nobody moves data in the background: ``post`` and ``wait`` progress every pending operation
of the group. A waiting rank spins 50 us, then sleeps on its *doorbell*, a futex word in the
segment: it reads the bell, sets its "sleeping" word, looks once more, and sleeps in the
kernel until a peer that moved something for it adds one to the bell and wakes it (the kernel
compares the word before sleeping, so a ring after the look is not lost; at most 2 ms at a
time, for the liveness checks). With 4 ranks on 2 cores the waiting ones
leave the cores to the ones copying. Every 10 ms a blocked rank checks its peers' processes
(pid and start time; zombies count as dead): a dead peer is a ``PeerError`` naming it at
once. The first rank to see a failure (a death, a rank that left, or the deadline: then the
end of the chain of who waits for whom, each rank publishing the peer it waits for) records
it in the segment with one compare-and-swap, so every survivor names the same rank.

The segment is a file in /dev/shm, mode 0600, named ``gradsync-<uid>-<pid>-<128 random
bits>``. The ranks first learn which of them
share a host (``runtime.hosts``); the first rank of a host creates the segment and passes its
name through the group's torch.distributed store, every rank of the host maps it and reports,
and the creator unlinks it as soon as all have reported. In a group spanning several hosts
(``host_group``, used by ``MixedTransport``) each host has its own segment, and ranks are
named by their rank in the group. The file is unlinked once all have mapped it, so nothing is
left in /dev/shm whatever way the processes exit; the mapping is unmapped when its group is
closed (destroyed, aborted or dropped), or with the process; a segment
left by a crash during those milliseconds (its creator's pid dead) is removed by the next
group set up on the host, or by any survivor that meets the failure.

The modules: ``segment`` (the file, where each of its words is, making, opening, removing and
sweeping it), ``ring`` (this rank's side of the channels: posting and moving data), ``group``
(``SharedGroup``: waiting, doorbells, failures), ``setup`` (through the store, and the group's
state), ``transport`` (``ShmTransport``).
"""

from .group import CHECK_EVERY_S, NAP_S, SPIN_S, SharedGroup
from .ring import Op
from .segment import DATA_BUDGET, MAGIC, NOTICES, PREFIX, SHM_DIR, Layout, layout, sweep
from .setup import host_group, shared_group
from .transport import ShmTransport

__all__ = ["CHECK_EVERY_S", "DATA_BUDGET", "Layout", "MAGIC", "NAP_S", "NOTICES", "Op", "PREFIX", "SHM_DIR",
           "SPIN_S", "SharedGroup", "ShmTransport", "host_group", "layout", "shared_group", "sweep"]
