"""Compression codecs against numpy float64 references of the same method, run multi-rank over
the in-memory transport; error feedback keeps the accumulated error bounded."""

import threading
import time

import numpy as np
import pytest
import torch

from gradsync import compression
from gradsync.compression import powersgd, topk
from gradsync.errors import ConfigError
from gradsync.runtime.compressed import CompressedAllReduce, TransportExchange, gather_offsets
from gradsync.runtime.transport import MemoryTransport


def run_steps(steps, spec, algorithm="ring", op="sum", traces=None, **options):
    """Each rank's result per step: ``steps[t][r]`` is rank r's input at step t; every rank has
    its own codec (its own error feedback), as separate processes would. ``traces``: one
    ``Trace`` per rank to record in."""
    workers = len(steps[0])
    transports = MemoryTransport.group(workers, seed=7)
    codecs = [compression.make(spec) for _ in range(workers)]
    out = [[None] * workers for _ in steps]

    def rank(r):
        try:
            for t, inputs in enumerate(steps):
                x = inputs[r].clone()
                exchange = TransportExchange(transports[r], algorithm, options, time.monotonic() + 20,
                                             trace=traces[r] if traces else None)
                CompressedAllReduce(x, codecs[r], exchange, op, key="bucket").start(inline=True).wait()
                out[t][r] = x
        except Exception as exc:        # noqa: BLE001 - reported to the test
            out[len(steps) - 1][r] = exc

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for row in out:
        for x in row:
            if isinstance(x, Exception):
                raise x
    return out


def gradients(rng, workers, elements, steps=1):
    return [[torch.tensor(rng.standard_normal(elements), dtype=torch.float32) for _ in range(workers)]
            for _ in range(steps)]


def as64(steps):
    return [[x.double().numpy() for x in row] for row in steps]


def same_on_every_rank(out):
    for row in out:
        for x in row[1:]:
            assert torch.equal(x, row[0])


# --- references: the methods in numpy float64, written from their papers -----------------------

def ref_cast(xs, dtype):
    n = len(xs)
    cast = [torch.tensor(x / n, dtype=torch.float32).to(dtype).double().numpy() for x in xs]
    return n * np.sum(cast, axis=0)


def ref_topk(steps, ratio):
    errors = [np.zeros_like(x) for x in steps[0]]
    outs = []
    for xs in steps:
        total = np.zeros_like(xs[0])
        for w, x in enumerate(xs):
            work = x + errors[w]
            k = topk.kept(len(x), ratio)
            keep = np.argpartition(-np.abs(work), k - 1)[:k]
            total[keep] += work[keep]
            errors[w] = work.copy()
            errors[w][keep] = 0
        outs.append(total)
    return outs


def ref_sign(steps):
    errors = [np.zeros_like(x) for x in steps[0]]
    outs = []
    for xs in steps:
        total = np.zeros_like(xs[0])
        for w, x in enumerate(xs):
            work = x + errors[w]
            sent = np.abs(work).mean() * np.where(work >= 0, 1.0, -1.0)
            total += sent
            errors[w] = work - sent
        outs.append(total)
    return outs


def ref_powersgd(steps, r):
    n = len(steps[0][0])
    rows, cols = powersgd.shape(n)
    r = min(r, rows, cols)
    q = powersgd.initial_q(cols, r).double().numpy()
    errors = [np.zeros(n) for _ in steps[0]]
    outs = []
    for xs in steps:
        ms = []
        for w, x in enumerate(xs):
            m = np.zeros(rows * cols)
            m[:n] = x + errors[w]
            ms.append(m.reshape(rows, cols))
        p_hat, _ = np.linalg.qr(sum(m @ q for m in ms))
        qs = [m.T @ p_hat for m in ms]
        for w, m in enumerate(ms):
            errors[w] = (m - p_hat @ qs[w].T).reshape(-1)[:n]
        q = sum(qs)
        outs.append((p_hat @ q.T).reshape(-1)[:n])
    return outs


def close(result, reference, tol):
    scale = np.abs(reference).max() or 1.0
    assert np.abs(result.double().numpy() - reference).max() <= tol * scale


# --- the codecs against their references ------------------------------------------------------

