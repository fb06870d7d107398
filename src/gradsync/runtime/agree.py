"""Agreement: before anything received is used, every rank checks that all run the same collective.

Each rank hashes a description of its call (shape, dtype, algorithm, options) into 16 bytes
and exchanges them with every peer, as fixed-size bytes (never pickled objects). The first
time this process runs a given description on a group, the exchange completes before any
data moves. After that (the steady state of a training loop) the digests ride along with the
collective's first messages and are compared before the first received piece is applied, so
no round trip is added. A mismatch raises ``MismatchError`` on every rank, naming the ranks
and their values: ranks that disagree exchange their descriptions' text to say how. In the
steady state the data's messages are already posted when it is found, and nothing cancels
them: as after a ``PeerError``, do not use the group again.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict

import torch

from ..errors import MismatchError
from .state import group_state
from .transport.base import GATHER_TAG

DIGEST_BYTES = 16
TEXT_BYTES = 512
SEEN_LIMIT = 4096      # descriptions remembered per group (least recently used dropped)


class SeenDigests:
    """The digests of the collectives a group has already agreed on, least recently used first,
    at most ``limit``. ``add`` says whether it was there.

    >>> s = SeenDigests(limit=1); s.add(b"a"), s.add(b"a"), s.add(b"b"), s.add(b"a")
    (False, True, False, False)
    """

    def __init__(self, limit: int = SEEN_LIMIT):
        self.limit = limit
        self._digests: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def add(self, signature: bytes) -> bool:
        with self._lock:
            if signature in self._digests:
                self._digests.move_to_end(signature)
                return True
            self._digests[signature] = None
            while len(self._digests) > self.limit:
                self._digests.popitem(last=False)
            return False


def digest(description: dict) -> bytes:
    """The 16-byte digest of a description: ``len(digest({"a": 1}))`` is 16."""
    text = json.dumps(description, sort_keys=True, default=str)
    return hashlib.blake2b(text.encode(), digest_size=DIGEST_BYTES).digest()


def seen_before(group_key: str, signature: bytes) -> bool:
    """Whether this process already ran the collective of this ``signature`` (its digest) on
    the group; remembers it if not.

    >>> seen_before("doctest", digest({"x": 1})), seen_before("doctest", digest({"x": 1}))
    (False, True)
    """
    return group_state(group_key).slot("seen", SeenDigests).add(signature)


class Agreement:
    """The digest exchange of one collective: ``post()`` it, then ``verify(deadline)``.
    ``before_data``: the collective verifies it before posting anything else."""

    def __init__(self, transport, description: dict, before_data: bool = False, signature: bytes | None = None):
        self.transport, self.description, self.before_data = transport, description, before_data
        self.mine = torch.frombuffer(bytearray(signature or digest(description)), dtype=torch.uint8)
        self._theirs, self._pending = None, None

    def post(self) -> None:
        t = self.transport
        peers = [r for r in range(t.size) if r != t.rank]
        self._theirs = {r: torch.empty_like(self.mine) for r in peers}
        self._pending = t.post([("recv", self._theirs[r], r, GATHER_TAG) for r in peers]
                               + [("send", self.mine, r, GATHER_TAG) for r in peers])

    def verify(self, deadline: float) -> None:
        """Wait for every peer's digest; raise MismatchError naming who differs in what."""
        if self.transport.size == 1:
            return
        if self._pending is None:
            self.post()
        self.transport.wait(self._pending, deadline)
        self._pending = []
        if all(torch.equal(d, self.mine) for d in self._theirs.values()):
            return
        text = json.dumps(self.description, sort_keys=True, default=str)
        raw = bytearray(text.encode()[:TEXT_BYTES].ljust(TEXT_BYTES, b" "))
        texts = [bytes(t.tolist()).decode(errors="replace").strip()
                 for t in self.transport.gather(torch.frombuffer(raw, dtype=torch.uint8), deadline, tag=1)]
        raise MismatchError(f"rank {self.transport.rank}: ranks disagree on the collective, nothing received "
                            "was used: " + _differences(texts))


def agree(transport, description: dict, deadline: float) -> None:
    """Check, before any data moves, that every rank runs the same collective.

    Example, in each rank: ``agree(transport, {"shape": [4], "dtype": "float32"}, deadline)``.
    """
    a = Agreement(transport, description)
    a.post()
    a.verify(deadline)


def _differences(texts: list[str]) -> str:
    seen = [json.loads(t) if t.endswith("}") else {"description": t} for t in texts]
    diffs = []
    for key in sorted(set().union(*seen)):
        values = [s.get(key) for s in seen]
        if any(v != values[0] for v in values):
            groups: dict = {}
            for r, v in enumerate(values):
                groups.setdefault(json.dumps(v), []).append(r)
            diffs.append(f"{key}: " + "; ".join(f"rank(s) {ranks} have {v}" for v, ranks in groups.items()))
    return " | ".join(diffs)
