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
    """What differs today for matrix entry ``key`` of ``case`` under ``profile``, or None."""
    op, dtype = key.split("/")
    to_engine = profile == "auto" or (case in REDUCING and op not in ("SUM", "AVG"))
    refused = gloo_refuses(case, op, dtype)
    if to_engine and refused:
        return FALSE_FAILURE.format(what=refused)
    if profile == "auto":
        return None
    if case == "all_reduce_every_op_and_dtype" and op in ("SUM", "AVG") and dtype == "bool":
        return (f"{op} of bool: Gloo {'ORs the ranks' if op == 'SUM' else 'raises RuntimeError'}; the schedules "
                "and one_host refuse bool with a ConfigError (runtime/request.py: bool is not in gradsync.dtypes)")
    if case == "all_reduce_every_op_and_dtype" and op == "AVG" and dtype in INTS:
        return "AVG of an integer type: Gloo raises RuntimeError; gradsync a ConfigError (a ValueError): runtime/request.py"
    if profile == "ring" and dtype == "bool" and op in ("SUM", "AVG"):
        return ("bool: Gloo takes it; the ring's halves refuse it with ConfigError 'unknown dtype' "
                "(runtime/halves.py compiles plans only for gradsync.dtypes, which has no bool)")
    if profile == "ring" and case == "reduce_scatter_every_op_and_dtype" and dtype == "complex64" and op in ("SUM", "AVG"):
        return "complex64: Gloo reduces it; the ring's REDUCE half refuses it with ConfigError 'unknown dtype'"
    return None


# --- which cases differ today (strict xfails), by profile ---------------------------------------
ALL = ("auto", "ring", "one_host")
KNOWN = {}      # (profile, case) -> what differs; filled below, read by the parametrization


def known(case: str, profiles, reason: str) -> None:
    for profile in profiles:
        KNOWN[(profile, case)] = reason


SCHEDULES = ("ring", "one_host")
# where in the code, as of the commit these were written against (distributed/, runtime/)
known("allreduce_tensor_list", SCHEDULES, "silent wrong result: several tensors in one allreduce are each reduced "
      "alone (route.py run_schedule / run_one_host: one all_reduce per tensor); Gloo sums across the list and ranks")
known("allreduce_tensor_list_ops", SCHEDULES, "SUM over a list of two tensors reduces each alone (route.py run_schedule)")
known("allreduce_bare_tensor", ALL, "pg.allreduce(t) on a bare tensor: Call.tensor() tests the tensor's truth "
      "(route.py Call.tensor: 'self.inputs or self.outputs'): 'Boolean value of Tensor ... ambiguous'")
known("allreduce_bare_tensor_2d", ALL, "pg.allreduce(t) on a bare 2-D tensor: 'Boolean value of Tensor ... ambiguous' "
      "(route.py Call.tensor)")
known("allreduce_bare_one_element", ("auto",), "pg.allreduce(t), t of one element: the bare tensor reaches Gloo's "
      "allreduce, which takes a list: TypeError (route.py _engine_work)")
known("allreduce_bare_one_element", SCHEDULES, "pg.allreduce(t): the future holds the bare tensor, Gloo's holds [t] "
      "(group.py allreduce passes the tensor as the list; Work's result is call.outputs)")
known("allreduce_op_keyword", ALL, "pg.allreduce([t], op=ReduceOp.MAX): GradsyncGroup.allreduce has no op keyword "
      "(ProcessGroup's overloads (tensors, op=) and (tensor, op=) are not offered): TypeError")
known("allreduce_empty_list", SCHEDULES, "pg.allreduce([]) succeeds (route.py _joined([]) is done at once); Gloo "
      "refuses an empty list with a RuntimeError")
known("allreduce_mixed_dtypes", SCHEDULES, "a list of float32 and float64 tensors is accepted (each reduced alone); "
      "Gloo refuses it: 'invalid tensor type'")
known("allreduce_mixed_sizes", SCHEDULES, "a list of tensors of sizes 1 and 2 is accepted; Gloo refuses: 'invalid tensor size'")
known("all_reduce_premul_sum", ALL, FALSE_FAILURE.format(what="PREMUL_SUM"))
known("all_reduce_sparse", SCHEDULES, "a sparse tensor goes to a schedule, which calls .contiguous() on it "
      "(runtime/prepare.py build): 'unsupported memory format option Contiguous'; Gloo sums sparse tensors")
