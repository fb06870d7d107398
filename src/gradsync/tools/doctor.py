"""``gradsync doctor DIR``: read every rank's flight record and say what happened, in one paragraph.

The records are the files the flight recorder (``gradsync.runtime.flight``) writes, one per rank,
on a PeerError, a MismatchError or SIGUSR1 (and ``gradsync bench --flight-dir`` at the end of a
healthy run). The reading:

- every rank with a file, none of them with a collective open or failed: nothing went wrong
  (records written at the end of a healthy run, ``bench --flight-dir``, or on SIGUSR1 when
  nothing hung);
- a rank of the group without a file wrote nothing: it died without a chance to (SIGKILL, the
  out-of-memory killer, a lost machine) or was never asked (SIGUSR1 sent to some ranks only);
- each rank's collective in flight is its latest entry not done; the rank that stopped first
  is the one named by the survivors' errors if that rank has no file, else the one furthest
  behind (lowest collective sequence, then lowest round, then earliest start).

>>> diagnose([{"rank": 0, "size": 2, "reason": "PeerError", "collectives": [
...     {"sequence": 3, "algorithm": "ring", "bytes": 4096, "dtype": "float32", "rounds": 2, "phase": "failed",
...      "round": 0, "started": 0.0, "ended": 1.0, "error": "PeerError: ...", "error_peer": 1,
...      "waiting_on": {"peer": 1, "kind": "recv"}}]}])["first"]
1
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from ..errors import ConfigError
from ..units import format_size


def read(directory) -> list[dict]:
    """Every rank's record in ``directory`` (files rank<r>.json); ConfigError if there are none."""
    folder = Path(directory)
    if not folder.is_dir():
        raise ConfigError(f"no directory {str(directory)!r}: expected the flight recorder's directory "
                          f"(GRADSYNC_FLIGHT_DIR)")
    records = []
    for path in sorted(folder.glob("rank*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"flight record {str(path)!r} is unreadable: {exc}") from None
        if not isinstance(record, dict) or record.get("format") != "gradsync.flight/1":
            raise ConfigError(f"{str(path)!r} is not a gradsync flight record (format gradsync.flight/1)")
        records.append(record)
    if not records:
        raise ConfigError(f"no flight records (rank<r>.json) in {str(directory)!r}: none was written, or the "
                          f"ranks ran without GRADSYNC_FLIGHT_DIR set")
    return records


def _in_flight(record: dict) -> dict | None:
    """The rank's latest collective not done, else its latest."""
    entries = record.get("collectives") or []
    open_ = [e for e in entries if e.get("phase") != "done"]
    return (open_ or entries or [None])[-1]


def _describe(e: dict) -> str:
    return f"collective #{e['sequence']} ({e['algorithm']}, {format_size(e['bytes'])} {e['dtype']})"


def _where(e: dict | None, current: dict | None) -> str:
    """Where a rank was, without its name ("in round 1 of 0-5 of it, ..."); the collective is
    named only when it is not ``current`` (the one in flight)."""
    if e is None:
        return "had run no collective"
    which = "it" if current is not None and e["sequence"] == current["sequence"] else _describe(e)
    if e["phase"] == "done":
        return f"had finished {_describe(e)} and started no other"
    at = "agreeing on the call" if e["phase"] == "agree" or e["round"] < 0 else \
        f"in round {e['round']} of 0-{e['rounds'] - 1}"
    text = f"{at} of {which}"
    waiting = e.get("waiting_on")
    if waiting:
        text += f", waiting on rank {waiting['peer']} ({'receive' if waiting['kind'] == 'recv' else waiting['kind']})"
    if e["phase"] == "failed" and e.get("error"):
        text += f", and failed with {e['error'].split(': ', 1)[0]}" + \
            (f" naming rank {e['error_peer']}" if e.get("error_peer") is not None else "")
    return text


def diagnose(records: list[dict]) -> dict:
    """What the records say: who stopped first, the collective in flight, where each rank was,
    and all of it as one paragraph."""
    size = max(r["size"] for r in records)
    by_rank = {r["rank"]: r for r in records}
    silent = [r for r in range(size) if r not in by_rank]
    flights = {rank: _in_flight(rec) for rank, rec in by_rank.items()}
    if not silent and all(e is None or e["phase"] == "done" for e in flights.values()):
        return _healthy(records, flights, size)
    blamed = Counter(e["error_peer"] for e in flights.values() if e and e.get("error_peer") is not None)
    named = [rank for rank, _ in blamed.most_common()]
    first, why = None, ""
    for rank in named:
        if rank in silent:
            first, why = rank, ("it wrote no flight record (it died without a chance to: SIGKILL, the "
                                f"out-of-memory killer, a lost machine), and {_count(blamed[rank], 'rank')} "
                                f"that did named it")
            break
    if first is None:
        if silent:
            first, why = silent[0], "it wrote no flight record, while every other rank did"
        else:
            def behind(rank):
                e = flights[rank]
                return (e["sequence"], e["round"], e["started"]) if e else (0, -1, 0.0)
            first = min(flights, key=behind)
            e = flights[first]
            if len({behind(r)[:2] for r in flights}) > 1:
                why = "it was furthest behind (the lowest collective and round)"
            else:
                why = "no rank was behind another (all at the same collective and round); it is the lowest"
            if e and e["phase"] == "failed":
                why += f", and it failed {_describe(e)} ({e['error']})"
    in_flight = max((e for e in flights.values() if e and e["phase"] != "done"),
                    key=lambda e: e["sequence"], default=None)
    lines = [f"Rank {first} stopped first: {why}."]
    if in_flight is not None:
        failed = sorted(r for r, e in flights.items() if e and e["phase"] == "failed")
        lines.append(f"The collective in flight was {_describe(in_flight)}"
                     + (f"; {_count(len(failed), 'rank')} ({', '.join(map(str, failed))}) failed it"
                        if failed else "") + ".")
    reasons = sorted({rec["reason"] for rec in records})
    places: dict[str, list[int]] = {}
    for rank in range(size):
        places.setdefault(_where(flights[rank], in_flight) if rank in flights else "left no record", []).append(rank)
    lines.append("Where each rank was: " + "; ".join(
        (f"rank {ranks[0]} " if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))} ")
        + ("" if place.startswith(("had ", "left ")) else "was " if len(ranks) == 1 else "were ") + place
        for place, ranks in sorted(places.items(), key=lambda item: item[1][0]))
        + f" (records written on {', '.join(reasons)}).")
    return {"first": first, "silent": silent, "size": size, "healthy": False,
            "collective": in_flight, "ranks": {str(rank): flights.get(rank) for rank in range(size)},
            "paragraph": " ".join(lines)}


def _healthy(records: list[dict], flights: dict, size: int) -> dict:
    """Every rank wrote a record and none has a collective open or failed: nothing went wrong."""
    last = max((e for e in flights.values() if e), key=lambda e: e["sequence"], default=None)
    reasons = ", ".join(sorted({rec["reason"] for rec in records}))
    finished = (f"every rank had finished its last collective, {_describe(last)}" if last is not None
                else "no rank had run a collective")
    paragraph = (f"Nothing went wrong in gradsync's collectives: all {_count(size, 'rank')} wrote a record "
                 f"(on {reasons}), none failed a collective, and {finished}.")
    return {"first": None, "silent": [], "size": size, "collective": None, "healthy": True,
            "ranks": {str(rank): flights.get(rank) for rank in range(size)}, "paragraph": paragraph}


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")
