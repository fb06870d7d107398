"""Real execution of gradsync schedules between processes (torch.distributed)."""

from .api import all_reduce
from .bucketing import all_reduce_coalesced
from .kvstore import KVStore
from .launch import run

__all__ = ["KVStore", "all_reduce", "all_reduce_coalesced", "run"]
