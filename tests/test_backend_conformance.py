"""The gradsync backend against Gloo, call by call: the cases PyTorch's own collective tests
(test/distributed/test_c10d_gloo.py, run against both by benchmarks/c10d_conformance.py) found to
differ, and their neighbours, as gradsync's own tests.

Each case (tests/conformance_bodies.py) runs on a fresh Gloo group and a fresh gradsync group in
the same processes; a test asserts that gradsync did what Gloo did there and then: the same values
(exactly: the data are small integers), the same future value, or an exception of Gloo's kind
(TypeError for TypeError, RuntimeError for RuntimeError), never a ``RankFailure`` naming a live rank
for an argument Gloo merely refuses, never a message that prints the tensor's contents. Where
Gloo refuses a dtype or op that gradsync computes, gradsync's value must be the numpy reference.

Profiles: "auto" (measuring off, so auto's own path ends at the engine: deterministic), and, with
-m slow, "ring" (the schedules for every collective that takes them) and "one_host" (the
shared-buffer collectives). The default run starts one launch of 3 ranks; -m slow one more.

Cases that differ on today's backend are strict xfails, each saying what differs: one that
starts to conform fails the run until its marker is removed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest
import torch

import conformance_bodies as bodies
from gradsync.tools.launch import run

WORKERS = 3
SLOW_PROFILES = ("ring", "one_host")
SLOW_CASES = ("ddp_sparse_gradients", "ddp_dense_gradients")      # DDP's first use costs seconds a rank
MATRICES = ("all_reduce_every_op_and_dtype", "reduce_scatter_every_op_and_dtype", "all_gather_every_dtype",
            "broadcast_every_dtype")
FAMILIES = ("TypeError", "ValueError", "IndexError", "KeyError", "AttributeError", "AssertionError", "RuntimeError")
_launches: dict = {}


def _plan(slow: bool) -> list:
    if not slow:
        return [("auto", n) for n in bodies.CASES if n not in SLOW_CASES]
    return [("auto", n) for n in SLOW_CASES] + [(p, n) for p in SLOW_PROFILES for n in bodies.CASES]


def results(profile: str, name: str) -> list:
    """Every rank's {"gloo": ..., "gradsync": ...} for ``name`` under ``profile`` (one launch for
    the default cases, one for the slow ones, each started when first asked for)."""
    slow = profile != "auto" or name in SLOW_CASES
    if slow not in _launches:
        with pytest.MonkeyPatch.context() as env:
            env.setenv("GRADSYNC_AUTO_BUDGET", "0")              # auto without measuring: the engine
            env.setenv("GRADSYNC_AUTO_CACHE", os.path.join(tempfile.mkdtemp(), "auto.json"))
            env.delenv("GRADSYNC_ALGORITHMS", raising=False)
            _launches[slow] = run(bodies.run_cases, WORKERS, _plan(slow), timeout=120, tolerate=True)
    ranks = _launches[slow]
    failed = [f"rank {r}: {x}" for r, x in enumerate(ranks) if isinstance(x, BaseException)]
    assert not failed, "; ".join(failed)
    return [r[(profile, name)] for r in ranks]


def _short(outcome) -> str:
    text = repr(outcome.get("value", outcome))
    return text if len(text) < 160 else text[:157] + "..."


def difference(gloo: dict, mine: dict, reference=None) -> str | None:
    """None where gradsync's outcome is Gloo's; else what differs, in one line. ``reference``:
    the right value (described), accepted from gradsync where Gloo refuses the call."""
    if "raised" in mine and "tensor(" in mine["message"]:
        return f"gradsync's message prints the tensor's contents instead of its shape/dtype: {mine['message'][:150]}"
    if "value" in gloo:
        if "raised" in mine:
            return f"Gloo gives {_short(gloo)}; gradsync raises {mine['raised']}: {mine['message'][:200]}"
        return None if mine["value"] == gloo["value"] else f"Gloo gives {_short(gloo)}; gradsync {_short(mine)}"
    if "value" in mine:
        if reference is not None and mine["value"] == reference:
            return None
        return f"Gloo raises {gloo['raised']} ({gloo['message'][:120]}); gradsync gives {_short(mine)}"
    family = next((c for c in gloo["mro"] if c in FAMILIES), gloo["raised"])
    if family not in mine["mro"]:
        return (f"Gloo raises {gloo['raised']} ({gloo['message'][:100]}); gradsync raises {mine['raised']}, "
                f"not a {family}: {mine['message'][:150]}")
    if "DistBackendError" in mine["mro"] and "DistBackendError" not in gloo["mro"]:
        return (f"Gloo refuses the argument ({gloo['message'][:100]}); gradsync reports a failed rank: "
                f"{mine['message'][:200]}")
    return None


def _first_difference(rows, pick=lambda side: side, reference=lambda rank: None) -> str | None:
    """The first rank's difference (``pick`` chooses what of each side to compare), or None."""
    for rank, row in enumerate(rows):
        found = difference(pick(row["gloo"]), pick(row["gradsync"]), reference(rank))
        if found:
            return f"rank {rank}: {found}"
    return None


