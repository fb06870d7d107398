"""Real execution of gradsync schedules between processes (torch.distributed)."""

from .api import all_reduce
from .launch import run

__all__ = ["all_reduce", "run"]
