"""Careless input: every command and API entry point answers with one line naming the value and
what was expected (command line: exit code 2, no traceback), before any long work starts.

The plain tests are the cases a user found; the property-based tests drive the same entry points
with generated sizes, worker counts, dtypes and options and fail on any other exception or exit
code, or on a run longer than its alarm. Commands run in this process (click's CliRunner), with
the launchers replaced by a stub that fails the test if anything would start.
"""

import json
import signal
import subprocess
import sys
from contextlib import contextmanager

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gradsync
from gradsync.cli import common as cli     # main, the limits and the helpers the tests call
from gradsync.errors import GradsyncError
from gradsync.model.simulate import simulate
from gradsync.model.topology import preset


class Launched(Exception):
    """Raised by the stubbed launchers: validation passed and a long run would start now."""


def refuse_to_launch(*args, **kwargs):
    raise Launched


@pytest.fixture(autouse=True)
def no_launch(monkeypatch):
    from gradsync.tools import calibrate, launch
    monkeypatch.setattr(launch, "run", refuse_to_launch)
    monkeypatch.setattr(calibrate, "calibrate", refuse_to_launch)


def run(*args):
    return CliRunner().invoke(cli.main, [str(a) for a in args])


def assert_one_line(result, *needles):
    assert result.exit_code == 2, (result.exit_code, result.stderr, result.exception)
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    for needle in needles:
        assert needle in result.stderr, result.stderr


@pytest.fixture
def one_worker_topology(tmp_path):
    path = tmp_path / "one.json"
    path.write_text(json.dumps({"name": "one", "nodes": [{"name": "w0", "kind": "host"},
                                                         {"name": "sw", "kind": "switch"}],
                                "links": [{"a": "w0", "b": "sw", "bandwidth": "1GB/s"}], "workers": ["w0"]}))
    return str(path)


# ---- the cases the user found ------------------------------------------------------------------

