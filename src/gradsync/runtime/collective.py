"""A collective in flight: a compiled plan, its buffers and scratch, and a transport.

``Collective.start()`` returns a ``torch.futures.Future`` completed with the result tensor (or
the ``PeerError``/``MismatchError`` that ended it). Collectives run one after another, in the
order they were started, on one progress thread per process group, so the caller's thread (a DDP
backward pass) goes on while the data moves; a blocking call with nothing queued runs in the
caller's own thread instead, saving the hand-over. As with torch.distributed, every rank starts
its collectives in the same order, from one thread: two threads of a rank starting collectives
at once could run them at the same time, and equal descriptions post equal tags.

The plan (``gradsync.core.plan``) says what to post and when; this module only follows it: post
a step's sends and the receives it allows, and before that apply, in plan order, the
received pieces the sends read (add from scratch for REDUCE, copy for COPY, nothing for a
COPY that landed in place). Coded transfers (CERAR) take their packets from the codec and
land in its buffers.
"""

from __future__ import annotations

import queue
import threading
from collections import OrderedDict

import torch

from ..core.plan import HOST_RANK, Plan
from ..core.schedule import CODED, REDUCE, Schedule
from .agree import Agreement
from .flight import RECORDER
from .tracing import now_ns

SCRATCH_LIMIT_BYTES = 1 << 30


class ScratchPool:
    """Receive space reused across collectives, at most ``limit_bytes`` of it kept idle.

    A collective takes its scratch at start and gives it back when done; idle buffers beyond
    the limit are freed, least recently used first, so a training loop allocates once while a
    one-off large call does not pin its scratch for the life of the process.

    >>> pool = ScratchPool(limit_bytes=64)
    >>> a = pool.take(torch.float32, torch.device("cpu"), 10); pool.give(a); pool.idle_bytes()
    40
    >>> pool.give(pool.take(torch.float32, torch.device("cpu"), 100)); pool.idle_bytes()   # 440 > 64: both go
    0
    """

    def __init__(self, limit_bytes: int = SCRATCH_LIMIT_BYTES):
        self.limit_bytes = limit_bytes
        self._idle: OrderedDict = OrderedDict()     # (dtype, device, elements, serial) -> tensor
        self._lock = threading.Lock()
        self._serial = 0

    def take(self, dtype, device, elements: int) -> torch.Tensor:
        with self._lock:
            for key in self._idle:
                if key[:3] == (dtype, device, elements):
                    return self._idle.pop(key)
        return torch.empty(elements, dtype=dtype, device=device)

    def give(self, tensor: torch.Tensor) -> None:
        with self._lock:
            self._serial += 1
            self._idle[(tensor.dtype, tensor.device, tensor.numel(), self._serial)] = tensor
            while self._idle and self.idle_bytes() > self.limit_bytes:
                self._idle.popitem(last=False)

    def idle_bytes(self) -> int:
        """Bytes held by idle buffers."""
        return sum(t.numel() * t.element_size() for t in self._idle.values())

    def clear(self) -> None:
        with self._lock:
            self._idle.clear()


SCRATCH = ScratchPool()


class _Progress:
    """One group's progress thread: runs its queued collectives in order, completing their
    futures. ``running`` is held by whoever runs one of the group's collectives (this thread,
    or a caller running one inline), so two never run at once."""

    def __init__(self):
        self._queue: queue.Queue = queue.Queue()
        self._busy = 0                 # queued or running
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.running = threading.RLock()

    def idle(self) -> bool:
        return self._busy == 0

    def on_thread(self) -> bool:
        """Whether the caller is this progress thread (a future's callback, run on completion)."""
        return threading.current_thread() is self._thread

    def submit(self, collective: "Collective", future: torch.futures.Future) -> None:
        with self._lock:
            self._busy += 1
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="gradsync-progress", daemon=True)
                self._thread.start()
        self._queue.put((collective, future))

    def _loop(self):
        while True:
            collective, future = self._queue.get()
            try:
                with self.running:
                    collective.complete(future)
            finally:
                with self._lock:
                    self._busy -= 1


_ENGINES: dict[str, _Progress] = {}     # one per process group this process is a rank of
_ENGINES_LOCK = threading.Lock()


ENGINES_LIMIT = 64                       # idle engines beyond this are dropped, oldest first


