"""The registry: an algorithm defined here, registered at run time, shows up in every consumer
(compare, bench in worker processes, the web API, list, the tuner), and bad specs and bad
options are refused with messages that name the bad value."""

import dataclasses
import inspect
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import gradsync
from gradsync import algorithms
from gradsync.algorithms._common import check_size
from gradsync.algorithms.spec import AlgorithmSpec, Option, is_int
from gradsync.cli import main
from gradsync.errors import ConfigError
from gradsync.core.schedule import REDUCE, Schedule, chunk_bounds, transfers, verify


def pairwise_schedule(workers: int, elements: int, segments: int = 1) -> Schedule:
    """Every worker sends its whole gradient to every other, which adds it in: the naive
    all-to-all, one round per segment. ``pairwise_schedule(3, 10).rounds`` is 1."""
    workers, elements = check_size(workers, elements)
    bounds = chunk_bounds(elements, segments)
    src, dst = np.nonzero(~np.eye(workers, dtype=bool))
    seg = np.arange(segments)[:, None]
    table = transfers(seg, src, dst, bounds[seg], bounds[seg + 1] - bounds[seg], REDUCE)
    return Schedule("pairwise", workers, elements, table, options={"segments": segments})


def pairwise_cost(workers, nbytes, net, itemsize=4, segments=1, **options) -> float:
    """One alpha per segment; each link carries N - 1 gradients each way, each one added in."""
    if workers == 1:
        return 0.0
    return segments * net.alpha + (workers - 1) * nbytes * (net.beta + net.gamma / itemsize)


# At top level, so that bench's worker processes can find and register it (load_external).
PAIRWISE = AlgorithmSpec(name="pairwise", schedule=pairwise_schedule, cost=pairwise_cost, exact=True,
                         summary="every worker sends its whole gradient to every other",
                         options={"segments": Option(1, "an integer >= 1", is_int(1))})


@pytest.fixture
def pairwise():
    algorithms.register(PAIRWISE)
    yield PAIRWISE
    algorithms.unregister("pairwise")


def cli(*args):
    return CliRunner().invoke(main, list(args))


@pytest.mark.parametrize("workers", [1, 2, 3, 5, 16])
@pytest.mark.parametrize("elements,segments", [(0, 1), (1, 1), (7, 3), (100, 4)])
def test_pairwise_is_a_correct_schedule(workers, elements, segments):
    verify(pairwise_schedule(workers, elements, segments))


def test_registered_algorithm_is_everywhere_in_process(pairwise):
    assert "pairwise" in algorithms.names(exact=True) and "pairwise" in algorithms.EXACT
    assert "pairwise" not in algorithms.names(exact=False)
    assert algorithms.get("pairwise").schedule is pairwise_schedule
    inputs = [np.arange(5.0), np.ones(5), np.full(5, 2.0)]
    # every worker ends with the sum (the emulator once applied each round's transfers in turn,
    # so a whole-buffer exchange added already-added values, and this line pinned that answer)
    assert gradsync.emulate("pairwise", inputs, segments=2)[2].tolist() == np.sum(inputs, axis=0).tolist()
    from gradsync.model.tune import default_candidates
    assert "pairwise" in [c.label for c in default_candidates(4)]
    assert (__name__, "pairwise") in algorithms.external()


def test_compare_shows_it_with_its_own_numbers(pairwise):
    run = cli("compare", "--topology", "pcie-switch-4", "--size", "160MB", "--format", "json")
    assert run.exit_code == 0, run.output
    rows = {r["algorithm"]: r for r in json.loads(run.stdout)}
    assert "pairwise" in rows and "cerar" in rows
    # 3 whole gradients out of each 16 GB/s link, at once: half of central's 60 ms
    assert rows["pairwise"]["time_s"] == pytest.approx(0.030, rel=1e-3)
    assert rows["pairwise"]["closed_form_s"] == pytest.approx(rows["pairwise"]["time_s"], rel=1e-3)
    assert rows["pairwise"]["error"] == 0


def test_list_shows_it_and_forgets_it_when_unregistered():
    algorithms.register(PAIRWISE)
    try:
        out = json.loads(cli("list", "--format", "json").stdout)
        entry = next(a for a in out["algorithms"] if a["name"] == "pairwise")
        assert entry == {"name": "pairwise", "exact": True, "dtypes": None, "options": {"segments": 1},
                         "summary": PAIRWISE.summary}
        assert {t["name"] for t in out["topologies"]} >= {"pcie-switch-4", "ethernet"}
        assert "pairwise" in cli("list").stdout
    finally:
        algorithms.unregister("pairwise")
    assert "pairwise" not in cli("list").stdout
    with pytest.raises(ConfigError, match="unknown algorithm 'pairwise'"):
        algorithms.get("pairwise")