BITWISE = ("BAND", "BOR", "BXOR")


def matrix_reference(case: str, key: str):
    """What ``case`` should give for matrix entry ``key`` ("OP/dtype"), described, from numpy on
    every rank's ``matrix_input`` (float64, or int64 bitwise); None where no value is right (AVG
    of integers, bitwise ops of floats, complex)."""
    op, dtype = key.split("/")
    inputs = [bodies.matrix_input(r, key) for r in range(WORKERS)]
    if case == "all_gather_every_dtype":
        return bodies.described(torch.cat(inputs))
    if case == "broadcast_every_dtype":
        return bodies.described(inputs[-1])
    floating = dtype in ("float16", "bfloat16", "float32", "float64")
    if dtype == "complex64" or (op == "AVG" and not floating) or (op in BITWISE and floating):
        return None
    stacked = np.stack([t.to(torch.int64 if not floating else torch.float64).numpy() for t in inputs])
    reduce = {"SUM": np.sum, "AVG": np.mean, "PRODUCT": np.prod, "MIN": np.min, "MAX": np.max,
              "BAND": np.bitwise_and.reduce, "BOR": np.bitwise_or.reduce, "BXOR": np.bitwise_xor.reduce}[op]
    if dtype == "bool":
        reduce = {"SUM": np.any, "MAX": np.any, "BOR": np.any, "PRODUCT": np.all, "MIN": np.all, "BAND": np.all,
                  "BXOR": lambda a, axis: np.bitwise_xor.reduce(a, axis=axis) != 0}[op]
    return bodies.described(torch.from_numpy(np.asarray(reduce(stacked, axis=0))).to(getattr(torch, dtype)))


INTS = ("int8", "uint8", "int16", "int32", "int64")
FLOATS = ("float16", "bfloat16", "float32", "float64")
REDUCING = ("all_reduce_every_op_and_dtype", "reduce_scatter_every_op_and_dtype")
FALSE_FAILURE = ("the engine (Gloo) refuses {what}, and gradsync reports that as a RankFailure naming a live "
                 "rank (distributed/record.py named_failure treats every RuntimeError of the engine as a "
                 "dead peer) instead of Gloo's RuntimeError")


def gloo_refuses(case: str, op: str, dtype: str) -> str | None:
    """What Gloo does not take among the matrix's (op, dtype) pairs, in words, or None."""
    if dtype == "int16":
        return "int16 ('Invalid scalar type')"
    if case in REDUCING and op == "AVG" and dtype in INTS + ("bool",):
        return f"AVG of {dtype}"
    if case in REDUCING and op in BITWISE and dtype in FLOATS:
        return f"{op} of {dtype}"
    if case == "reduce_scatter_every_op_and_dtype" and dtype == "complex64" and op not in ("SUM", "AVG"):
        return f"{op} of complex64"
    return None


def known_in_matrix(profile: str, case: str, key: str) -> str | None:
    """What differs today for matrix entry ``key`` of ``case`` under ``profile``, or None: nothing
    since the backend sends what a schedule or the shared buffers cannot reduce to the engine and
    keeps the engine's argument errors its own (the list kept for the next difference found)."""
    return None


# --- which cases differ today (strict xfails), by profile ---------------------------------------
ALL = ("auto", "ring", "one_host")
KNOWN = {}      # (profile, case) -> what differs; filled below, read by the parametrization


def known(case: str, profiles, reason: str) -> None:
    for profile in profiles:
        KNOWN[(profile, case)] = reason


