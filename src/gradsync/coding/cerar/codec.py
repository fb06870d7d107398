"""CERAR's per-worker codec: encode, run the ring, decode; and the runs that emulate it.

``Worker`` is one worker's side on numpy arrays or torch tensors alike: the runtime drives one
per process (through ``gradsync.coding.worker``), ``run`` drives all N in lock-step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...errors import ConfigError
from .designs import Design, _check_dtype


class Worker:
    """One worker's side of CERAR, on numpy arrays or torch tensors alike.

    ``packet(t)`` is what it sends in round t (1..L); ``receive(t)`` gives the buffer to receive
    round t's packet into; ``result()`` decodes. Per round the data sees one add.

    >>> import numpy as np
    >>> from gradsync.coding.cerar import unity
    >>> w = Worker(unity(2, 2), 0, np.arange(4.0))
    >>> w.packet(1).shape
    (2,)
    """

    def __init__(self, design: Design, worker: int, flat):
        self.design, self.worker, self.n = design, worker, design.workers
        self.d, c = flat.shape[0], design.components
        self.m = -(-self.d // c)
        if self.d == c * self.m:        # own G is a view of the input: nothing to copy up front
            self.own = flat.reshape(c, self.m)
        else:
            self.own = _zeros_like(flat, (c, self.m))
            self.own.reshape(-1)[:self.d] = flat
        self.window = _empty_like(flat, (c, self.m))         # the c packets kept, each written once
        # F_j(t) is made per round, not all L at once: the runtime then encodes while the
        # previous round's packets are on the wire, and never holds L x m encoded values
        self._sender = _matrix_like(flat, design.sender(worker))     # L x c
        self._scratch = _zeros_like(flat, (2, self.m))
        self._last = self._scratch[0]                          # P_{j-1}(t-1); zero before round 1

    def packet(self, t: int, start: int = 0, stop: int | None = None):
        """The packet sent in round t: what arrived in round t - 1 plus F_j(t); or its
        elements ``start:stop`` (a piece that can go as soon as that piece arrived)."""
        stop = self.m if stop is None else stop
        return self._last[start:stop] + self._sender[t - 1] @ self.own[:, start:stop]

    def receive(self, t: int):
        """Where round t's packet is received: kept for decoding once t >= N - 1."""
        if t >= self.n - 1:
            return self.window[t - (self.n - 1)]
        return self._scratch[t % 2]

    def received(self, t: int) -> None:
        """Round t's packet has landed in ``receive(t)``: the next packet forwards it."""
        self._last = self.receive(t)

    def result(self):
        """This worker's estimate of the sum, d elements."""
        c = self.design.components
        dec = _matrix_like(self.own, self.design.decoder(self.worker))     # c x 2c: window, then own
        return (dec[:, :c] @ self.window + dec[:, c:] @ self.own).reshape(-1)[:self.d]


def _empty_like(like, shape):
    if isinstance(like, np.ndarray):
        return np.empty(shape, like.dtype)
    return like.new_empty(shape)


def _zeros_like(like, shape):
    if isinstance(like, np.ndarray):
        return np.zeros(shape, like.dtype)
    return like.new_zeros(shape)


def _matrix_like(like, matrix: np.ndarray):
    """A float64 design matrix in the payload's dtype (and device, for torch)."""
    if isinstance(like, np.ndarray):
        return matrix.astype(like.dtype)
    import torch
    return torch.tensor(matrix, dtype=like.dtype, device=like.device)


@dataclass(frozen=True)
class Run:
    """What one emulated CERAR all-reduce produced."""

    estimates: np.ndarray        # N x d
    sent_elements: np.ndarray    # per worker, counted packet by packet


def run(design: Design, inputs: np.ndarray) -> Run:
    """Run CERAR's workers in lock-step on ``inputs`` (N x d), counting what each sends.

    The same ``Worker`` objects run in the runtime, one per process.

    >>> import numpy as np
    >>> from gradsync.coding.cerar import unity
    >>> x = np.random.default_rng(0).standard_normal((4, 10))
    >>> bool(np.allclose(run(unity(4, 4), x).estimates, x.sum(axis=0)))
    True
    """
    n, d = inputs.shape
    if n != design.workers:
        raise ConfigError(f"design is for {design.workers} workers, inputs have {n}")
    _check_dtype(inputs.dtype)
    sent_elements = np.zeros(n, np.int64)
    if d == 0:
        return Run(inputs.copy(), sent_elements)
    workers = [Worker(design, j, inputs[j]) for j in range(n)]
    for t in range(1, design.rounds + 1):
        packets = [w.packet(t) for w in workers]
        for j, w in enumerate(workers):
            w.receive(t)[...] = packets[j - 1]                 # j receives from j - 1
            w.received(t)
            sent_elements[j] += packets[j].shape[0]
    return Run(np.stack([w.result() for w in workers]), sent_elements)


