"""The exceptions gradsync raises.

Two kinds of error, as in Gloo: bad input is a ``GradsyncError`` subclass raised at the
boundary where the input enters, with the bad value, the rule and the reason in the message;
broken internal logic is an ``AssertionError``.
"""


class GradsyncError(Exception):
    """Base class of every error gradsync raises on purpose."""


class ConfigError(GradsyncError, ValueError):
    """A value given by the user breaks a rule (bad size, unknown algorithm, bad option).

    Recoverable: nothing was changed; fix the value and call again.
    """


class TopologyError(ConfigError):
    """A topology file or preset is malformed. The message names the bad field.

    Recoverable: nothing was loaded.
    """


class ScheduleError(GradsyncError):
    """A schedule fails verification (unmatched transfer, double-counted input, ...).

    Not recoverable for that schedule: the algorithm that built it, or the file it came
    from, is wrong.
    """


class PeerError(GradsyncError):
    """A peer did not answer in time, or its connection broke, during a collective.

    ``peer`` is the rank that failed to answer (as seen from this rank), ``op`` what was being
    waited for. The collective's result is undefined: do not use the tensor. Recoverable only
    by re-forming the group (elastic training).
    """

    def __init__(self, message: str, peer: int | None = None, op: str | None = None):
        super().__init__(message)
        self.peer, self.op = peer, op


class MismatchError(ConfigError):
    """Ranks called a collective with different shapes, dtypes, algorithms or options.

    Raised on every rank before any data moves; nothing was changed.
    """


class NonFiniteError(GradsyncError):
    """A result turned NaN or Inf from finite input: an approximate all-reduce's result, or the
    training loss. The message names where (rank, step) and with what (algorithm, options).

    Not recoverable for that result: do not use it. Choose an accurate design (fewer CERAR
    components, an exact algorithm) or a lower learning rate, and run again.
    """
