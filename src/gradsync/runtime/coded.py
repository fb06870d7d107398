"""Running a coded schedule's plan (CERAR) over a transport.

The plan is the same kind as an exact schedule's: a step's packet piece is encoded from the
piece received in the previous round, which the plan has waited for, and receives land in the
codec's buffers instead of the tensor. The codec comes from the coding registry
(``gradsync.coding``), so nothing here knows CERAR by name.
"""

from __future__ import annotations

from .. import coding
from ..core.schedule import CODED
from .exact import transfer_args
from .tracing import NO_RECORD


class CodedRun:
    """One coded collective's run on this rank; ``run()`` returns the decoded result.

    Args are those of ``exact.ExactRun``, with ``design`` (the codec's design) in place of the
    buffers and scratch, and ``flat`` the rank's tensor. Packets are kept until sent: two
    rounds of them at most.

    Example: ``CodedRun(plan, design, flat, transport, deadline).run()``.
    """

    def __init__(self, plan, design, flat, transport, deadline: float, salt: int = 0,
                 verify=lambda: None, rec=NO_RECORD, flight=None):
        assert all(p.op == CODED for p in plan.sends + plan.receives)
        self.plan, self.transport, self.deadline, self.salt = plan, transport, deadline, salt
        self.verify, self.rec, self.flight = verify, rec, flight
        self.worker = coding.worker(design, transport.rank, flat)
        self.itemsize = flat.element_size()
        self.rounds_received = sorted({r.round for r in plan.receives})
        self.sending, self.older, self.receives = [], [], {}   # this round's and the last round's (handle, packet)
        self.applied, self.current = 0, None

    def run(self):
        plan = self.plan
        self.post_receives(plan.first_posts)
        for step in plan.steps:
            if self.flight is not None:
                self.flight.round = step.round
            self.wait_received(step.applies)
            if step.round != self.current:
                self.next_round(step.round)
            packets = [self.worker.packet(plan.sends[k].round, plan.sends[k].offset,
                                          plan.sends[k].offset + plan.sends[k].count) for k in step.sends]
            # receives before sends (see exact.ExactRun.post), but after encoding: the next
            # round's piece lands in the buffer this round's packet piece was just encoded from
            self.post_receives(step.posts)
            self.post_sends(step.sends, packets)
        self.post_receives(plan.drain_posts)
        self.finish_last()
        return self.worker.result()

    def wait_received(self, upto: int) -> None:
        while self.applied < upto:
            self.verify()
            t0 = self.rec.now()
            self.transport.wait([self.receives.pop(self.applied)], self.deadline)
            self.rec.event("recv wait", t0, transfer_args(self.plan.receives[self.applied], self.itemsize))
            self.applied += 1

    def next_round(self, rnd: int) -> None:
        """A new round: the packets of two rounds ago are sent; the previous round is decoded."""
        self.current = rnd
        self.transport.wait([h for h, _ in self.older], self.deadline)
        self.older, self.sending = self.sending, []
        if rnd - 1 in self.rounds_received:
            self.decode(rnd - 1)

    def post_receives(self, ids) -> None:
        receives = [self.plan.receives[j] for j in ids]
        ops = [("recv", self.worker.receive(r.round)[r.offset:r.offset + r.count], r.peer, r.tag | self.salt)
               for r in receives]
        self.receives.update(zip(ids, self.transport.post(ops)))

    def post_sends(self, ids, packets) -> None:
        sends = [self.plan.sends[k] for k in ids]
        t0 = self.rec.now()
        handles = self.transport.post([("send", p, s.peer, s.tag | self.salt) for p, s in zip(packets, sends)])
        if ids:
            self.rec.spread("send", t0, [transfer_args(s, self.itemsize) for s in sends])
        self.sending += zip(handles, packets)

    def finish_last(self) -> None:
        t0 = self.rec.now()
        last = sorted(self.receives)
        self.transport.wait([self.receives.pop(j) for j in last] + [h for h, _ in self.older + self.sending],
                            self.deadline)
        if last:      # waited for together: the wait is shared among them
            self.rec.spread("recv wait", t0, [transfer_args(self.plan.receives[j], self.itemsize) for j in last])
        self.verify()
        if self.rounds_received:
            self.decode(self.rounds_received[-1])

    def decode(self, rnd: int) -> None:
        t0 = self.rec.now()
        self.worker.received(rnd)
        if self.rec:
            peers: dict = {}
            for r in self.plan.receives:
                if r.round == rnd:
                    peers[str(r.peer)] = peers.get(str(r.peer), 0) + r.count * self.itemsize
            self.rec.event("reduce", t0, {"round": rnd, "bytes": sum(peers.values()), "peers": peers})