known("allreduce_sparse_list", SCHEDULES, "sparse tensors go to a schedule instead of the engine (runtime/prepare.py)")
known("all_reduce_meta", ALL, "a meta tensor is sent to Gloo's own allreduce ('unsupported device type meta'); through "
      "torch's ProcessGroup it is a no-op (meta kernels), as on a Gloo group")
known("all_reduce_bool", SCHEDULES, "bool: Gloo ORs it; the schedules refuse it with ConfigError (runtime/request.py: "
      "bool is not in gradsync.dtypes) instead of leaving it to the engine")
known("all_reduce_inference_mode", SCHEDULES, "an inference tensor: the results are written on the progress thread "
      "(shm/ring.py _receive, runtime/reads.py run_piece), outside the caller's inference mode: 'Inplace update to "
      "inference tensor outside InferenceMode'")
known("inference_mode_then_training", ("ring",), "after one all_reduce of an inference tensor fails, every later "
      "collective on the group fails with the same error (the failed receive stays posted in shm/ring.py _receive): "
      "one eval-loop metric breaks training")
known("inference_mode_then_training", ("one_host",), "the all_reduce of an inference tensor fails ('Inplace update "
      "to inference tensor', runtime/reads.py run_piece on another thread); the group works after it")
known("first_call_in_inference_mode", ("ring",), "the group's first collective under inference mode leaves its "
      "buffers inference tensors (allocated in the caller's mode, runtime/scratch.py): that call and every later "
      "one fail")
known("allgather_future_value", ALL, "pg.allgather(outputs, [t]).get_future().value() is [[t0..tN-1]]; Gloo's is "
      "[t0..tN-1] for one input (Work's result is call.outputs as given, route.py / work.py)")
known("gather_future_value", ALL, "pg.gather's future holds [[t0..tN-1]] on the root; Gloo's [t0..tN-1] (route.py "
      "run_engine completes EngineWork with call.outputs)")
known("allgather_several_inputs", SCHEDULES, "n inputs per rank: route.py _half (and run_one_host) gathers one input "
      "into n x N outputs, which the halves refuse (ConfigError); Gloo gathers each input")
known("allgather_empty_lists", SCHEDULES, "pg.allgather([], []) succeeds (route.py _joined([])); Gloo refuses it")
known("allgather_noncontiguous_input", ("one_host",), "a non-contiguous input is refused by one_host (ConfigError, "
      "one_host.py _check) and the message prints the tensor's values; Gloo takes it")
known("all_gather_list_inference_mode", SCHEDULES, "all_gather under inference mode: the copy into the outputs runs "
      "outside the caller's mode (route.py _then on the progress thread): 'Inplace update to inference tensor'")
known("all_gather_into_tensor_inference_mode", SCHEDULES, "all_gather_into_tensor under inference mode: written "
      "outside the caller's mode (shm/ring.py _receive, one_host.py all_gather body): 'Inplace update to inference tensor'")
known("all_gather_into_tensor_strided_output", ("one_host",), "a strided output is refused by one_host (one_host.py "
      "_check) and the message prints the output's uninitialised values; Gloo takes it")
known("reduce_scatter_tensor_strided_output", ("one_host",), "a strided output is refused by one_host and the message "
      "prints its values (one_host.py _check); Gloo takes it")
known("reduce_scatter_noncontiguous_input", ("one_host",), "a non-contiguous input is refused by one_host and the "
      "message prints its values (one_host.py _check); Gloo takes it")
known("all_gather_bool", ("ring",), "bool: the ring's COPY half refuses it (ConfigError 'unknown dtype', "
      "runtime/compile.py via gradsync.dtypes) instead of leaving it to the engine")
known("all_gather_zero_size", ("ring",), "zero elements: the ring has no layout for 0 elements (ConfigError, "
      "halves.py _layout); Gloo's all_gather of nothing succeeds")
known("reduce_scatter_zero_size", ("ring",), "zero elements: ConfigError from halves.py _layout; Gloo succeeds")
known("reduce_scatter_uneven_lists", SCHEDULES, "reduce_scatter of lists with chunks of different sizes: the lists are "
      "concatenated and refused (halves.py _check_pair, one_host.py _check) instead of going to the engine, which takes them")
known("reduce_scatter_tensor_bool", ("ring",), "bool: the ring's REDUCE half refuses it ('unknown dtype')")
known("reduce_scatter_tensor_coalesced", ("auto",), "the engine's coalesced reduce-scatter waits on each Work's "
      "get_future() (route.py _engine_work), which Gloo's reduce_scatter Work lacks: 'Work::getFuture not implemented'")