@pytest.mark.parametrize("args,needles", [
    (["compare", "--size", "0"], ["'--size'", "got 0 B", "float32 elements"]),
    (["compare", "--size", "1.5"], ["'1.5'", "whole number of bytes"]),
    (["compare", "--size", "3B"], ["got 3 B", "(4 B each)"]),
    (["compare", "--size", "1e30GB"], ["got 1e+27 TB"]),
    (["compare", "--workers", "1", "-t", "ethernet"], ["'--workers'", "got 1", "at least 2"]),
    (["tune", "-t", "ethernet", "--workers", "1"], ["'--workers'", "got 1"]),
    (["simulate", "-a", "ring", "-t", "ethernet", "--workers", "1"], ["'--workers'", "got 1"]),
    (["bench", "--workers", "1", "--topology", "ethernet"], ["'--workers'", "1 is not in the range 2<=x<=64"]),
    (["compare", "-t", "ethernet", "--workers", "5000"], ["got 5000", "expected 2..1024", "149 s and 6.7 GB"]),
    (["simulate", "-a", "tree", "-t", "ethernet", "--workers", "65536"], ["got 65536", "expected 2..1024"]),
    (["tune", "-t", "ethernet", "--workers", "5000"], ["got 5000", "expected 2..4096", "194 s"]),
    (["tune", "-t", "ethernet", "--workers", "64", "--max-error", "0.01"], ["'--max-error'", "got 64", "182 s"]),
    (["compare", "-t", "ethernet", "-n", "100", "--algorithms", "ring,cerar"], ["cerar takes at most 64", "got 100"]),
    (["cerar", "-n", "5000", "-c", "8"], ["'--workers'", "5000 is not in the range"]),
    (["cerar", "-n", "64", "-c", "256", "--elements", "262144"], ["'--elements'", "got 262144"]),
    (["simulate", "-a", "tree", "-o", "segments=1000000000"], ["segments must be at most 4096, got 1000000000"]),
    (["bench", "--sizes", "0"], ["'--sizes'", "got 0 B"]),
    (["bench", "--sizes", "3B"], ["'--sizes'", "got 3 B", "float32 elements (4 B each)"]),
    (["bench", "--sizes", "4KB,6B", "--dtype", "float64"], ["got 6 B", "float64 elements (8 B each)"]),
    (["bench", "--topology", "nosuch.json"], ["unknown topology 'nosuch.json'"]),
    (["calibrate", "--out", "/nonexistent/dir/c.json"], ["'--out'", "'/nonexistent/dir/c.json'", "no directory"]),
    (["simulate", "-a", "ring", "--out", "/nonexistent/dir/r.json"], ["'/nonexistent/dir/r.json'"]),
    (["train", "--plot", "/nonexistent/dir/p.png"], ["'--plot'", "'/nonexistent/dir/p.png'"]),
    (["compare", "--algorithms", ""], ["'--algorithms'", "got ''"]),
    (["simulate", "-a", "cerar", "--dtype", "int32"], ["'cerar'", "float32 or float64", "got int32"]),
    (["explain", "--size", "0"], ["'--size'", "got 0 B"]),
    (["explain", "-t", "ethernet", "--workers", "5000"], ["got 5000", "expected 2..4096"]),
    (["explain", "--algorithms", "ring,rign"], ["unknown algorithm 'rign'"]),
    (["explain", "--measured", "/nonexistent/b.json"], ["'--measured'", "cannot read '/nonexistent/b.json'"]),
    (["doctor", "/nonexistent/dir"], ["no directory '/nonexistent/dir'"]),
    (["trace", "compare", "/nonexistent/a.json", "/nonexistent/b.json"], ["cannot read trace '/nonexistent/a.json'"]),
    (["bench", "--trace", "/nonexistent/dir/t.json"], ["'--trace'", "no directory"]),
    (["bench", "--trace", "t.json", "--backend", "mpi"], ["'--trace'", "not under mpirun or torchrun"]),
    (["simulate", "-a", "ring", "--trace", "/nonexistent/dir/t.json"], ["'--trace'", "no directory"]),
    (["train", "--trace", "t.json", "--elastic"], ["--elastic does not combine with --trace"]),
    (["tune", "--plot", "t.jpg"], ["'--plot'", "must end in .png, got 't.jpg'"]),
    (["bench", "--plot", "/nonexistent/dir/b.png"], ["'--plot'", "no directory"]),
])
def test_careless_input_is_one_line_and_exit_code_2(args, needles):
    assert_one_line(run(*args), *needles)      # the stubs fail the test if a launch or calibration starts


@pytest.mark.parametrize("command", [["compare"], ["tune"], ["simulate", "-a", "ring"]])
def test_a_one_worker_topology_file_is_refused(command, one_worker_topology):
    assert_one_line(run(*command, "-t", one_worker_topology), "has 1 worker(s)", "expected 2..")


def test_as_a_user_runs_it_exit_code_2_and_no_traceback():
    for args in (["compare", "--size", "0"], ["bench", "--sizes", "3B"]):
        out = subprocess.run([sys.executable, "-m", "gradsync", *args], capture_output=True, text=True, timeout=120)
        assert out.returncode == 2 and out.stderr.count("\n") == 1 and "Traceback" not in out.stderr, out.stderr


def test_default_algorithm_list_leaves_cerar_out_above_its_limit_with_a_note():
    result = run("compare", "-t", "ethernet", "-n", "100", "-s", "1MB", "--format", "json")
    assert result.exit_code == 0 and "cerar left out: it takes at most 64 workers" in result.stderr
    assert "cerar" not in {r["algorithm"] for r in json.loads(result.stdout)}


def test_bench_sizes_are_round_and_end_at_the_maximum():
    assert cli._sizes(None, 4000, 16_000_000, "float32") == [4000, 16000, 64000, 250000, 10**6, 4 * 10**6, 16 * 10**6]
    assert cli._sizes(None, 4096, 16 << 20, "float32") == [4 << 10 << 2 * k for k in range(7)]
    assert cli._sizes(None, 4000, 256_000_000, "float32")[-2:] == [64_000_000, 256_000_000]
    assert cli._sizes("4KB,1MB", None, None, "float64") == [4000, 10**6]