SCHEDULES = ("ring", "one_host")
known("monitored_barrier", ALL, "dist.monitored_barrier refuses every backend but Gloo ('only implemented for GLOO "
      "backend', torch's own check on get_backend, before any backend code): gradsync offers "
      "gradsync.distributed.monitored_barrier(group), which runs the engine's (test_backend.py holds it)")


def _params():
    out = []
    for profile in ALL:
        for name in bodies.CASES:
            if name in MATRICES:
                continue
            marks = [pytest.mark.slow] if profile != "auto" or name in SLOW_CASES else []
            if (profile, name) in KNOWN:
                marks.append(pytest.mark.xfail(strict=True, reason=KNOWN[(profile, name)]))
            out.append(pytest.param(profile, name, marks=marks, id=f"{profile}-{name}"))
    return out


def test_every_case_is_checked_once():
    assert set(bodies.CASES) - set(MATRICES) == {p.values[1] for p in _params()}
    assert all((p, c) in {(q.values[0], q.values[1]) for q in _params()} for p, c in KNOWN), "a KNOWN entry names no test"


def test_the_comparison_can_fail():
    value = {"value": {"dtype": "torch.float32", "shape": [1], "values": [28.0]}}
    other = {"value": {"dtype": "torch.float32", "shape": [1], "values": [12.0]}}
    runtime = {"raised": "RuntimeError", "mro": ["RuntimeError", "Exception"], "message": "invalid root rank"}
    config = {"raised": "ConfigError", "mro": ["ConfigError", "ValueError", "Exception"], "message": "bad root"}
    rank_failure = {"raised": "RankFailure", "mro": ["RankFailure", "DistBackendError", "RuntimeError"],
                    "message": "rank 2 failed"}
    contents = {"raised": "RuntimeError", "mro": ["RuntimeError"], "message": "got tensor([1., 2.])"}
    assert difference(value, value) is None and difference(runtime, runtime) is None
    assert "28.0" in difference(value, other)
    assert "not a RuntimeError" in difference(runtime, config)
    assert "failed rank" in difference(runtime, rank_failure)
    assert "contents" in difference(runtime, contents)
    assert "gradsync gives" in difference(runtime, value)
    assert difference(runtime, value, reference=value["value"]) is None


@pytest.mark.parametrize("profile,name", _params())
def test_gradsync_does_what_gloo_does(profile, name):
    found = _first_difference(results(profile, name))
    assert found is None, f"{name} under {profile}: {found}"


def _matrix_params():
    out = []
    for profile in ALL:
        for case in MATRICES:
            keys = [k for k in bodies.MATRIX if case.endswith("op_and_dtype") or k.startswith("SUM/")]
            for key in keys:
                marks = [pytest.mark.slow] if profile != "auto" else []
                reason = known_in_matrix(profile, case, key)
                if reason:
                    marks.append(pytest.mark.xfail(strict=True, reason=reason))
                out.append(pytest.param(profile, case, key, marks=marks, id=f"{profile}-{case}-{key}"))
    return out


@pytest.mark.parametrize("profile,case,key", _matrix_params())
def test_every_op_and_dtype_as_gloo(profile, case, key):
    def entry(side):
        return side["value"][key] if "value" in side else side

    found = _first_difference(results(profile, case), entry, lambda rank: matrix_reference(case, key))
    assert found is None, f"{case} {key} under {profile}: {found}"


# --- beyond Gloo: ranks that disagree, and the backend's name without the import -----------------
MISMATCH_KNOWN: dict = {}      # (profile, what) -> what differs; empty since every profile names the shapes and dtypes
_mismatches: dict = {}


def _mismatch_params():
    out = []
    for profile in ALL:
        for what in ("shape", "dtype"):
            marks = [pytest.mark.slow]
            if (profile, what) in MISMATCH_KNOWN:
                marks.append(pytest.mark.xfail(strict=True, reason=MISMATCH_KNOWN[(profile, what)]))
            out.append(pytest.param(profile, what, marks=marks, id=f"{profile}-{what}"))
    return out


