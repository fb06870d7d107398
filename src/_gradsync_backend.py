"""Makes ``init_process_group("gradsync")`` work without ``import gradsync`` first.

torch 2.13 finds no process-group backends through entry points, so a name it does not know ends
in "Unknown backend type gradsync". But ``import torch`` calls the "torch.backends" entry points
(its device-extension autoload), and gradsync's (pyproject.toml) is ``install()``: it costs a
few microseconds and imports nothing. When torch.distributed is imported, it registers the
"gradsync" backend, whose creator imports gradsync only when a gradsync group is made.
``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` turns torch's autoload off; then ``import gradsync`` is needed.
"""

import importlib.abc
import importlib.util
import sys

_TORCH_DISTRIBUTED = "torch.distributed"


def _create(opts, backend_options=None):
    from gradsync.distributed.group import create

    return create(opts, backend_options)


def _register(dist) -> None:
    if hasattr(dist, "Backend") and dist.is_available() and "GRADSYNC" not in dist.Backend._plugins:
        dist.Backend.register_backend("gradsync", _create, extended_api=True, devices=["cpu"])


class _AfterTorchDistributed(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps torch.distributed's loader so that the backend is registered
    right after that module has executed, then steps aside."""

    def find_spec(self, name, path=None, target=None):
        if name != _TORCH_DISTRIBUTED:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            try:
                _register(module)
            except Exception:        # never break torch's import over a convenience
                pass

        spec.loader.exec_module = exec_module
        return spec


def install() -> None:
    """Register the backend when torch.distributed is imported (now, if it already is)."""
    if _TORCH_DISTRIBUTED in sys.modules:
        _register(sys.modules[_TORCH_DISTRIBUTED])
    elif not any(isinstance(f, _AfterTorchDistributed) for f in sys.meta_path):
        sys.meta_path.append(_AfterTorchDistributed())