known("broadcast_root_keyword", ALL, "pg.broadcast(t, root=0): GradsyncGroup.broadcast has no (tensor, root) form: TypeError")
known("broadcast_stress", ALL, "pg.broadcast(t, root=i): TypeError (no (tensor, root) form in group.py broadcast)")
known("broadcast_root_tensor", SCHEDULES, "silent wrong result: opts.rootTensor is ignored, each tensor of the list "
      "is broadcast from itself (route.py _half / run_one_host); Gloo broadcasts the root's tensor rootTensor into all")
known("broadcast_root_minus_one", SCHEDULES, "root -1: ConfigError (a ValueError; halves.py broadcast, one_host.py "
      "broadcast) where Gloo raises RuntimeError 'invalid root rank'")
known("broadcast_root_past_the_end", SCHEDULES, "root = N: ConfigError where Gloo raises RuntimeError 'invalid root rank'")
known("broadcast_empty_list", SCHEDULES, "pg.broadcast([]) succeeds (route.py _joined([])); Gloo refuses it")
known("broadcast_bool", ("ring",), "bool: the tree's COPY half refuses it ('unknown dtype')")
known("broadcast_noncontiguous", ("ring",), "a non-contiguous tensor: halves.py Deliver.apply writes back through "
      "out.view(-1), which a transposed tensor has not: RuntimeError 'view size is not compatible'")
known("broadcast_noncontiguous", ("one_host",), "a non-contiguous tensor is refused by one_host (one_host.py _check), "
      "the message printing its values; Gloo broadcasts it")
known("shorthand_allgather", ALL, "pg.allgather(outputs, t) (torch's one-input form): the bare input tensor's truth "
      "is tested in route.py Call.tensor: 'Boolean value of Tensor ... ambiguous'")
known("shorthand_gather", ALL, "pg.gather(outputs, t, root): 'Boolean value of Tensor ... ambiguous' (route.py Call.tensor)")
known("shorthand_reduce", ALL, "pg.reduce(t, root, op): GradsyncGroup.reduce takes (tensors, opts) only: TypeError")
known("shorthand_reduce_scatter", ALL, "pg.reduce_scatter(output, inputs, op): the ReduceOp is taken for an options "
      "object (group.py reduce_scatter reads opts.reduceOp): AttributeError")
known("barrier_timeout_keyword", ALL, "pg.barrier(timeout=...): GradsyncGroup.barrier has no timeout keyword: TypeError")
known("monitored_barrier", ALL, "dist.monitored_barrier refuses every backend but Gloo ('only implemented for GLOO "
      "backend', torch's own check on get_backend), so GradsyncGroup.monitored_barrier is never reached")
known("ddp_sparse_gradients", SCHEDULES, "DDP with sparse gradients: the sparse all_reduce goes to a schedule "
      "(runtime/prepare.py .contiguous()): 'unsupported memory format option Contiguous'")


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
MISMATCH_KNOWN = {
    ("auto", "shape"): "the engine's all_reduce of different lengths: Gloo gives rank 0 a wrong sum without an "
                       "error and the others a RankFailure blaming rank 0 (nothing checks shapes before the engine)",
    ("auto", "dtype"): "the engine's all_reduce of float64 on one rank and float32 on the others: Gloo aborts a "
                       "rank (SIGABRT) and the others fail naming a rank, not the dtypes",
    ("one_host", "shape"): "one_host says the ranks 'run a different collective (shape, dtype, algorithm or "
                           "options)' without naming the shapes (runtime/one_host.py)",
    ("one_host", "dtype"): "one_host says the ranks run a different collective without naming the dtypes",
}
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


@pytest.mark.xfail(strict=True, reason="without `import gradsync`, torch says only 'Unknown backend type gradsync' "
                                       "(an AssertionError): nothing registers the name or hints at the import")
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


@pytest.mark.parametrize("choice", [
    pytest.param("one_host", marks=pytest.mark.xfail(strict=True, reason="one_host forced on a one-rank group: "
                 "ConfigError \"transport 'shm' needs every rank on one host ...: rank 0 is alone on its host\" "
                 "(runtime/transport/shm/setup.py counts a lone rank as not sharing); Gloo's one-rank collectives "
                 "are copies (PyTorch's ReducerTest and test_collectives run one rank)")),
    pytest.param("shm", marks=pytest.mark.xfail(strict=True, reason="transport shm forced on a one-rank group: the "
                 "same ConfigError 'rank 0 is alone on its host'; Gloo's one-rank collectives work")),
])
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