def emulate(design: Design, inputs: np.ndarray) -> np.ndarray:
    """Each worker's estimate of the sum of ``inputs`` (N x d).

    >>> from gradsync.coding.cerar import unity
    >>> bool(np.allclose(emulate(unity(2, 2), np.ones((2, 3))), 2))
    True
    """
    return run(design, inputs).estimates


def measure(design: Design, elements: int = 1 << 14, dtype="float64", seed: int = 0) -> dict:
    """Error of a design on random Gaussian gradients: worst worker's relative L2 error, and the
    largest relative difference between two workers' estimates.

    >>> from gradsync.coding.cerar import unity
    >>> measure(unity(4, 4), 64)["rel_error"] < 1e-12
    True
    """
    inputs = np.random.default_rng(seed).standard_normal((design.workers, elements)).astype(dtype)
    exact = inputs.astype(np.float64).sum(axis=0)
    est = emulate(design, inputs).astype(np.float64)
    norm = np.linalg.norm(exact)
    errors = np.linalg.norm(est - exact, axis=1) / norm
    spread = max(np.linalg.norm(est[a] - est[b]) for a in range(len(est)) for b in range(a)) / norm
    return {"rel_error": float(errors.max()), "worst_worker": int(errors.argmax()),
            "worker_spread": float(spread), "per_worker": errors.tolist()}


def emulate_schedule(schedule, inputs: np.ndarray) -> np.ndarray:
    """``emulate`` with the design a CERAR schedule names (the registry's ``coding.emulate``).

    >>> import gradsync
    >>> emulate_schedule(gradsync.schedule("cerar", 4, 10, components=4), np.ones((4, 10))).shape
    (4, 10)
    """
    return emulate(Design.from_dict(schedule.codec), inputs)


def verify_schedule(schedule) -> None:
    """A CERAR schedule: L rounds in which every worker sends one packet of m to its successor;
    ConfigError if not (the registry's ``coding.verify`` turns it into a ScheduleError).

    >>> import gradsync
    >>> verify_schedule(gradsync.schedule("cerar", 4, 10, components=4))
    """
    design = Design.from_dict(schedule.codec)
    n, t = schedule.workers, schedule.transfers
    if design.workers != n:
        raise ConfigError(f"codec is for {design.workers} workers, schedule has {n}")
    m = -(-schedule.elements // design.components)
    if m == 0:
        return
    expect_src = np.tile(np.arange(n), design.rounds)
    ok = (len(t) == n * design.rounds and np.array_equal(np.sort(t["round"]), np.repeat(np.arange(1, design.rounds + 1), n))
          and np.all(t["count"] == m) and np.array_equal(np.sort(t["src"]), np.sort(expect_src))
          and np.all(t["dst"] == (t["src"] + 1) % n) and np.all(t["op"] == 2))
    if not ok:
        raise ConfigError(f"not a CERAR schedule: expected {design.rounds} rounds of one packet of {m} "
                          f"elements from every worker to its successor")
    if not np.isfinite(design.cond) or design.cond > 1e15:
        raise ConfigError(f"decoding matrix is singular (cond {design.cond:.3g})")


# --- the codec registry's calls (gradsync.coding): the same names in every codec module --------

def design(codec: dict) -> Design:
    """The design a schedule's ``codec`` dict describes (``gradsync.coding.design``).

    >>> from gradsync.coding.cerar import unity
    >>> design(unity(4, 6, 1e-3).to_dict()).rounds
    8
    """
    return Design.from_dict(codec)


def worker(design: Design, rank: int, flat) -> Worker:
    """Rank ``rank``'s side of the codec on its ``flat`` input (``gradsync.coding.worker``).

    >>> import numpy as np
    >>> from gradsync.coding.cerar import unity
    >>> worker(unity(2, 2), 1, np.arange(4.0)).packet(1, 0, 1).shape
    (1,)
    """
    return Worker(design, rank, flat)
