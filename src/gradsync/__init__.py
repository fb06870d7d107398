"""gradsync: gradient synchronization for data-parallel training, made real and measurable.

>>> import numpy as np, gradsync
>>> gradsync.emulate("tree", [np.ones(3), np.ones(3)])[0].tolist()
[2.0, 2.0, 2.0]
"""

from .algorithms import REGISTRY as ALGORITHMS
from .algorithms import build as schedule
from .emulate import emulate
from .errors import ConfigError, GradsyncError, ScheduleError, TopologyError
from .schedule import Schedule, verify

__all__ = ["ALGORITHMS", "ConfigError", "GradsyncError", "Schedule", "ScheduleError",
           "TopologyError", "emulate", "schedule", "verify"]
__version__ = "0.1.0"