@pytest.mark.parametrize("workers,elements", [(2, 1), (3, 1000), (5, 777)])
@pytest.mark.parametrize("name,dtype", [("fp16", torch.float16), ("bf16", torch.bfloat16)])
def test_cast_matches_reference(rng, workers, elements, name, dtype):
    steps = gradients(rng, workers, elements)
    out = run_steps(steps, name)
    same_on_every_rank(out)
    reference = ref_cast(as64(steps)[0], dtype)
    # summing in the narrow type along the ring adds one rounding per hop
    close(out[0][0], reference, (workers + 1) * (2**-10 if dtype == torch.float16 else 2**-7))
    # the sum really travelled in the narrow type: result / N is representable in it
    shared = out[0][0] / workers
    assert torch.equal(shared.to(dtype).float(), shared)


@pytest.mark.parametrize("algorithm", ["ring", "tree", "halving_doubling"])
def test_cast_under_any_exact_schedule(rng, algorithm):
    steps = gradients(rng, 4, 500)
    close(run_steps(steps, "fp16", algorithm)[0][0], ref_cast(as64(steps)[0], torch.float16), 5 * 2**-10)


@pytest.mark.parametrize("workers,elements,ratio", [(2, 10, 0.3), (3, 1000, 0.01), (4, 513, 0.05), (5, 7, 1)])
def test_topk_matches_reference_over_steps(rng, workers, elements, ratio):
    steps = gradients(rng, workers, elements, steps=3)
    out = run_steps(steps, f"topk:ratio={ratio}")
    same_on_every_rank(out)
    for t, reference in enumerate(ref_topk(as64(steps), ratio)):
        close(out[t][0], reference, 1e-5)


@pytest.mark.parametrize("workers,elements", [(2, 1), (3, 1000), (4, 13)])
def test_sign_matches_reference_over_steps(rng, workers, elements):
    steps = gradients(rng, workers, elements, steps=3)
    out = run_steps(steps, "sign")
    same_on_every_rank(out)
    for t, reference in enumerate(ref_sign(as64(steps))):
        close(out[t][0], reference, 1e-5)


@pytest.mark.parametrize("workers,elements,r", [(2, 100, 1), (3, 1000, 4), (4, 37, 2), (2, 3, 8)])
def test_powersgd_matches_reference_over_steps(rng, workers, elements, r):
    steps = gradients(rng, workers, elements, steps=3)
    out = run_steps(steps, f"powersgd:rank={r}")
    same_on_every_rank(out)
    for t, reference in enumerate(ref_powersgd(as64(steps), r)):
        close(out[t][0], reference, 1e-4)


def test_powersgd_full_rank_is_exact(rng):
    """With r = cols the projection keeps everything: the exact sum."""
    steps = gradients(rng, 3, 16)
    out = run_steps(steps, "powersgd:rank=4")
    close(out[0][0], np.sum(as64(steps)[0], axis=0), 1e-5)


def test_average_divides_the_sum(rng):
    steps = gradients(rng, 3, 200)
    close(run_steps(steps, "sign", op="avg")[0][0], ref_sign(as64(steps))[0] / 3, 1e-5)


@pytest.mark.parametrize("spec", ["topk:ratio=0.1", "sign", "powersgd:rank=1"])
def test_error_feedback_keeps_the_accumulated_error_bounded(rng, spec):
    """Sum over steps of (decompressed aggregate - exact sum): with error feedback it is minus
    the errors still carried, bounded; without, every step adds the same bias."""
    workers, elements, total = 3, 400, 40
    base = [rng.standard_normal(elements) for _ in range(workers)]
    steps = [[torch.tensor(b + 0.1 * rng.standard_normal(elements), dtype=torch.float32) for b in base]
             for _ in range(total)]
    exact = [np.sum(row, axis=0) for row in as64(steps)]

    def accumulated(options):
        out = run_steps(steps, spec + options)
        return [np.linalg.norm(np.sum([out[t][0].double().numpy() - exact[t] for t in range(s)], axis=0))
                for s in (10, 20, total)]

    with_ef = accumulated("")
    without = accumulated((":" if ":" not in spec else ",") + "error_feedback=false")
    assert with_ef[-1] <= 2 * max(with_ef[0], with_ef[1])      # no growth with the number of steps
    assert without[-1] >= 3 * without[0]                      # grows about linearly without
    assert with_ef[-1] < without[-1] / 2


