"""What the registry holds for each algorithm: an ``AlgorithmSpec`` and its ``Option`` rules.

Every consumer (command line, web view, tuner, cost model, runtime) reads these instead of
knowing algorithms by name, so a registered algorithm appears everywhere at once.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from .. import dtypes as dtype_table
from ..errors import ConfigError

RESERVED = ("auto", "native")   # all_reduce's automatic choice; bench's row for the engine's own
NEEDS = ("host", "switch", "switches")   # helper nodes a schedule may place on a topology
# the narration's names for rounds: by kind of transfer, and by kind and level (inside or across machines)
PHASE_KEYS = ("reduce", "copy", "coded") + tuple(f"{kind} {level}" for kind in ("reduce", "copy", "coded")
                                                 for level in ("inside", "across"))


@dataclass(frozen=True)
class Option:
    """One option of an algorithm: its default and the rule a given value must meet.

    ``expected`` states the rule in words for error messages; ``valid(value)`` applies it.
    None is accepted wherever the default is None (it means "choose for me").

    >>> Option(1, "an integer >= 1", is_int(1)).valid(0)
    False
    """

    default: Any
    expected: str
    valid: Callable[[Any], bool]


def is_int(low: int) -> Callable[[Any], bool]:
    """A rule: an integer (not a bool) >= ``low``. ``is_int(1)(3)`` is True."""
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= low


def is_number(low: float, high: float = float("inf")) -> Callable[[Any], bool]:
    """A rule: a real number in the open interval (``low``, ``high``). ``is_number(0, 1)(0.5)`` is True."""
    return lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and low < v < high


def one_of(*values) -> Callable[[Any], bool]:
    """A rule: one of ``values``. ``one_of("a", "b")("c")`` is False."""
    return lambda v: isinstance(v, str) and v in values


@dataclass(frozen=True, eq=False, kw_only=True)
class AlgorithmSpec:
    """One registry entry: everything gradsync needs to know about an all-reduce algorithm.

    schedule: ``schedule(workers, elements, **options) -> Schedule``, the builder.
    cost: ``cost(workers, nbytes, net, itemsize=4, **options) -> float``, its closed form.
    exact: whether every worker ends with the exact sum (False: an approximation).
    summary: one line saying what it does.
    dtypes: the dtype names it accepts, or None for every float and integer type.
    options: name -> ``Option``; each a keyword of ``schedule`` with the same default.
    phases: what its rounds are called, by kind of transfer ("reduce", "copy", "coded"), for
        narration, e.g. {"reduce": "reduce-scatter", "copy": "all-gather"}; "reduce inside",
        "copy across" and so on name its runs of rounds inside machines or across them.
    lane_name: what one of its lanes is called ("ring", "tree"), where its schedules run
        several (``Schedule.lane``); the narration tells them one by one under that word.
    explanation: a few sentences for learners: what it does, why, its cost, when it wins.
    machine_option: the option that takes the workers per machine (hierarchical's
        ``local_size``), which the runtime fills in from where the ranks run when it is not
        given; None for algorithms that do not group workers into machines.
    shared_buffers: whether, on one host, it runs by reading the peers' buffers directly (its
        transfers are reads, a barrier between rounds: ``runtime.reads``) rather than as
        messages; for schedules whose rounds never read what they write (one_shot, sharded).
    needs: the helper nodes its schedules place on a topology: "host" (the host CPU),
        "switch" (one switch that reduces for all the workers), "switches" (one per machine);
        ``model.cost.runnable`` reads them to leave out what a topology cannot run.

    >>> from gradsync.algorithms import ring
    >>> spec = AlgorithmSpec(name="ring_again", schedule=ring.schedule, cost=ring.cost, exact=True,
    ...                      summary="ring all-reduce, once more")
    >>> spec.schedule(4, 100).rounds
    6
    """

    name: str
    schedule: Callable
    cost: Callable
    exact: bool
    summary: str
    dtypes: tuple[str, ...] | None = None
    options: dict[str, Option] = field(default_factory=dict)
    phases: dict[str, str] = field(default_factory=dict)
    lane_name: str = ""
    explanation: str = ""
    machine_option: str | None = None
    shared_buffers: bool = False
    needs: tuple[str, ...] = ()

    def accepts(self, dtype: str) -> bool:
        """Whether it takes tensors of ``dtype`` (a name): ``get("cerar").accepts("int32")`` is False."""
        return self.dtypes is None or dtype in self.dtypes

    def check_dtype(self, dtype: str) -> None:
        """Raise ConfigError unless it accepts ``dtype``: ``get("cerar").check_dtype("int32")``."""
        if not self.accepts(dtype):
            *most, last = self.dtypes
            wanted = f"{', '.join(most)} or {last}" if most else last
            raise ConfigError(f"algorithm {self.name!r} needs {wanted} tensors, got {dtype}")

    def check_options(self, options: dict) -> None:
        """Raise ConfigError naming the first unknown option or bad value in ``options``.

        >>> from gradsync.algorithms import get
        >>> get("tree").check_options({"segments": 0})
        Traceback (most recent call last):
        ...
        gradsync.errors.ConfigError: algorithm 'tree': option segments must be an integer >= 1, got 0
        """
        for key, value in options.items():
            rule = self.options.get(key)
            if rule is None:
                known = f"expected one of {', '.join(self.options)}" if self.options else "it takes none"
                raise ConfigError(f"bad option {key!r} for algorithm {self.name!r}: {known}")
            if not (value is None and rule.default is None) and not _holds(rule, value):
                raise ConfigError(f"algorithm {self.name!r}: option {key} must be {rule.expected}, got {value!r}")

    def problems(self) -> list[str]:
        """What is wrong with this spec, for ``register``: ``get("ring").problems()`` is []."""
        out = []
        if not isinstance(self.name, str) or not re.fullmatch(r"[a-z][a-z0-9_]*", self.name):
            out.append(f"name must be lowercase letters, digits and underscores, got {self.name!r}")
        elif self.name in RESERVED:
            out.append(f"name {self.name!r} is reserved ({', '.join(RESERVED)})")
        for role in ("schedule", "cost"):
            if not callable(getattr(self, role)):
                out.append(f"{role} must be a function, got {getattr(self, role)!r}")
        if not isinstance(self.exact, bool):
            out.append(f"exact must be True or False, got {self.exact!r}")
        if not isinstance(self.summary, str) or not self.summary.strip() or "\n" in self.summary:
            out.append(f"summary must be one non-empty line, got {self.summary!r}")
        known_dtypes = dtype_table.names()
        if self.dtypes is not None and (not isinstance(self.dtypes, tuple) or not self.dtypes
                                        or not set(self.dtypes) <= set(known_dtypes)):
            out.append(f"dtypes must be None or a non-empty tuple of {', '.join(known_dtypes)}, got {self.dtypes!r}")
        if not isinstance(self.phases, dict) or not set(self.phases) <= set(PHASE_KEYS) \
                or not all(isinstance(v, str) and v for v in self.phases.values()):
            out.append(f"phases must map some of {', '.join(PHASE_KEYS)} to names, got {self.phases!r}")
        if not isinstance(self.lane_name, str) or "\n" in self.lane_name:
            out.append(f"lane_name must be one word or phrase, got {self.lane_name!r}")
        if not isinstance(self.shared_buffers, bool):
            out.append(f"shared_buffers must be True or False, got {self.shared_buffers!r}")
        if not isinstance(self.needs, tuple) or not set(self.needs) <= set(NEEDS):
            out.append(f"needs must be a tuple of {', '.join(NEEDS)}, got {self.needs!r}")
        if not isinstance(self.explanation, str):
            out.append(f"explanation must be a string, got {self.explanation!r}")
        if not isinstance(self.options, dict):
            return out + [f"options must be a dict of name -> Option, got {self.options!r}"]
        if self.machine_option is not None and self.machine_option not in self.options:
            out.append(f"machine_option must be None or one of its options, got {self.machine_option!r}")
        return out + self._option_problems()

    def _option_problems(self) -> list[str]:
        # The defaults are what `gradsync list` shows: they must be the builder's own.
        try:
            params = inspect.signature(self.schedule).parameters
        except (TypeError, ValueError):
            return []
        out = []
        for key, rule in self.options.items():
            if not isinstance(rule, Option):
                out.append(f"option {key!r} must be an Option, got {rule!r}")
            elif key not in params:
                out.append(f"option {key!r} is not a keyword of {self.schedule.__name__}()")
            elif params[key].default != rule.default:
                out.append(f"option {key!r} has default {rule.default!r} but {self.schedule.__name__}() "
                           f"uses {params[key].default!r}")
        return out


def _holds(rule: Option, value) -> bool:
    try:
        return bool(rule.valid(value))
    except (TypeError, ValueError):   # a rule written for the right type meeting another
        return False
