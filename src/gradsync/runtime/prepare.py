"""From a checked request and a transport to a ``Collective`` ready to start: choose the
algorithm (for "auto"), compile (cached), and set up the ranks' agreement.

This is the engine-independent middle of every all-reduce: ``gradsync.all_reduce`` (over
torch.distributed), ``integrations.mpi.all_reduce`` (over MPI) and the compressed all-reduce's
inner collectives all come through ``build``; tests with their own transports call ``prepare``.
"""

from __future__ import annotations

import json
import time

import torch

from .. import algorithms
from .agree import Agreement, digest, seen_before
from .collective import Collective, Done, Finish, node_buffers
from .compile import compiled, frozen, pick
from .request import Request
from .transport.hosts import local_size


def prepare(tensor, algorithm: str, op: str, transport, deadline: float, *, check: bool = True,
            check_finite: bool = False, options=None, trace=None):
    """The collective of one all-reduce over ``transport`` (any engine), checked and ready to
    start; bad input raises ``ConfigError`` here, before anything is posted.

    Example, with any transport: ``prepare(grad, "ring", "sum", transport, deadline).start().wait()``.
    """
    request = Request.checked(tensor, algorithm, op, max(1e-3, deadline - time.monotonic()), options=options,
                              check=check, check_finite=check_finite, trace=trace)
    return build(request, transport, deadline)


def build(request: Request, transport, deadline: float):
    """The ``Collective`` of a checked ``request`` over ``transport``: "auto" chosen, the plan
    compiled, the agreement set up (before the data the first time a process runs this
    description on the group, riding along with it after). A one-rank group gets ``Done``."""
    tensor, workers = request.tensor, transport.size
    algorithm, options = request.algorithm, dict(request.options)
    if algorithm == "auto":           # a transport with no engine to weigh (threads): the model's choice
        algorithm, picked = pick(tensor, workers)
        options = {**picked, **options}
    spec = algorithms.get(algorithm)
    spec.check_dtype(request.dtype)
    if spec.machine_option is not None and options.get(spec.machine_option) is None:
        # machines as the launcher placed the ranks, else as the group's ranks report their hosts
        group = getattr(transport, "group", False)     # False: no torch.distributed group to ask (MPI, threads)
        options[spec.machine_option] = local_size(workers, group, max(1.0, deadline - time.monotonic()))
    if workers == 1:
        return Done(tensor, transport)
    frozen_options = frozen(options)
    description = describe(request, algorithm, json.loads(frozen_options))
    finite = True     # read before the collective starts: an approximate result must stay finite if this was
    if (request.check_finite or not spec.exact) and tensor.is_floating_point():
        finite = bool(torch.isfinite(tensor).all())
    if request.check_finite or not spec.exact:   # agreed too, so a peer's NaN is named, not blamed on the codec
        description["finite"] = finite
    flat = tensor.view(-1) if tensor.is_contiguous() else tensor.contiguous().view(-1)
    signature = digest(description)
    finish = Finish(tensor, request.op, workers, finite_result=finite and not spec.exact,
                    label=f"{algorithm} with options {frozen_options}")
    c = compiled(algorithm, workers, tensor.numel(), request.dtype, frozen_options, transport.rank)
    agreement = None
    if request.check or request.check_finite:
        known = seen_before(transport.group_key, signature)
        # the first time (or with check_finite), before anything moves; after, riding along
        agreement = Agreement(transport, description, not known or request.check_finite, signature)
    return Collective(c.schedule, c.plan, node_buffers(c.schedule, transport.rank, flat), transport, deadline,
                      agreement, finish, salt=int.from_bytes(signature[:4], "little"), design=c.design,
                      trace=request.trace)


def describe(request: Request, algorithm: str, options: dict) -> dict:
    """What the ranks agree on before using each other's data."""
    tensor = request.tensor
    description = {"shape": list(tensor.shape), "dtype": request.dtype, "algorithm": algorithm, "op": request.op,
                   "options": options, "device": tensor.device.type}
    if request.trace is not None:          # a rank tracing alone would wait for a clock exchange
        description["traced"] = True
    return description