def test_web_api_offers_and_simulates_it(pairwise):
    from fastapi.testclient import TestClient

    from gradsync.web.app import create_app

    client = TestClient(create_app(), raise_server_exceptions=False)
    assert "pairwise" in client.get("/api/presets").json()["algorithms"]
    r = client.post("/api/simulate", json={"algorithm": "pairwise", "topology": "pcie-switch-4", "workers": 4,
                                           "size": "1MB"})
    assert r.status_code == 200, r.text
    d = r.json()
    assert d["algorithm"] == "pairwise" and d["rounds"] == 1
    assert d["transfers"]["carried"] == [1] * 12                 # each carries one worker's input
    assert d["time_s"] == pytest.approx(2e-6 + 3 * 1e6 / 16e9, rel=1e-3)      # a route's latency + 3 MB out
    s = client.get("/api/schedule?algorithm=pairwise&workers=3&elements=10").json()
    assert s["algorithm"] == "pairwise" and len(s["transfers"]["src"]) == 6
    for _ in range(120):                  # a slow comparison answers "pending" and goes on in the background
        compared = client.get("/api/compare?size=1MB&algorithm=pairwise").json()
        if not compared.get("pending"):
            break
        time.sleep(0.5)
    curves = compared["curves"]
    assert curves["pairwise"]["closed_form_s"][0] == pytest.approx(2e-6 + 1e6 / 16e9, rel=1e-3)   # 2 workers


def test_bench_runs_it_in_worker_processes_and_checks_the_sum(pairwise, monkeypatch):
    # The workers import this module by name (tests.test_registry): keep the repository root
    # on the path they inherit, however pytest was started.
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1]))
    run = cli("bench", "--workers", "2", "--sizes", "4KB", "--iters", "3", "--algorithms", "pairwise",
              "--format", "json")
    assert run.exit_code == 0, run.output
    rows = {r["algorithm"]: r for r in json.loads(run.stdout)}
    assert set(rows) == {"native", "pairwise"}
    assert rows["pairwise"]["count"] == 1000 and rows["pairwise"]["time_s"] > 0
    assert rows["pairwise"]["max_error"] < 1e-6                  # against the float64 sum


@pytest.mark.parametrize("change,needle", [
    (dict(name="ring"), "'ring': the name is taken"),
    (dict(name="Pair Wise"), "got 'Pair Wise'"),
    (dict(name="auto"), "name 'auto' is reserved"),
    (dict(schedule="not a function"), "schedule must be a function, got 'not a function'"),
    (dict(exact="yes"), "exact must be True or False, got 'yes'"),
    (dict(summary="two\nlines"), "summary must be one non-empty line, got 'two\\nlines'"),
    (dict(summary=""), "summary must be one non-empty line, got ''"),
    (dict(dtypes=("float32", "complex64")), "got ('float32', 'complex64')"),
    (dict(dtypes=["float32"]), "got ['float32']"),
    (dict(options={"segments": 1}), "option 'segments' must be an Option, got 1"),
    (dict(options={"chunks": Option(1, "an integer", is_int(1))}), "'chunks' is not a keyword of pairwise_schedule()"),
    (dict(options={"segments": Option(2, "an integer", is_int(1))}), "has default 2 but pairwise_schedule() uses 1"),
    (dict(machine_option="machines"), "machine_option must be None or one of its options, got 'machines'"),
])
def test_register_refuses_a_bad_spec(change, needle):
    with pytest.raises(ConfigError, match="cannot register algorithm") as err:
        algorithms.register(dataclasses.replace(PAIRWISE, **change))
    assert needle in str(err.value)
    assert "pairwise" not in algorithms.names()


def test_register_refuses_a_duplicate_and_a_non_spec(pairwise):
    with pytest.raises(ConfigError, match="'pairwise': the name is taken"):
        algorithms.register(PAIRWISE)
    with pytest.raises(ConfigError, match="takes an AlgorithmSpec, got module"):
        algorithms.register(algorithms.ring)
    with pytest.raises(ConfigError, match="unknown algorithm 'nothing'"):
        algorithms.unregister("nothing")


@pytest.mark.parametrize("name,options,needle", [
    ("pairwise", {"segments": 0}, "algorithm 'pairwise': option segments must be an integer >= 1, got 0"),
    ("pairwise", {"segments": "3"}, "option segments must be an integer >= 1, got '3'"),
    ("pairwise", {"segment": 3}, "bad option 'segment' for algorithm 'pairwise': expected one of segments"),
    ("host", {"root": 1}, "bad option 'root' for algorithm 'host': it takes none"),
    ("tree", {"segments": 2.5}, "option segments must be an integer >= 1, got 2.5"),
    ("central", {"root": -1}, "option root must be a worker index (an integer >= 0), got -1"),
    ("ring", {"weights": [1, -1]}, "option weights must be a list of positive numbers, one per ring, got [1, -1]"),
    ("cerar", {"construction": "magic"}, "option construction must be one of unity, vandermonde, optimized, "
                                         "got 'magic'"),
    ("cerar", {"eps": 2}, "option eps must be a number in (0, 1), got 2"),
])
def test_bad_options_name_the_option_the_value_and_the_rule(pairwise, name, options, needle):
    with pytest.raises(ConfigError) as err:
        algorithms.build(name, 4, 100, **options)
    assert needle in str(err.value)