def test_tune_headers_stay_distinct_at_160_columns(capsys):
    result = run("tune", "--max-error", "0.01")                    # 15 candidates on pcie-switch-4
    lines = result.stdout.splitlines()
    ends = next(i for i, line in enumerate(lines) if line.startswith("size "))
    header = " ".join(lines[1:ends + 1])                          # a long header folds over lines
    assert result.exit_code == 0 and "…" not in header
    for c in (4, 6, 8):
        assert f"cerar c={c} " in header + " "
    labels = [f"cerar(components={c})" for c in range(10, 23)]      # too wide for 160 columns: folded, not cut
    cli._print_table(labels, [["1 us"] * len(labels)])
    table = capsys.readouterr().out
    assert "…" not in table and all(label[-3:] in table for label in labels)


def test_elastic_run_without_a_kill_says_so(monkeypatch):
    from gradsync.training import elastic
    result = {"workers": 3, "elapsed_s": 12.0, "history": [], "events": [{"world_size": 3}], "kills": [],
              "restarts": 0, "final": {"step": 40, "sha256": "0" * 64, "world_size": 3}}
    monkeypatch.setattr(elastic, "check", lambda *a: None)
    monkeypatch.setattr(elastic, "train", lambda *a, **k: dict(result))
    out = run("train", "--elastic", "-n", "3", "--min-workers", "2", "--kill-every", "30", "--format", "json")
    assert out.exit_code == 0, out.stderr
    assert "no worker was killed: training ran 12 s" in out.stderr and "--kill-every 30 s" in out.stderr
    assert "no worker was killed" in json.loads(out.stdout)["note"]


def test_api_empty_and_one_worker_cases_are_trivial_not_errors():
    assert simulate(gradsync.schedule("ring", 3, 0), preset("ethernet", 3)).time == 0.0
    assert simulate(gradsync.schedule("tree", 1, 100), preset("ethernet", 1)).time == 0.0
    assert gradsync.emulate("ring", [np.arange(3.0)]).tolist() == [[0.0, 1.0, 2.0]]
    with pytest.raises(gradsync.ConfigError, match=r"elements must be an integer in 0..2\*\*40, got 1099511627777"):
        gradsync.schedule("ring", 4, 2**40 + 1)


# ---- property-based: generated careless input ----------------------------------------------------

class Hang(Exception):
    pass


@contextmanager
def alarm(seconds):
    def ring(signum, frame):
        raise Hang(f"no answer within {seconds} s")
    old = signal.signal(signal.SIGALRM, ring)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


SIZES = st.one_of(st.sampled_from(["0", "1.5", "3B", "-1MB", "1e30GB", "4KB", "1MB", "4KiB", "1bit", "12XB", "",
                                   "nan", "inf", "1e-3", "4 KB", "0x10", "1000000000000000GB"]),
                  st.text(max_size=6))
WORKERS = st.integers(-1, 5000)
DTYPES = st.sampled_from(["float32", "float64", "int32", "bfloat16", "float16", "int64", "float8", ""])
ALGORITHMS = st.sampled_from(["ring", "tree", "sharded", "central", "host", "halving_doubling", "cerar", "",
                              "rign", "auto", "ring,tree", ",", "cerar,ring"])
OPTIONS = st.sampled_from(["segments=0", "segments=3", "segments=-1", "segments=abc", "segments=5000",
                           "segments=1e999", "components=0", "components=4", "components=100000", "root=2",
                           "root=99", "eps=2", "nonsense", "=3", "rings=[[0,1]]", "scale=none"])
TOPOLOGIES = st.sampled_from(["ethernet", "pcie-switch-4", "ring", "lowbw-cluster", "nosuch", "nosuch.json"])
FUZZ = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                        HealthCheck.too_slow])