@pytest.mark.parametrize("profile,what", _mismatch_params())
def test_ranks_that_disagree_on_shape_or_dtype_all_fail_naming_what_differs(profile, what):
    if (profile, what) not in _mismatches:
        with pytest.MonkeyPatch.context() as env:
            env.setenv("GRADSYNC_AUTO_BUDGET", "0")
            env.setenv("GRADSYNC_AUTO_CACHE", os.path.join(tempfile.mkdtemp(), "auto.json"))
            env.delenv("GRADSYNC_ALGORITHMS", raising=False)
            _mismatches[(profile, what)] = run(bodies.mismatched_across_ranks, WORKERS, profile, what, timeout=60,
                                               tolerate=True)
    named = ([f"[{4 + r}]" for r in range(WORKERS)] if what == "shape" else ["float64", "float32"]) + [what]
    for rank, result in enumerate(_mismatches[(profile, what)]):
        assert not isinstance(result, BaseException), f"rank {rank}: {result}"
        assert "raised" in result, f"rank {rank} got a value from a mismatched all_reduce: {result}"
        assert result["seconds"] <= bodies.MISMATCH_TIMEOUT + 2, f"rank {rank} took {result['seconds']:.1f} s"
        assert all(n in result["message"] for n in named), f"rank {rank}: {result['message']}"


def test_the_backend_name_without_importing_gradsync_works_or_says_to_import_it():
    code = ("import torch.distributed as dist\n"
            "try:\n"
            "    dist.init_process_group('gradsync', store=dist.HashStore(), rank=0, world_size=1)\n"
            "    print('initialized')\n"
            "except Exception as exc:\n"
            "    print(type(exc).__name__, exc)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("initialized") or "import gradsync" in out.stdout, out.stdout


def _one_rank_calls(group) -> dict:
    """What a few collectives give on a one-rank ``group`` (in this process), described."""
    import torch.distributed as dist

    def calls():
        t = torch.arange(4.0)
        dist.all_reduce(t, group=group)
        part = torch.empty(4)
        dist.reduce_scatter_tensor(part, torch.arange(4.0) * 2, group=group)
        whole = torch.empty(4)
        dist.all_gather_into_tensor(whole, torch.arange(4.0) + 1, group=group)
        dist.broadcast(whole, src=0, group=group)
        dist.barrier(group=group)
        return [t, part, whole]

    return bodies.outcome(lambda g, r, w: calls(), group, 0, 1)


@pytest.mark.parametrize("choice", ["one_host", "shm"])
def test_a_one_rank_group_under_a_forced_choice_does_what_gloo_does(choice):
    import datetime

    import torch.distributed as dist

    import gradsync.distributed

    gradsync.distributed.register()
    settings = dict.fromkeys(bodies.KINDS, "one_host") if choice == "one_host" else \
        dict(all_reduce="ring", reduce_scatter="ring", all_gather="ring", broadcast="tree", transport="shm")
    try:
        gradsync.distributed.configure(**settings)
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1,
                                timeout=datetime.timedelta(seconds=20))
        rows = {backend: _one_rank_calls(dist.new_group(backend=backend)) for backend in ("gloo", "gradsync")}
    finally:
        gradsync.distributed.configure(**{k: None for k in gradsync.distributed.config.SETTINGS})
        if dist.is_initialized():
            dist.destroy_process_group()
    found = difference(rows["gloo"], rows["gradsync"])
    assert found is None, f"one rank under {choice}: {found}"


def test_the_group_s_timeout_reads_and_changes_as_gloo_s():
    """PyTorch's test_set_gloo_pg_timeout on the group itself, beside ProcessGroupGloo made the
    same way: ``options._timeout`` is the group's timeout and ``_set_default_timeout`` changes
    it, for the engine and for the bound within which gradsync names a failed peer."""
    import datetime

    import torch.distributed as dist

    import gradsync.distributed

    gradsync.distributed.register()
    made = datetime.timedelta(seconds=50)
    dist.init_process_group("gradsync", store=dist.HashStore(), rank=0, world_size=1, timeout=made)
    try:
        ours = dist.distributed_c10d._get_default_group()
        ours.communicator()                          # made before the change: it must follow it
        groups = {"gloo": dist.ProcessGroupGloo(dist.HashStore(), 0, 1, made), "gradsync": ours}
        seen = {}
        for name, pg in groups.items():
            pg.allreduce([torch.ones(10)]).wait()
            before = pg.options._timeout
            pg._set_default_timeout(datetime.timedelta(seconds=23))
            seen[name] = (before, pg.options._timeout)
        assert seen["gradsync"] == seen["gloo"] == (made, datetime.timedelta(seconds=23))
        assert ours.timeout == 23.0 and ours.communicator().timeout == 23.0
    finally:
        dist.destroy_process_group()