def test_bad_option_on_the_command_line_is_one_line_exit_2(pairwise):
    run = cli("simulate", "-a", "pairwise", "-o", "segments=0")
    assert run.exit_code == 2
    assert run.stderr == "gradsync: error: algorithm 'pairwise': option segments must be an integer >= 1, got 0\n"


def test_dtypes_are_checked_and_filter_the_default_lists():
    with pytest.raises(ConfigError) as err:
        algorithms.get("cerar").check_dtype("int32")
    assert str(err.value) == "algorithm 'cerar' needs float16, float32 or float64 tensors, got int32"
    only_int = dataclasses.replace(PAIRWISE, dtypes=("int32",))
    with pytest.raises(ConfigError, match="algorithm 'pairwise' needs int32 tensors, got float16"):
        only_int.check_dtype("float16")
    rows = json.loads(cli("compare", "--size", "1MB", "--dtype", "int32", "--format", "json").stdout)
    assert "cerar" not in {r["algorithm"] for r in rows} and "ring" in {r["algorithm"] for r in rows}
    run = cli("compare", "--size", "1MB", "--dtype", "bfloat16", "--algorithms", "ring,cerar")
    assert run.exit_code == 2 and "needs float16, float32 or float64 tensors, got bfloat16" in run.stderr


def test_a_worker_process_that_cannot_rebuild_an_algorithm_says_so():
    with pytest.raises(ConfigError, match="module json neither registers it on import nor defines"):
        algorithms.load_external([("json", "ghost")])


# The order every listing shows (gradsync list, tune's tables, the web view's menu, the README).
BUILT_INS = ("central", "host", "sharded", "one_shot", "ring", "tree", "halving_doubling", "hierarchical", "cerar")

# The whole file of a new algorithm, as one would write it in src/gradsync/algorithms/: the
# imports, the two functions above, and its SPEC.
PAIRWISE_MODULE = f'''"""The naive all-to-all: every worker sends its gradient to every other."""

import numpy as np

from ..core.schedule import REDUCE, Schedule, chunk_bounds, transfers
from ._common import check_size
from .spec import AlgorithmSpec, Option, is_int


{inspect.getsource(pairwise_schedule)}

{inspect.getsource(pairwise_cost)}

SPEC = AlgorithmSpec(name="pairwise", schedule=pairwise_schedule, cost=pairwise_cost, exact=True,
                     summary={PAIRWISE.summary!r},
                     options={{"segments": Option(1, "an integer >= 1", is_int(1))}})
'''

# Run in the copy: the registry as `gradsync list` shows it, and the new algorithm verified
# through the front door.
IN_THE_COPY = """
import json, sys
from click.testing import CliRunner
import gradsync
from gradsync.cli import main
listed = json.loads(CliRunner().invoke(main, ["list", "--format", "json"]).stdout)["algorithms"]
for workers, elements in ((1, 0), (5, 17), (16, 1000)):
    gradsync.verify(gradsync.schedule("pairwise", workers, elements, segments=3))
print(json.dumps({"package": gradsync.__file__, "listed": [a["name"] for a in listed],
                  "entry": next(a for a in listed if a["name"] == "pairwise")}))
"""


def test_a_new_algorithm_file_is_all_it_takes(tmp_path):
    # A copy of the package with one file added, nothing else edited: the registry finds the
    # module, lists it after the first built-ins (in today's order) among the others by name, and it verifies.
    package = Path(algorithms.__file__).resolve().parents[1]
    shutil.copytree(package, tmp_path / "gradsync", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "gradsync" / "algorithms" / "pairwise.py").write_text(PAIRWISE_MODULE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    run = subprocess.run([sys.executable, "-c", IN_THE_COPY], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=300)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert Path(out["package"]).resolve().parent == (tmp_path / "gradsync").resolve()
    assert out["listed"] == [*BUILT_INS, *sorted([*algorithms.names()[len(BUILT_INS):], "pairwise"])]
    assert out["entry"] == {"name": "pairwise", "exact": True, "dtypes": None, "options": {"segments": 1},
                            "summary": PAIRWISE.summary}
    assert "pairwise" not in algorithms.names()          # this process's registry is untouched


def test_the_built_ins_keep_their_order():
    assert algorithms.names()[:len(BUILT_INS)] == BUILT_INS
    assert all(algorithms.get(name).schedule.__module__ == f"gradsync.algorithms.{name}" for name in BUILT_INS)