@pytest.fixture
def small_limits(monkeypatch):
    # Valid draws must finish in well under a second: the real limits are the plain tests' business.
    monkeypatch.setattr(cli, "SIMULATED", (24, "lowered for the test"))
    monkeypatch.setattr(cli, "TUNED", (24, "lowered for the test"))
    monkeypatch.setattr(cli, "CERAR_WORKERS", (8, "lowered for the test"))
    monkeypatch.setattr(cli, "CERAR_TUNED", (4, "lowered for the test"))


def assert_answered(args):
    with alarm(30):
        result = run(*args)
    if isinstance(result.exception, Launched):
        return                                   # valid input: it would launch workers now
    assert result.exit_code in (0, 2), (args, result.exit_code, result.stderr, result.exc_info)
    assert "Traceback" not in result.stderr, (args, result.stderr)
    if result.exit_code == 2:
        assert result.stderr.startswith("gradsync: error: ") and result.stderr.count("\n") == 1, (args, result.stderr)


def optional(flag, strategy):
    return st.one_of(st.just([]), strategy.map(lambda v: [flag, v]))


@FUZZ
@given(topology=TOPOLOGIES, workers=optional("-n", WORKERS), size=optional("-s", SIZES),
       dtype=optional("--dtype", DTYPES), names=optional("--algorithms", ALGORITHMS),
       components=optional("-c", st.integers(-1, 300)))
def test_fuzz_compare(small_limits, topology, workers, size, dtype, names, components):
    assert_answered(["compare", "-t", topology, *workers, *size, *dtype, *names, *components, "--format", "json"])


@FUZZ
@given(algorithm=ALGORITHMS, topology=TOPOLOGIES, workers=optional("-n", WORKERS), size=optional("-s", SIZES),
       dtype=optional("--dtype", DTYPES), options=st.lists(OPTIONS, max_size=2))
def test_fuzz_simulate(small_limits, algorithm, topology, workers, size, dtype, options):
    pairs = [x for o in options for x in ("-o", o)]
    assert_answered(["simulate", "-a", algorithm, "-t", topology, *workers, *size, *dtype, *pairs, "--format", "json"])


@FUZZ
@given(topology=TOPOLOGIES, workers=optional("-n", WORKERS), size=optional("-s", SIZES),
       dtype=optional("--dtype", DTYPES), names=optional("--algorithms", ALGORITHMS),
       max_error=optional("--max-error", st.sampled_from(["0", "0.01", "0.5", "1", "x"])))
def test_fuzz_explain(small_limits, topology, workers, size, dtype, names, max_error):
    assert_answered(["explain", "-t", topology, *workers, *size, *dtype, *names, *max_error, "--format", "json"])


@FUZZ
@given(topology=TOPOLOGIES, workers=optional("-n", WORKERS), low=optional("--min-size", SIZES),
       high=optional("--max-size", SIZES), dtype=optional("--dtype", DTYPES),
       max_error=optional("--max-error", st.sampled_from(["0", "0.01", "0.5", "1", "2", "x", "nan"])))
def test_fuzz_tune(small_limits, topology, workers, low, high, dtype, max_error):
    assert_answered(["tune", "-t", topology, *workers, *low, *high, *dtype, *max_error, "--format", "json"])


@FUZZ
@given(workers=WORKERS, components=st.integers(-1, 5000),
       elements=st.sampled_from(["-1", "0", "1", "100", "4096", "1000000000", "x"]),
       construction=st.sampled_from(["unity", "vandermonde", "optimized", "magic"]),
       dtype=st.sampled_from(["float32", "float64", "int32"]))
def test_fuzz_cerar(workers, components, elements, construction, dtype):
    assert_answered(["cerar", "-n", workers, "-c", components, "--elements", elements, "--construction",
                     construction, "--dtype", dtype, "--format", "json"])


@FUZZ
@given(workers=WORKERS, sizes=optional("--sizes", st.one_of(SIZES, st.lists(SIZES, max_size=3).map(",".join))),
       low=optional("--min-size", SIZES), high=optional("--max-size", SIZES),
       dtype=optional("--dtype", DTYPES), names=optional("--algorithms", ALGORITHMS),
       topology=optional("--topology", TOPOLOGIES))
