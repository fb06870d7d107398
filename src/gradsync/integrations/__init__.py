"""Where training code plugs in: the DDP communication hook (``ddp``), the KVStore
(``kvstore``), bucketed all-reduce (``bucketing``) and the entry point for mpirun scripts
(``mpi``)."""

from .bucketing import all_reduce_coalesced
from .kvstore import KVStore

__all__ = ["KVStore", "all_reduce_coalesced"]
