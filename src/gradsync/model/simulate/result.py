"""What a simulation measured (``SimResult``), and its timeline on disk: numpy's columnar
``.npz`` for millions of transfers (``TIMELINE_FORMAT``), or JSON for small runs, read back by
``load_timeline``.
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ...errors import ConfigError, ScheduleError
from ...core.compact import PROGRAM_DTYPE, CompactSchedule
from ...core.schedule import Schedule
from ..topology import Topology

TIMELINE_FORMAT = "gradsync.timeline/1"
TIME_COLUMNS = ("start", "sent", "done")
EXPAND_ON_LOAD = 1 << 22      # transfers: a compact timeline is read back as full columns up to this many
COMPACT_LINKS = 64            # a compact timeline's summary keeps its busiest channels only


@dataclass(frozen=True, eq=False)
class SimResult:
    """What a simulation measured. Times in seconds, sizes in bytes."""

    schedule: Schedule
    topology: Topology
    itemsize: int
    time: float                   # when the last node finished
    node_done: np.ndarray         # per schedule node: when it finished
    channel_bytes: np.ndarray     # per directed channel
    channel_busy: np.ndarray      # per directed channel: time with at least one flow on it
    placement: np.ndarray         # schedule node -> topology node index
    flow_times: np.ndarray        # (3, flows): start, send end and delivery of each simulated flow
    flow_round: np.ndarray        # per flow: its round
    orbit: np.ndarray | None = None   # per transfer: the flow timed for it (None: transfer i is flow i)
    strides: tuple | None = None      # a compact schedule's: the subgroup whose block was simulated
    classes: tuple | None = None      # unequal chunks at scale: the times with every chunk at its smallest, largest
    protocol: str | None = None       # on a GPU topology: the NCCL protocol the transfers moved by

    @cached_property
    def _flow_of_transfer(self):
        if self.strides is not None:
            return self.schedule.flow_of_transfer(self.strides)
        return self.orbit

    @cached_property
    def start(self) -> np.ndarray:
        """Per transfer: when it started."""
        return self._per_transfer(0)

    @cached_property
    def sent(self) -> np.ndarray:
        """Per transfer: when its last byte left."""
        return self._per_transfer(1)

    @cached_property
    def done(self) -> np.ndarray:
        """Per transfer: when it was delivered."""
        return self._per_transfer(2)

    def _per_transfer(self, row: int, lo: int = 0, hi: int | None = None) -> np.ndarray:
        times, orbit = self.flow_times[row], self._flow_of_transfer
        return times[lo:hi].copy() if orbit is None else times[orbit[lo:hi]]

    @property
    def round_end(self) -> np.ndarray:
        """When the last transfer of each round was delivered."""
        out = np.zeros(self.schedule.rounds)
        np.maximum.at(out, self.flow_round, self.flow_times[2])
        return out

    def busiest_channel(self) -> tuple[str, float]:
        """The busiest directed channel, as 'a->b', and the bytes it carried ('-' if none carried any)."""
        if not self.channel_bytes.any():
            return "-", 0.0
        c = int(np.argmax(self.channel_bytes))
        return self.channel_name(c), float(self.channel_bytes[c])

    def channel_name(self, c: int) -> str:
        link = self.topology.links[c // 2]
        return f"{link.a}->{link.b}" if c % 2 == 0 else f"{link.b}->{link.a}"

    def to_dict(self, timeline: bool = True) -> dict:
        """JSON-ready result; with ``timeline`` every transfer's start, send end and delivery."""
        s, names = self.schedule, [n.name for n in self.topology.nodes]
        nbytes = s.elements * self.itemsize
        out = {
            "algorithm": s.algorithm, "topology": self.topology.name, "workers": s.workers,
            "bytes": nbytes, "itemsize": self.itemsize, "time_s": self.time,
            "rounds": s.rounds, "round_end_s": self.round_end.tolist(),
            "placement": [names[i] for i in self.placement],
            "links": [{"channel": self.channel_name(c), "bytes": float(self.channel_bytes[c]),
                       "busy_s": float(self.channel_busy[c])}
                      for c in np.flatnonzero(self.channel_bytes)],
        }
        if self.protocol is not None:
            out["protocol"] = self.protocol
        if timeline:
            t = s.transfers
            out["timeline"] = {"round": t["round"].tolist(), "src": t["src"].tolist(),
                               "dst": t["dst"].tolist(), "offset": t["offset"].tolist(),
                               "count": t["count"].tolist(), "op": t["op"].tolist(),
                               "start": self.start.tolist(), "sent": self.sent.tolist(),
                               "done": self.done.tolist()}
            if s.lane is not None:
                out["timeline"]["lane"] = s.lane.tolist()
        return out


    def save(self, path) -> None:
        """Write the result with its timeline to ``path``: ``.npz`` for numpy's columnar format
        (a column per transfer field and per time, written one column at a time: compact and
        fast for millions of transfers; a symmetric run stores each distinct timing once and
        per transfer the index of its timing; read it with ``load_timeline``), ``.json`` for
        ``to_dict()`` (small runs). Example: ``simulate(s, topo).save("ring.npz")``."""
        path = str(path)
        if path.endswith(".json"):
            with open(path, "w") as fh:
                json.dump(self.to_dict(timeline=True), fh)
            return
        if not path.endswith(".npz"):
            raise ConfigError(f"a timeline is written as .npz or .json, got {path!r}")
        with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
            def put(name, array):
                with zf.open(name + ".npy", "w", force_zip64=True) as fh:
                    np.lib.format.write_array(fh, np.asarray(array), allow_pickle=False)
            summary = {"format": TIMELINE_FORMAT, **self.to_dict(timeline=False)}
            if isinstance(self.schedule, CompactSchedule):
                self._save_compact(put, summary)
                return
            put("summary", np.array(json.dumps(summary)))
            t = self.schedule.transfers
            for name in t.dtype.names:
                put(name, t[name])
            if self.orbit is None:
                for row, name in enumerate(TIME_COLUMNS):
                    put(name, self.flow_times[row])
            else:                  # a symmetric run: each distinct timing once, and which one each transfer has
                put("orbit", self.orbit)
                for row, name in enumerate(TIME_COLUMNS):
                    put("flow_" + name, self.flow_times[row])


    def _save_compact(self, put, summary) -> None:
        """A compact schedule's timeline: its program, its group, and each simulated flow's times
        (the flows of one block: ``block(strides)``), never the expanded table."""
        c = self.schedule
        description = c.to_dict()
        del description["program"], description["digits"]
        busiest = sorted(summary.pop("links"), key=lambda l: -l["bytes"])[:COMPACT_LINKS]
        summary.pop("placement")                       # the topology's first N workers, in order
        text = json.dumps({**summary, "links": busiest, "compact": description, "strides": list(self.strides)})
        put("summary", np.frombuffer(text.encode(), np.uint8))
        for name in PROGRAM_DTYPE.names:
            put("program_" + name, c.program[name])
        put("program_digits", c.digits)
        for row, name in enumerate(TIME_COLUMNS):
            put("flow_" + name, self.flow_times[row])