def progress_for(transport) -> _Progress:
    """The progress engine of ``transport``'s group (its ``group_key``), made on first use."""
    key = getattr(transport, "group_key", "default")
    with _ENGINES_LOCK:
        if key not in _ENGINES and len(_ENGINES) >= ENGINES_LIMIT:
            for old in [k for k, e in _ENGINES.items() if e.idle()][:len(_ENGINES) - ENGINES_LIMIT + 1]:
                del _ENGINES[old]
        return _ENGINES.setdefault(key, _Progress())


def start(job, transport, inline: bool = False) -> torch.futures.Future:
    """Run ``job`` (anything with ``complete(future)``) on ``transport``'s progress engine, in
    start order with the group's other collectives; return the future ``job`` completes.
    ``inline``: in this thread when nothing is queued (and always from the engine's own thread:
    a callback's call runs after the current one). Example: ``start(collective, transport).wait()``.
    """
    future = torch.futures.Future()
    engine = progress_for(transport)
    if engine.on_thread() or (inline and engine.idle()):
        with engine.running:
            job.complete(future)
    else:
        engine.submit(job, future)
    return future


class Collective:
    """One all-reduce (or part of one: the KVStore's push or pull) ready to run.

    Args:
        schedule, plan: what to run, and this rank's compiled part of it.
        buffers: node -> flat tensor of the nodes this rank runs (its worker's, and the
            helpers' on HOST_RANK); exact schedules work on them in place.
        transport: the group's transport for this collective.
        deadline: time.monotonic() by which it must be done.
        agreement: an ``Agreement`` whose digests ride along with the first messages, checked
            before anything received is applied; None when it was checked beforehand.
        finish: called with the result tensor on success (e.g. divide for an average).
        salt: mixed into the tags so that ranks running different collectives cannot match
            each other's messages.
        design: the codec's design, for coded schedules (CERAR).
        trace: a ``tracing.Trace`` recording this collective's events, or None (no cost).
    """

    def __init__(self, schedule: Schedule, plan: Plan, buffers: dict, transport, deadline: float,
                 agreement: Agreement | None = None, finish=None, salt: int = 0, design=None, trace=None):
        self.schedule, self.plan, self.buffers, self.design = schedule, plan, buffers, design
        self.trace = trace
        self.flight = None            # this collective's flight recorder entry, once it runs
        self.transport, self.deadline, self.agreement, self.finish = transport, deadline, agreement, finish
        bits = max(0, min(8, 30 - plan.tag_bits))
        self._salt = (salt & ((1 << bits) - 1)) << plan.tag_bits

    def start(self, inline: bool = False) -> torch.futures.Future:
        """Run it; return a future of the result. ``inline``: in this thread, if nothing is queued.

        Example, in each rank of a group: ``tensor = collective.start().wait()``.
        """
        return start(self, self.transport, inline)

    def complete(self, future: torch.futures.Future) -> None:
        try:
            with torch.no_grad():          # a parameter may be all-reduced in place, as with dist
                result = self.run()
            if self.finish is not None:
                result = self.finish(result)
        except BaseException as exc:       # the future carries it to whoever waits
            if self.flight is not None:
                RECORDER.end(self.flight, exc)     # writes the flight record on PeerError, MismatchError
            self.transport.close()
            future.set_exception(exc)
            return
        RECORDER.end(self.flight)
        self.transport.close()
        future.set_result(result)

    def run(self) -> torch.Tensor:
        """Run the plan to the end in this thread; return the result tensor."""
        self.flight = RECORDER.begin(self)
        if self.agreement is not None:
            self.agreement.post()
            if self.agreement.before_data:
                self.flight.phase = "agree"
                self._verify_agreement()
                self.flight.phase = "run"
        flat = self.buffers.get(self.transport.rank)
        rec = None if self.trace is None else self.trace.begin(self.transport.rank, self.describe())
        if self.schedule.codec is not None:
            result = self._run_coded(flat, rec)
        else:
            scratch = SCRATCH.take(flat.dtype, flat.device, self.plan.scratch) if self.plan.scratch else None
            try:
                self._run_exact(scratch, rec)
            finally:
                if scratch is not None:
                    SCRATCH.give(scratch)
            result = flat
        if rec is not None:
            rec.end(self.transport, self.deadline)
        return result

    def describe(self) -> dict:
        """What this collective is, for traces and the flight recorder."""
        flat = self.buffers.get(self.transport.rank)
        return {"algorithm": self.schedule.algorithm, "bytes": self.schedule.elements * flat.element_size(),
                "dtype": str(flat.dtype).removeprefix("torch."), "workers": self.schedule.workers,
                "rounds": self.schedule.rounds}

    # --- exact schedules -------------------------------------------------------------------

    def _landing(self, j: int, scratch) -> torch.Tensor:
        r = self.plan.receives[j]
        if r.scratch >= 0:
            return scratch[r.scratch:r.scratch + r.count]
        return self.buffers[r.node][r.offset:r.offset + r.count]

    def _run_exact(self, scratch, rec=None) -> None:
        plan, transport, deadline = self.plan, self.transport, self.deadline
        sends, receives = {}, {}         # posted and not yet waited for: index -> handle
        applied = 0
        itemsize = self.buffers[transport.rank].element_size() if rec is not None else 0

        def post(send_ids, receive_ids):
            # receives first: Gloo sends a message only once the peer's receive is announced,
            # and the announcement travels in the same TCP stream as this rank's data, so one
            # posted after a large send waits behind it (a ring at N = 2 on 1 Gbit/s links:
            # 214 ms against 142 with the receive first). The plan makes either order safe: a
            # receive landing in place waits for earlier rounds' sends of its segment, never
            # for this step's.
            ops = [("recv", self._landing(j, scratch), plan.receives[j].peer, plan.receives[j].tag | self._salt)
                   for j in receive_ids]
            ops += [("send", self._send_data(k), plan.sends[k].peer, plan.sends[k].tag | self._salt)
                    for k in send_ids]
            t0 = now_ns() if rec is not None else 0
            handles = transport.post(ops)
            if rec is not None and send_ids:
                rec.spread("send", t0, [_args(plan.sends[k], itemsize) for k in send_ids])
            receives.update(zip(receive_ids, handles[:len(receive_ids)]))
            sends.update(zip(send_ids, handles[len(receive_ids):]))

        def wait_sends(ids):
            ready = [sends.pop(k) for k in ids if k in sends]
            if ready:
                t0 = now_ns() if rec is not None else 0
                transport.wait(ready, deadline)
                if rec is not None:
                    rec.event("send wait", t0, {"round": plan.sends[next(iter(ids))].round, "sends": len(ready)})

        reduce_from = getattr(transport, "reduce_from", None)    # shared memory: add from the channel

        def apply(upto):
            nonlocal applied
            while applied < upto:
                self._verify_agreement()
                j, r = applied, plan.receives[applied]
                t0 = now_ns() if rec is not None else 0
                if reduce_from is not None and r.scratch >= 0 and r.op == REDUCE:
                    wait_sends(plan.after_sends[j])
                    reduce_from(receives.pop(j), self.buffers[r.node][r.offset:r.offset + r.count], deadline)
                    if rec is not None:      # waiting and adding are one step here
                        rec.event("reduce", t0, _args(r, itemsize))
                    applied += 1
                    continue
                transport.wait([receives.pop(j)], deadline)
                if rec is not None:
                    rec.event("recv wait", t0, _args(r, itemsize))
                if r.scratch >= 0:
                    wait_sends(plan.after_sends[j])         # nobody still sends what this overwrites
                    t0 = now_ns() if rec is not None else 0
                    target = self.buffers[r.node][r.offset:r.offset + r.count]
                    data = scratch[r.scratch:r.scratch + r.count]
                    target.add_(data) if r.op == REDUCE else target.copy_(data)
                    if rec is not None:
                        rec.event("reduce" if r.op == REDUCE else "copy", t0, _args(r, itemsize))
                applied += 1

        post((), plan.first_posts)
        flight = self.flight
        for step in plan.steps:
            flight.round = step.round
            apply(step.applies)
            wait_sends(step.waits)
            post(step.sends, step.posts)            # with in-memory work every receive lands in scratch
            if step.local:
                wait_sends(list(sends))             # in-memory work writes what sends may read
                t0 = now_ns() if rec is not None else 0
                for x in step.local:
                    target = self.buffers[x.dst][x.offset:x.offset + x.count]
                    data = self.buffers[x.src][x.offset:x.offset + x.count]
                    target.add_(data) if x.op == REDUCE else target.copy_(data)
                if rec is not None:
                    rec.event("local", t0, {"round": step.round, "transfers": len(step.local)})
        wait_sends(plan.drain_waits)
        post((), plan.drain_posts)
        apply(len(plan.receives))
        wait_sends(list(sends))
        self._verify_agreement()

    def _verify_agreement(self) -> None:
        """Before the first received piece is used: every rank runs this same collective."""
        if self.agreement is not None:
            self.agreement.verify(self.deadline)
            self.agreement = None

    def _send_data(self, k: int) -> torch.Tensor:
        s = self.plan.sends[k]
        return self.buffers[s.node][s.offset:s.offset + s.count]

    # --- coded schedules (CERAR) -------------------------------------------------------------

    def _run_coded(self, flat: torch.Tensor, rec=None) -> torch.Tensor:
        """CERAR on the same plan: a step's packet piece is encoded from the piece received in
        the previous round, which the plan has waited for; receives land in the codec's buffers."""
        from ..coding import cerar

        if flat.numel() == 0:
            return flat
        plan, transport, deadline = self.plan, self.transport, self.deadline
        worker = cerar.Worker(self.design, transport.rank, flat)
        assert all(p.op == CODED for p in plan.sends + plan.receives)
        rounds_received = sorted({r.round for r in plan.receives})
        sending, older, receives = [], [], {}   # this round's and the last round's (handle, packet)
        applied, current = 0, None
        itemsize = flat.element_size() if rec is not None else 0

        def decode(rnd):
            t0 = now_ns() if rec is not None else 0
            worker.received(rnd)
            if rec is not None:
                peers: dict = {}
                for r in plan.receives:
                    if r.round == rnd:
                        peers[str(r.peer)] = peers.get(str(r.peer), 0) + r.count * itemsize
                rec.event("reduce", t0, {"round": rnd, "bytes": sum(peers.values()), "peers": peers})

        def post_receives(ids):
            ops = [("recv", worker.receive(r.round)[r.offset:r.offset + r.count], r.peer, r.tag | self._salt)
                   for r in (plan.receives[j] for j in ids)]
            receives.update(zip(ids, transport.post(ops)))

        post_receives(plan.first_posts)
        flight = self.flight
        for step in plan.steps:
            flight.round = step.round
            while applied < step.applies:
                self._verify_agreement()
                t0 = now_ns() if rec is not None else 0
                transport.wait([receives.pop(applied)], deadline)
                if rec is not None:
                    rec.event("recv wait", t0, _args(plan.receives[applied], itemsize))
                applied += 1
            if step.round != current:              # packets are kept until sent: two rounds at most
                current = step.round
                transport.wait([h for h, _ in older], deadline)
                older, sending = sending, []
                if step.round - 1 in rounds_received:
                    decode(step.round - 1)
            packets = [worker.packet(plan.sends[k].round, plan.sends[k].offset,
                                     plan.sends[k].offset + plan.sends[k].count) for k in step.sends]
            # receives before sends (see _run_exact), but after encoding: the next round's
            # piece lands in the buffer this round's packet piece was just encoded from
            post_receives(step.posts)
            t0 = now_ns() if rec is not None else 0
            handles = transport.post([("send", p, plan.sends[k].peer, plan.sends[k].tag | self._salt)
                                      for p, k in zip(packets, step.sends)])
            if rec is not None and step.sends:
                rec.spread("send", t0, [_args(plan.sends[k], itemsize) for k in step.sends])
            sending += zip(handles, packets)
        post_receives(plan.drain_posts)
        t0 = now_ns() if rec is not None else 0
        last = sorted(receives)
        transport.wait([receives.pop(j) for j in last] + [h for h, _ in older + sending], deadline)
        if rec is not None and last:      # waited for together: the wait is shared among them
            rec.spread("recv wait", t0, [_args(plan.receives[j], itemsize) for j in last])
        self._verify_agreement()
        if rounds_received:
            decode(rounds_received[-1])
        return worker.result()


def _args(piece, itemsize: int) -> dict:
    """A transfer event's args: its round, peer and bytes."""
    return {"round": piece.round, "peer": piece.peer, "bytes": piece.count * itemsize}


def node_buffers(schedule: Schedule, rank: int, flat: torch.Tensor) -> dict[int, torch.Tensor]:
    """The buffers of the nodes this rank runs: its worker's, plus the helpers' on HOST_RANK.

    >>> from gradsync.algorithms import host
    >>> sorted(node_buffers(host.schedule(2, 4), 0, torch.ones(4)))
    [0, 2]
    """
    buffers = {rank: flat}
    if rank == HOST_RANK:
        for h in range(len(schedule.helpers)):
            buffers[schedule.workers + h] = torch.zeros_like(flat)
    return buffers
