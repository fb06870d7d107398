"""``gradsync.torch.comm_hook``: the DDP communication hook (``gradsync.integrations.ddp``)."""

from .integrations.ddp import comm_hook

__all__ = ["comm_hook"]