def test_fuzz_bench_fails_before_launching(workers, sizes, low, high, dtype, names, topology):
    assert_answered(["bench", "-n", workers, *sizes, *low, *high, *dtype, *names, *topology, "--format", "json"])


def api_call(fn, *args, **kwargs):
    with alarm(30):
        try:
            return fn(*args, **kwargs)
        except GradsyncError:
            return None


def elements_from(size, itemsize=4):
    """A generated size as the API would get it: its element count if it parses, else the raw text."""
    try:
        return gradsync.units.parse_size(size) // itemsize
    except GradsyncError:
        return size


# Worker counts up to 5000 for the algorithms whose schedules grow linearly; ring and sharded are
# 2N(N-1) transfers (seconds at 5000). CERAR's design has no limit of its own in the API yet and
# takes minutes beyond about 64 workers or components, so it is drawn small here.
MOST_WORKERS = {"ring": 1024, "sharded": 1024, "cerar": 16}


def api_options(pairs):
    """Generated ``-o`` pairs as keyword options. The API caps neither CERAR's components nor tree's
    segments (N x S transfers), which the command line does, so those two large values are left out."""
    options = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        if key and pair not in ("components=100000", "segments=5000"):
            try:
                options[key] = json.loads(value)
            except ValueError:
                options[key] = value
    return options


@FUZZ
@given(data=st.data(), algorithm=ALGORITHMS, size=st.one_of(SIZES, st.integers(-5, 10**6), st.floats()),
       dtype=st.sampled_from([None, "float32", "float64", "int32", "bfloat16", "complex64", 3]),
       options=st.lists(OPTIONS, max_size=2))
def test_fuzz_api_schedule(data, algorithm, size, dtype, options):
    workers = data.draw(st.one_of(st.integers(-1, MOST_WORKERS.get(algorithm, 5000)), st.sampled_from([True, 2.0, "4"])))
    elements = elements_from(size) if isinstance(size, str) else size
    api_call(gradsync.schedule, algorithm, workers, elements, dtype=dtype, **api_options(options))


@FUZZ
@given(algorithm=ALGORITHMS, workers=st.integers(-1, 64), elements=st.integers(0, 64),
       dtype=st.sampled_from(["float32", "float64", "int32", "int8", "bool", "complex64", "U3"]),
       op=st.sampled_from(["sum", "avg", "max", ""]), options=st.lists(OPTIONS, max_size=1))
def test_fuzz_api_emulate(algorithm, workers, elements, dtype, op, options):
    inputs = np.ones((max(workers, 0), elements), dtype=dtype) if workers >= 0 else [np.ones(3), np.ones(4)]
    api_call(gradsync.emulate, algorithm, inputs, op, **api_options(options))


@FUZZ
@given(algorithm=st.sampled_from(["ring", "tree", "sharded", "central", "host", "halving_doubling"]),
       workers=st.integers(1, 24), elements=st.integers(0, 1000), topology=TOPOLOGIES,
       topology_workers=st.one_of(st.none(), st.integers(-1, 5000)),
       itemsize=st.one_of(st.integers(-2, 16), st.sampled_from([True, 2.5, "4", None])))
def test_fuzz_api_simulate(algorithm, workers, elements, topology, topology_workers, itemsize):
    topo = api_call(gradsync.model.topology.resolve, topology, topology_workers)
    if topo is not None and len(topo.workers) <= 64:
        api_call(simulate, gradsync.schedule(algorithm, workers, elements), topo, itemsize)


@FUZZ
@given(name=TOPOLOGIES, workers=st.one_of(st.none(), WORKERS, st.sampled_from([True, 2.5, "8", 65537, 10**9])),
       params=st.dictionaries(st.sampled_from(["nic", "latency", "link", "gpus", "servers", "colour"]),
                              st.one_of(SIZES, st.integers(-1, 10**6)), max_size=2))
def test_fuzz_api_preset(name, workers, params):
    api_call(preset, name, workers, **params)
