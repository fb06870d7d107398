"""Running an exact schedule's plan over a transport: what a step posts, waits for and applies.

The plan (``gradsync.core.plan``) says what to post and when; ``ExactRun`` only follows it:
for each step, apply (in plan order) the received pieces the step's sends read (add from
scratch for REDUCE, or straight from the channel where the transport can; copy for COPY;
nothing for a COPY that landed in place), wait for the sends that must finish first, then post
the step's receives and sends.
"""

from __future__ import annotations

from ..core.schedule import REDUCE
from .tracing import NO_RECORD
from .transport.base import reduces_from_channel


class ExactRun:
    """One exact collective's run on this rank: its posted operations and how far it applied.

    Args:
        plan: this rank's compiled plan.
        buffers: node -> flat tensor, worked on in place.
        scratch: the receive space the plan asks for (``plan.scratch`` elements), or None.
        transport, deadline: the group's transport; time.monotonic() by which it must be done.
        salt: OR-ed into every tag (ranks running different collectives never match).
        verify: called before the first received piece is applied (the agreement's check).
        rec: a trace recorder (``tracing.NO_RECORD`` records nothing).
        flight: the flight recorder's entry, whose ``round`` says how far it got.

    Example: ``ExactRun(plan, buffers, scratch, transport, deadline).run()``.
    """

    def __init__(self, plan, buffers: dict, scratch, transport, deadline: float, salt: int = 0,
                 verify=lambda: None, rec=NO_RECORD, flight=None):
        self.plan, self.buffers, self.scratch = plan, buffers, scratch
        self.transport, self.deadline, self.salt = transport, deadline, salt
        self.verify, self.rec, self.flight = verify, rec, flight
        self.sends, self.receives = {}, {}        # posted and not yet waited for: index -> handle
        self.applied = 0
        self.itemsize = buffers[transport.rank].element_size()
        # shared memory adds a received piece straight from the channel, without a scratch copy
        self.reduce_from = transport.reduce_from if reduces_from_channel(transport) else None

    def run(self) -> None:
        plan = self.plan
        self.post((), plan.first_posts)
        for step in plan.steps:
            if self.flight is not None:
                self.flight.round = step.round
            self.apply(step.applies)
            self.wait_sends(step.waits)
            self.post(step.sends, step.posts)        # with in-memory work every receive lands in scratch
            if step.local:
                self.run_local(step)
        self.wait_sends(plan.drain_waits)
        self.post((), plan.drain_posts)
        self.apply(len(plan.receives))
        self.wait_sends(list(self.sends))
        self.verify()

    def post(self, send_ids, receive_ids) -> None:
        # receives first: Gloo sends a message only once the peer's receive is announced,
        # and the announcement travels in the same TCP stream as this rank's data, so one
        # posted after a large send waits behind it (a ring at N = 2 on 1 Gbit/s links:
        # 214 ms against 142 with the receive first). The plan makes either order safe: a
        # receive landing in place waits for earlier rounds' sends of its segment, never
        # for this step's.
        plan, salt = self.plan, self.salt
        ops = [("recv", self.landing(j), plan.receives[j].peer, plan.receives[j].tag | salt) for j in receive_ids]
        ops += [("send", self.send_data(k), plan.sends[k].peer, plan.sends[k].tag | salt) for k in send_ids]
        t0 = self.rec.now()
        handles = self.transport.post(ops)
        if send_ids:
            self.rec.spread("send", t0, [transfer_args(plan.sends[k], self.itemsize) for k in send_ids])
        self.receives.update(zip(receive_ids, handles[:len(receive_ids)]))
        self.sends.update(zip(send_ids, handles[len(receive_ids):]))

    def wait_sends(self, ids) -> None:
        ready = [self.sends.pop(k) for k in ids if k in self.sends]
        if ready:
            t0 = self.rec.now()
            self.transport.wait(ready, self.deadline)
            self.rec.event("send wait", t0, {"round": self.plan.sends[next(iter(ids))].round, "sends": len(ready)})

    def apply(self, upto: int) -> None:
        """Apply received pieces in plan order up to index ``upto``."""
        while self.applied < upto:
            self.verify()
            j, r = self.applied, self.plan.receives[self.applied]
            t0 = self.rec.now()
            if self.reduce_from is not None and r.scratch >= 0 and r.op == REDUCE:
                self.wait_sends(self.plan.after_sends[j])
                self.reduce_from(self.receives.pop(j), self.target(r), self.deadline)
                self.rec.event("reduce", t0, transfer_args(r, self.itemsize))    # waiting and adding are one step
            else:
                self.transport.wait([self.receives.pop(j)], self.deadline)
                self.rec.event("recv wait", t0, transfer_args(r, self.itemsize))
                if r.scratch >= 0:
                    self.apply_scratch(j, r)
            self.applied += 1

    def apply_scratch(self, j: int, r) -> None:
        self.wait_sends(self.plan.after_sends[j])         # nobody still sends what this overwrites
        t0 = self.rec.now()
        target, data = self.target(r), self.scratch[r.scratch:r.scratch + r.count]
        target.add_(data) if r.op == REDUCE else target.copy_(data)
        self.rec.event("reduce" if r.op == REDUCE else "copy", t0, transfer_args(r, self.itemsize))

    def run_local(self, step) -> None:
        self.wait_sends(list(self.sends))             # in-memory work writes what sends may read
        t0 = self.rec.now()
        for x in step.local:
            target = self.buffers[x.dst][x.offset:x.offset + x.count]
            data = self.buffers[x.src][x.offset:x.offset + x.count]
            target.add_(data) if x.op == REDUCE else target.copy_(data)
        self.rec.event("local", t0, {"round": step.round, "transfers": len(step.local)})

    def target(self, r):
        return self.buffers[r.node][r.offset:r.offset + r.count]

    def landing(self, j: int):
        r = self.plan.receives[j]
        if r.scratch >= 0:
            return self.scratch[r.scratch:r.scratch + r.count]
        return self.target(r)

    def send_data(self, k: int):
        s = self.plan.sends[k]
        return self.buffers[s.node][s.offset:s.offset + s.count]


def transfer_args(piece, itemsize: int) -> dict:
    """A transfer event's args: its round, peer and bytes."""
    return {"round": piece.round, "peer": piece.peer, "bytes": piece.count * itemsize}