def _compact_timeline(data, columns, expand):
    """A compact timeline's columns: the program, the flows' times, and (when ``expand``, or when
    the table is small) every transfer's columns expanded."""
    description = data.pop("compact")
    strides = tuple(data.pop("strides"))
    description["program"] = {n: columns.pop("program_" + n) for n in PROGRAM_DTYPE.names}
    description["digits"] = columns.pop("program_digits")
    try:
        c = CompactSchedule.from_dict(description)
    except ScheduleError as exc:
        raise ConfigError(f"not a gradsync timeline: {exc}") from None
    data["compact"] = {"schedule": c, "strides": strides, **columns}
    if expand if expand is not None else c.transfer_count <= EXPAND_ON_LOAD:
        t, flow = c.expand().transfers, c.flow_of_transfer(strides)
        data["timeline"] = {**{n: t[n] for n in t.dtype.names},
                            **{n: columns["flow_" + n][flow] for n in TIME_COLUMNS}}
    return data


def load_timeline(path, expand: bool | None = None) -> dict:
    """Read a timeline written by ``SimResult.save``: the summary (``to_dict(timeline=False)``)
    with a ``timeline`` of numpy columns (round, src, dst, offset, count, op, start, sent,
    done), from ``.npz`` or ``.json``. ``load_timeline("ring.npz")["timeline"]["done"].max()``
    is the simulated time. A compact schedule's file also gives ``compact``: its schedule, the
    subgroup (``strides``) and each simulated flow's times; its ``timeline`` is expanded when
    ``expand`` or when it has at most EXPAND_ON_LOAD transfers."""
    path = str(path)
    try:
        if path.endswith(".json"):
            with open(path) as fh:
                data = json.load(fh)
            data["timeline"] = {k: np.asarray(v) for k, v in data["timeline"].items()}
            return data
        with np.load(path, allow_pickle=False) as z:
            raw = z["summary"]
            data = json.loads(raw.tobytes().decode() if raw.dtype == np.uint8 else str(raw))
            if data.pop("format", None) != TIMELINE_FORMAT:
                raise ConfigError(f"{path}: not a gradsync timeline")
            columns = {k: z[k] for k in z.files if k != "summary"}
            if "compact" in data:
                return _compact_timeline(data, columns, expand)
            if "orbit" in columns:
                orbit = columns.pop("orbit")
                columns.update({name: columns.pop("flow_" + name)[orbit] for name in TIME_COLUMNS})
            data["timeline"] = columns
            return data
    except ConfigError:
        raise
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as exc:
        raise ConfigError(f"cannot read timeline {path!r}: {exc}") from None