def test_fp16_packets_over_cerar_match_a_numpy_run_and_are_refused_by_default():
    from gradsync.coding import cerar
    from gradsync.runtime.compressed import emulate

    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(2048, generator=g) for _ in range(4)]
    exact = torch.stack(xs).double().sum(0)
    # c = 8 > N = 4: 1.25 of the gradient per worker in float16, against the fp16 ring's 1.5
    out = emulate("fp16", xs, "cerar", components=8, eps=0.01, max_error=0.5).double().numpy()
    design = cerar.make(4, 8, eps=0.01, dtype="float16", max_error=None)
    ref = cerar.emulate(design, (torch.stack(xs) / 4).half().numpy())[0].astype(np.float64) * 4
    assert np.abs(out - ref).max() <= 1e-3 * np.abs(ref).max()
    error = np.linalg.norm(out - exact.numpy()) / np.linalg.norm(exact.numpy())
    assert 2**-11 < error < 0.03       # far above fp16's rounding, at most a few percent
    with pytest.raises(ConfigError, match="in float16, above max_error = 0.01; the largest c that meets it "
                                          "for N = 4 in float16 is 4"):
        emulate("fp16", xs, "cerar", components=8)


@pytest.mark.parametrize("spec,collectives", [
    ("powersgd:rank=1", [("ring", 32 * 4), ("ring", 32 * 4)]),     # P then Q of a 32 x 32 matrix, rank 1
    ("sign", [("ring_all_gather", 3 * (1024 // 8 + 4))]),                   # 3 workers' bits and scale
])
def test_a_trace_records_each_collective_of_a_codec(rng, spec, collectives):
    from gradsync.runtime.tracing import Trace

    traces = [Trace() for _ in range(3)]
    steps = gradients(rng, 3, 1024, steps=2)
    run_steps(steps, spec, traces=traces)
    for trace in traces:
        doc = trace.to_dict()
        recorded = [(e["args"]["algorithm"], e["args"]["bytes"]) for e in doc["traceEvents"]
                    if e.get("cat") == "collective"]
        assert recorded == collectives * len(steps)
        assert sum(e.get("cat") == "transfer" for e in doc["traceEvents"]) > 0


def test_gather_places_each_worker_in_its_ring_segment():
    offsets = gather_offsets(4, 3)
    assert sorted(offsets.tolist()) == [0, 3, 6, 9]


def test_state_is_bounded():
    codec = compression.make("sign")
    for key in range(compression.base.STATES + 10):
        codec.state(key, lambda: 0)
    assert len(codec._states) == compression.base.STATES


@pytest.mark.parametrize("text,message", [
    ("gzip", "unknown compression 'gzip': expected one of fp16, bf16, powersgd, topk, sign"),
    ("topk:ratio=0", "option ratio must be a number in (0, 1], got 0"),
    ("powersgd:rank=0", "option rank must be an integer >= 1, got 0"),
    ("powersgd:rnk=2", "unknown option 'rnk' (it takes rank, error_feedback, seed)"),
    ("fp16:rank=2", "unknown option 'rank' (it takes no options)"),
    ("topk:0.01", "expected key=value after ':', got '0.01'"),
    ("", "compression must be a codec name"),
])
def test_bad_codecs_are_named(text, message):
    with pytest.raises(ConfigError, match=None) as info:
        compression.make(text)
    assert message in str(info.value)


def test_register_refuses_a_taken_name_and_names_its_owner():
    impostor = compression.CodecSpec("topk", powersgd.PowerSgd, "not top-k at all")
    with pytest.raises(ConfigError, match=r"cannot register compression 'topk': the name is taken "
                                          r"\(by gradsync\.compression\.topk\)"):
        compression.register(impostor)
    assert compression.REGISTRY["topk"].codec is topk.TopK          # the first holder keeps it
    again = compression.CodecSpec("topk_again", topk.TopK, "top-k, once more", compression.REGISTRY["topk"].options)
    try:
        assert compression.register(again) is again and "topk_again" in compression.names()
    finally:
        del compression.REGISTRY["topk_again"]


def test_wire_bytes_shrink():
    n = 1_000_000
    (fp,), (p, q), (tk,), (sg,) = (compression.make(s).wire(4, n) for s in
                                   ("fp16", "powersgd:rank=4", "topk:ratio=0.01", "sign"))
    assert (fp.elements, fp.dtype) == (n, "float16")
    assert p.elements + q.elements == 4 * (1000 + 1000)
    assert (tk.kind, tk.elements) == ("all_gather", 2 * 10_000)
    assert sg.elements == n // 8 + 4


# --- over Gloo, through the public entry points ----------------------------------------------

@pytest.mark.slow
def test_all_reduce_with_compression_over_gloo():
    import compression_bodies as bodies
    from gradsync.tools.launch import run

    workers = 3
    results = run(bodies.all_reduce_codecs, workers)
    xs = [bodies.inputs(r).double().numpy() for r in range(workers)]
    for r in results:
        close(torch.tensor(r["fp16"]), ref_cast(xs, torch.float16), 4 * 2**-10)
        close(torch.tensor(r["bf16"]), ref_cast(xs, torch.bfloat16), 4 * 2**-7)
        close(torch.tensor(r["topk:ratio=1"]), np.sum(xs, axis=0), 1e-6)
        close(torch.tensor(r["sign"]), ref_sign([xs])[0], 1e-5)
        close(torch.tensor(r["powersgd:rank=2"]), ref_powersgd([xs], 2)[0], 1e-4)
        kept = ref_topk([xs] * 3, 0.05)
        for step in range(3):
            close(torch.tensor(r[f"topk-kept-{step}"]), kept[step] / workers, 1e-5)


@pytest.mark.slow
def test_ddp_comm_hook_with_compression():
    import compression_bodies as bodies
    from gradsync.tools.launch import run

    for errors in run(bodies.ddp_hook_codecs, 2):
        assert errors["topk:ratio=1"] < 1e-6          # keeps everything: exact
        assert 0 < errors["fp16"] < 1e-3
        assert 0.05 < errors["powersgd:rank=1"] < 1    # rank 1 of 30x20 and 5x30 weights: lossy, not garbage


def test_all_reduce_refuses_bad_compression_before_posting():
    from gradsync.runtime.request import compression_codec as compressed_codec

    with pytest.raises(ConfigError, match="needs a float tensor"):
        compressed_codec(torch.ones(3, dtype=torch.int32), "ring", "fp16")
    with pytest.raises(ConfigError, match="unknown algorithm|not a registered|ringg"):
        compressed_codec(torch.ones(3), "ringg", "fp16")


# --- the cost of a codec: the simulator on its wire, plus its compute --------------------------

def test_prediction_is_the_simulated_wire_plus_codec_time():
    from gradsync import algorithms
    from gradsync.tools.codec_predict import predict
    from gradsync.model.simulate import simulate
    from gradsync.model.topology import preset

    topo, n, workers = preset("ethernet", workers=4, nic="100Mbit"), 1 << 20, 4
    fp16 = predict("fp16", "ring", topo, n, rate=1e8)
    assert fp16["wire_s"] == pytest.approx(simulate(algorithms.build("ring", 4, n), topo, 2).time)
    assert fp16["codec_s"] == pytest.approx(n / 1e8)
    # an all-gather of m per worker: each sends (N - 1) m, about (N - 1) m bytes / bandwidth
    sign = predict("sign", "ring", topo, n, rate=1e12)
    m = n // 8 + 4
    assert sign["bytes"] == pytest.approx((workers - 1) * m)
    assert sign["wire_s"] == pytest.approx((workers - 1) * m / 12.5e6, rel=0.05)
    # PowerSGD r = 1: two all-reduces of 1024 floats instead of one of a million
    power = predict("powersgd:rank=1", "ring", topo, n, rate=1e12)
    assert power["bytes"] == pytest.approx(2 * 3 / 4 * 2 * 1024 * 4)


def test_the_runtime_fixed_cost_is_counted_per_collective_and_round():
    from gradsync.tools.codec_predict import fit_overhead, predict
    from gradsync.model.topology import preset

    # a ring all-reduce of N = 5: 8 rounds; its all-gather half: 4
    assert fit_overhead(5, 2.0 + 8 * 0.25, 2.0 + 4 * 0.25) == {"per_collective_s": 2.0, "per_round_s": 0.25}
    assert fit_overhead(5, 1.0, 3.0) == {"per_collective_s": 3.0, "per_round_s": 0.0}   # noise: never < 0
    overhead = {"per_collective_s": 0.002, "per_round_s": 0.001}
    fast, n = preset("ethernet", workers=4, nic="100Gbit"), 1 << 16          # wires far under 1 ms
    for codec, fixed in (("topk:ratio=0.01", 0.002 + 3 * 0.001),            # one all-gather, 3 rounds
                         ("powersgd:rank=1", 2 * (0.002 + 6 * 0.001))):      # two all-reduces of 6
        bare, more = predict(codec, "ring", fast, n, rate=1e9), predict(codec, "ring", fast, n, rate=1e9,
                                                                        overhead=overhead)
        assert more["overhead_s"] == pytest.approx(fixed) and bare["overhead_s"] == 0
        assert bare["wire_s"] < fixed / 10
        assert more["time_s"] == pytest.approx(n / 1e9 + fixed)          # the fixed cost, not the wire
    # a slow wire hides it: fp16 of 4 MB at 100 Mbit/s takes its wire time either way
    slow = preset("ethernet", workers=4, nic="100Mbit")
    bare, more = (predict("fp16", "ring", slow, 1 << 20, rate=1e9, overhead=o) for o in (None, overhead))
    assert more["time_s"] == bare["time_s"] == pytest.approx(bare["wire_s"] + (1 << 20) / 1e9)


def test_one_step_error_orders_the_codecs():
    from gradsync.tools.codec_predict import one_step_error

    errors = {s: one_step_error(s, 3, 4096) for s in ("fp16", "bf16", "sign", "topk:ratio=0.01")}
    assert errors["fp16"] < 1e-3 < errors["bf16"] < 1e-2 < errors["sign"] < errors["topk:ratio=0.01"] < 1


# --- the command line --------------------------------------------------------------------------

def cli(*args):
    import subprocess
    import sys
    return subprocess.run([sys.executable, "-m", "gradsync", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize("args,needle", [
    (["compare", "-z", "gzip"], "unknown compression 'gzip'"),
    (["tune", "-z", "topk:ratio=2"], "option ratio must be a number in (0, 1], got 2"),
    (["bench", "-z", "powersgd:rank=0"], "option rank must be an integer >= 1, got 0"),
    (["bench", "-z", "fp16", "--backend", "mpi"], "'--compression'"),
    (["train", "-z", "sign:ratio=0.1"], "unknown option 'ratio' (it takes error_feedback)"),
])
def test_bad_compression_is_one_line_and_exit_code_2(args, needle):
    run = cli(*args)
    assert run.returncode == 2
    assert needle in run.stderr and run.stderr.count("\n") == 1 and "Traceback" not in run.stderr


@pytest.mark.slow
def test_compare_and_tune_report_codecs_with_their_error():
    import json

    run = cli("compare", "-t", "ethernet", "-n", "4", "--size", "4MB", "--algorithms", "ring",
              "-z", "fp16", "-z", "sign", "--format", "json")
    assert run.returncode == 0, run.stderr
    rows = {r["algorithm"]: r for r in json.loads(run.stdout)}
    assert rows["ring+fp16"]["bytes"] == pytest.approx(rows["ring"]["busiest_link_bytes"] / 2)
    assert 0 < rows["ring+fp16"]["error"] < 1e-3 < rows["ring+sign"]["error"] < 1
    run = cli("tune", "-t", "ethernet", "-n", "4", "--min-size", "1MB", "--max-size", "4MB", "-z", "bf16",
              "--format", "json")
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert all("ring+bf16" in r["times_s"] for r in out["rows"]) and 0 < out["codec_errors"]["ring+bf16"] < 1e-2


def test_powersgd_with_a_layout_compresses_each_weight_and_sends_vectors_exactly(rng):
    """The DDP hook's layout: a matrix per weight (first dimension by the rest), vectors exact;
    against the paper's steps per matrix in numpy, over 3 steps with error feedback."""
    shapes, workers, r = [(6, 10), (10,), (4, 3, 2)], 3, 1
    n = sum(int(np.prod(s)) for s in shapes)
    steps = gradients(rng, workers, n, steps=3)
    transports = MemoryTransport.group(workers, seed=3)
    out = [[None] * workers for _ in steps]

    def rank(w):
        codec = compression.make("powersgd:rank=1")
        codec.layout("b", shapes)
        for t, inputs in enumerate(steps):
            x = inputs[w].clone()
            CompressedAllReduce(x, codec, TransportExchange(transports[w], "ring", {}, time.monotonic() + 20),
                                key="b").start(inline=True).wait()
            out[t][w] = x

    threads = [threading.Thread(target=rank, args=(w,)) for w in range(workers)]
    [t.start() for t in threads]
    [t.join(60) for t in threads]
    same_on_every_rank(out)
    # numpy: per matrix, the paper's steps with its own Q and error; the vector summed exactly
    qs = {0: powersgd.initial_q(10, r).double().numpy(), 70: powersgd.initial_q(6, r).double().numpy()}
    errors = [np.zeros(n) for _ in range(workers)]
    for t, xs in enumerate(as64(steps)):
        works = [x + e for x, e in zip(xs, errors)]
        expected = np.zeros(n)
        expected[60:70] = np.sum([w[60:70] for w in works], axis=0)
        for offset, rows, cols in ((0, 6, 10), (70, 4, 6)):
            ms = [w[offset:offset + rows * cols].reshape(rows, cols) for w in works]
            p_hat, _ = np.linalg.qr(sum(m @ qs[offset] for m in ms))
            mine = [m.T @ p_hat for m in ms]
            for w, m in enumerate(ms):
                errors[w][offset:offset + rows * cols] = (m - p_hat @ mine[w].T).reshape(-1)
            qs[offset] = sum(mine)
            expected[offset:offset + rows * cols] = (p_hat @ qs[offset].T).reshape(-1)
        for w in range(workers):
            errors[w][60:70] = 0
        close(out[t][0], expected, 1e-4)
    codec = compression.make("powersgd:rank=1")
    codec.layout("b", shapes)
    assert [w.elements for w in codec.wire(workers, n, key="b")] == [6 + 4, 10 + 10 + 6]


@pytest.mark.slow
def test_bench_with_compression_runs_the_codec_over_gloo():
    import json

    run = cli("bench", "-n", "2", "--sizes", "64KB", "--iters", "3", "--algorithms", "ring,tree", "-z", "bf16",
              "--format", "json")
    assert run.returncode == 0, run.stderr
    rows = {r["algorithm"]: r for r in json.loads(run.stdout)}
    assert set(rows) == {"native", "ring+bf16", "tree+bf16"}
    assert rows["native"]["max_error"] < 1e-6
    assert 1e-4 < rows["ring+bf16"]["max_error"] < 1e-2      # bfloat16's 8 bits, not float32's 24


def test_sign_with_a_layout_scales_each_tensor(rng):
    shapes, workers = [(5, 4), (3,), (2, 2, 2)], 3
    n = 31
    steps = gradients(rng, workers, n, steps=2)
    steps[0][0][:20] *= 100                     # one tensor far larger: one scale would drown the others
    transports = MemoryTransport.group(workers, seed=5)
    out = [[None] * workers for _ in steps]

    def rank(w):
        codec = compression.make("sign")
        codec.layout(0, shapes)
        for t, inputs in enumerate(steps):
            x = inputs[w].clone()
            CompressedAllReduce(x, codec, TransportExchange(transports[w], "ring", {}, time.monotonic() + 20),
                                key=0).start(inline=True).wait()
            out[t][w] = x

    threads = [threading.Thread(target=rank, args=(w,)) for w in range(workers)]
    [t.start() for t in threads]
    [t.join(60) for t in threads]
    same_on_every_rank(out)
    errors = [np.zeros(n) for _ in range(workers)]
    for t, xs in enumerate(as64(steps)):
        expected = np.zeros(n)
        for w, x in enumerate(xs):
            work = x + errors[w]
            sent = np.zeros(n)
            for a, b in ((0, 20), (20, 23), (23, 31)):
                sent[a:b] = np.abs(work[a:b]).mean() * np.where(work[a:b] >= 0, 1.0, -1.0)
            expected += sent
            errors[w] = work - sent
        close(out[t][0], expected, 1e-5)
