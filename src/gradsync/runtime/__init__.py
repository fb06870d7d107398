"""Real execution of gradsync schedules between processes: the all-reduce, its collective and
progress engine, agreement, traces, the flight recorder and the transports under them."""

from .api import all_reduce

__all__ = ["all_reduce"]
