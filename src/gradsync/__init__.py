"""gradsync: gradient synchronization for data-parallel training, made real and measurable.

>>> import numpy as np, gradsync
>>> gradsync.emulate("tree", [np.ones(3), np.ones(3)])[0].tolist()
[2.0, 2.0, 2.0]
>>> from gradsync.model.topology import preset
>>> round(gradsync.simulate(gradsync.schedule("ring", 4, 1000), preset("pcie-switch-4")).time * 1e6, 1)
12.4
"""

from .algorithms import REGISTRY as ALGORITHMS
from .algorithms import build as schedule
from .core.emulate import emulate
from .errors import ConfigError, GradsyncError, MismatchError, NonFiniteError, PeerError, ScheduleError, TopologyError
from .core.schedule import Schedule, verify
from .model.simulate import simulate   # the function; its module is gradsync.model.simulate
from .distributed import install as _install_torch_backend

# The one thing importing gradsync does beyond definitions: "gradsync" becomes a torch.distributed
# backend, now if torch.distributed is loaded, else the moment it is (a hook that removes itself),
# so that dist.init_process_group("gradsync") works after `import gradsync` without loading torch here.
_install_torch_backend()

__all__ = ["ALGORITHMS", "ConfigError", "GradsyncError", "MismatchError", "NonFiniteError", "PeerError", "Schedule",
           "ScheduleError", "TopologyError", "all_reduce", "emulate", "schedule", "simulate", "verify"]


def all_reduce(tensor, algorithm="ring", op="sum", group=None, timeout=None, check=True, **options):
    """All-reduce a torch tensor in place between processes; see ``gradsync.runtime.api.all_reduce``.

    Imported lazily so that the schedule, simulator and emulator work without torch loaded.
    """
    from .runtime.api import all_reduce as run

    return run(tensor, algorithm, op, group, timeout, check, **options)
__version__ = "0.1.0"
