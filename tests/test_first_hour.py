"""What a newcomer meets in the first hour: failures bounded and named at every moment of a
run's life, limits checked before anything starts, units that mean bytes, and output that
says what it means."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist

from gradsync.errors import ConfigError, GradsyncError
from gradsync.tools.launch import doing, run
from gradsync.units import format_size, parse_bandwidth, parse_size

SHM = "/dev/shm"


def default_sigint():
    """In the child before it runs: SIGINT back to its default, as a terminal's job has it (a shell
    running us in the background, or nohup, leaves it ignored, and Python would then ignore Ctrl-C)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def gradsync(*args, timeout=120, env=None):
    return subprocess.run([sys.executable, "-m", "gradsync", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def start_bench(*args, env=None):
    """``gradsync bench`` in its own process group, as a terminal starts a job."""
    return subprocess.Popen([sys.executable, "-m", "gradsync", "bench", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, env=env,
                            preexec_fn=default_sigint)


def workers_of(pid, at_least=1, within=60.0):
    """The spawned worker processes of the bench process ``pid``, once ``at_least`` have appeared."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        out = subprocess.run(["pgrep", "-P", str(pid), "-f", "spawn_main"], capture_output=True, text=True)
        found = sorted(int(x) for x in out.stdout.split())
        if len(found) >= at_least:
            return found
        time.sleep(0.01)
    raise AssertionError(f"no workers of {pid} within {within} s")


def forget_engine_messages(text):
    """Remove the folder of engine messages a failed job names (kept for the user to read)."""
    import re
    import shutil
    for folder in re.findall(r"the engine's own messages are in (\S+)", text):
        shutil.rmtree(folder, ignore_errors=True)


def gradsync_segments():
    return {n for n in os.listdir(SHM) if n.startswith("gradsync")} if os.path.isdir(SHM) else set()


# -- units: sizes are bytes however they are spelled; bits only for rates spelled so --

@pytest.mark.parametrize("text, nbytes", [("4kb", 4000), ("4KB", 4000), ("4kB", 4000), ("4k", 4000), ("4K", 4000),
                                          ("4KiB", 4096), ("4kib", 4096), ("4Ki", 4096), ("1MiB", 2**20),
                                          ("64mb", 64 * 10**6), ("160", 160), ("1.5MB", 1_500_000),
                                          ("2 GB", 2 * 10**9), ("1e6", 10**6), (4096, 4096)])
def test_every_spelling_of_a_size_is_bytes(text, nbytes):
    assert parse_size(text) == nbytes


@pytest.mark.parametrize("text, bps", [("100Mbit", 12.5e6), ("1Gbit/s", 125e6), ("100Mbps", 12.5e6),
                                       ("16GB/s", 16e9), ("2GBps", 2e9), ("10MB", 10e6), ("1e9", 1e9)])
def test_rates_take_bits_only_when_spelled_so(text, bps):
    assert parse_bandwidth(text) == pytest.approx(bps)


def test_bits_in_a_size_and_an_ambiguous_rate_are_refused_by_name():
    with pytest.raises(ConfigError, match=r"'4kbit': sizes are in bytes"):
        parse_size("4kbit")
    with pytest.raises(ConfigError, match=r"'100Mb/s': say bits or bytes"):
        parse_bandwidth("100Mb/s")


@pytest.mark.parametrize("given", ["160MB", "4KB", "4KiB", "1MiB", "1.5MB", "256MiB", "160 B", "64 KB"])
def test_a_size_is_shown_as_it_was_given(given):
    assert format_size(parse_size(given)).replace(" ", "") == given.replace(" ", "")


def in_process(*args):
    from click.testing import CliRunner
    from gradsync.cli import main

    return CliRunner().invoke(main, list(args))


def test_compare_shows_a_size_as_given():
    out = in_process("compare", "--topology", "pcie-switch-4", "--size", "4kb")
    assert out.exit_code == 0, out.output
    assert "4 KB" in out.output and "500 B" not in out.output
    out = in_process("compare", "--topology", "pcie-switch-4", "--size", "1MiB")
    assert "1 MiB" in out.output and "1.049 MB" not in out.output


# -- the DDP hook checks every option when it is made --

def test_comm_hook_checks_its_options_when_made():
    from gradsync.torch import comm_hook
    import inspect

    assert "transport" in inspect.signature(comm_hook).parameters and "transport" in comm_hook.__doc__
    with pytest.raises(ConfigError, match=r"bad option 'tansport': the hook takes timeout, trace, compression, "
                                          r"transport, and algorithm 'ring' takes"):
        comm_hook("ring", tansport="auto")
    with pytest.raises(ConfigError, match="transport must be one of"):
        comm_hook("ring", transport="tcp")
    with pytest.raises(ConfigError, match="unknown algorithm 'rign'"):
        comm_hook("rign")
    with pytest.raises(ConfigError, match="option segments must be"):
        comm_hook("tree", segments=0)
    with pytest.raises(ConfigError, match="timeout must be a positive"):
        comm_hook("ring", timeout=-1)
    assert callable(comm_hook("ring", transport="auto")) and callable(comm_hook("auto"))


# -- limits checked up front --

def test_an_oversize_bench_is_refused_at_once_with_its_estimate():
    import re
    from gradsync.tools.bench import available_memory, estimate

    started = time.monotonic()
    out = gradsync("bench", "-n", "16", "--sizes", "4GB", "--algorithms", "ring,tree")
    assert time.monotonic() - started < 10
    assert out.returncode == 2 and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gradsync: error:"), out.stderr
    expected = estimate([4 * 10**9], 16, ["ring", "tree"])
    assert (f"bench would need about {format_size(expected['total_bytes'])} of memory (16 workers x "
            f"{format_size(expected['per_worker_bytes'])} at 4 GB)") in lines[0]
    fits = re.search(r"the largest size that fits is ([0-9.]+ [KMG]B)", lines[0])
    if fits:                                   # it fits indeed, and twice it would not
        largest = parse_size(fits.group(1).replace(" ", ""))
        assert estimate([largest], 16, ["ring", "tree"])["total_bytes"] <= 0.9 * available_memory() * 1.05
    else:
        assert "16 workers alone take about" in lines[0]
    assert "refuses" in gradsync("bench", "--help").stdout


def test_the_estimate_grows_with_sizes_workers_and_rows():
    from gradsync.tools.bench import BASELINE_BYTES, estimate

    small = estimate([1 << 20], 2, ["ring"])
    assert small["per_worker_bytes"] > BASELINE_BYTES
    assert estimate([64 << 20], 2, ["ring"])["per_worker_bytes"] > small["per_worker_bytes"]
    assert estimate([1 << 20], 4, ["ring"])["total_bytes"] > small["total_bytes"]
    assert estimate([1 << 20], 2, ["ring", "tree"])["per_worker_bytes"] > small["per_worker_bytes"]
    # 64 MB of float32 per row: the row's copy, the input, the native row's copy and the engine's,
    # 4 float64 arrays (8 x 64 MB), ring's scratch (half of it at N = 2)
    assert estimate([64 << 20], 2, ["ring"])["per_worker_bytes"] - BASELINE_BYTES == 12.5 * (64 << 20)


# -- a real bench run: auto as a row, conclusions, the estimate against the measured peak --

@pytest.mark.slow
def test_bench_takes_auto_and_ends_with_what_it_means():
    out = gradsync("bench", "-n", "2", "--sizes", "4KB,64KB", "--algorithms", "ring,auto", "--iters", "3",
                   timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    table = [line.split() for line in lines if line.split()[:1] in (["4"], ["64"])]
    assert {(row[3], row[1]) for row in table} >= {("auto", "KB"), ("ring", "KB"), ("native", "KB")}
    for size in ("4 KB", "64 KB"):
        said = [line for line in lines if line.startswith(f"{size}:")]
        assert len(said) == 1 and ("was fastest" in said[0]) and "engine's own all-reduce" in said[0]
    assert any(line.startswith("max error: the largest difference from the exact sum") for line in lines)
    memory = next(line for line in lines if line.startswith("memory: estimated"))
    assert "measured peak" in memory


@pytest.mark.slow
def test_the_estimate_is_within_2x_of_the_measured_peak():
    from gradsync.tools.bench import estimate

    out = gradsync("bench", "-n", "2", "--sizes", "32MB", "--algorithms", "ring", "--iters", "2",
                   "--format", "json", timeout=300)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    peak = max(r["peak_rss_bytes"] for r in rows)
    est = estimate([32 * 10**6], 2, ["ring"])["per_worker_bytes"]
    assert 0.5 <= est / peak <= 2, (est, peak)


# -- failures bounded and named from a worker's first line to its last --

def test_a_rank_killed_while_starting_ends_the_job_within_the_timeout():
    proc = start_bench("-n", "2", "--sizes", "4KB", "--algorithms", "ring", "--timeout", "8")
    victim = workers_of(proc.pid, at_least=2)[1]
    os.kill(victim, signal.SIGKILL)
    killed = time.monotonic()
    out, err = proc.communicate(timeout=60)
    assert time.monotonic() - killed <= 8 + 5
    forget_engine_messages(err)
    lines = err.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, err
    assert "rank 1: died (killed by SIGKILL) while starting" in lines[0] and "the first to fail" in lines[0], err


def engine_body(rank, workers):
    """Rank 1 leaves in the middle of the engine's own all-reduces; the others are inside one."""
    t = torch.ones(1 << 16)
    for step in range(400):
        doing(f"timing the engine's own all-reduce, call {step}")
        if rank == 1 and step == 20:
            os._exit(3)
        dist.all_reduce(t)
    return "done"


def test_an_engine_collectives_failure_is_named_in_gradsyncs_words_once():
    started = time.monotonic()
    with pytest.raises(GradsyncError) as caught:
        run(engine_body, 2, timeout=10)
    assert time.monotonic() - started < 10 + 20
    message = str(caught.value)
    forget_engine_messages(message)
    assert len(message.splitlines()) == 1
    assert message.startswith("2 of 2 workers failed: rank 1: died") and "(the first to fail, " in message
    assert "died (exit code 3) while timing the engine's own all-reduce, call 20" in message
    assert "the engine (torch.distributed) failed while timing" in message
    assert "pair.cc" not in message and "frame #" not in message and "GLHF" not in message


def test_ctrl_c_while_the_workers_start_is_quiet_and_leaves_nothing():
    before = gradsync_segments()
    proc = start_bench("-n", "2", "--sizes", "4KB,1MB", "--algorithms", "ring", "--transport", "shm")
    workers = workers_of(proc.pid, at_least=2)
    time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGINT)              # what Ctrl-C does: the whole foreground group
    pressed = time.monotonic()
    out, err = proc.communicate(timeout=30)
    assert time.monotonic() - pressed < 10
    lines = [x for x in err.splitlines() if x.strip()]
    assert proc.returncode == 130 and lines == ["gradsync: aborted"], err
    assert len(err.splitlines()) <= 3
    time.sleep(0.5)
    assert not [w for w in workers if os.path.exists(f"/proc/{w}") and "Z" not in open(f"/proc/{w}/stat").read()]
    assert gradsync_segments() <= before


def test_gradsync_alone_prints_its_help():
    out = in_process()
    assert out.exit_code == 0 and "Usage: " in out.output and "bench" in out.output
    version = in_process("--version")
    assert version.exit_code == 0 and version.output.startswith("gradsync, version")


# -- slower: Ctrl-C mid-run, SIGUSR1 at every moment, the flight-dir pair, a kill mid-row --

@pytest.mark.slow
def test_ctrl_c_in_the_middle_of_a_row_is_quiet():
    before = gradsync_segments()
    proc = start_bench("-n", "2", "--sizes", "16MB", "--algorithms", "ring", "--iters", "200", "--transport", "shm")
    workers_of(proc.pid, at_least=2)
    time.sleep(6)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and [x for x in err.splitlines() if x.strip()] == ["gradsync: aborted"], err
    time.sleep(0.5)
    assert gradsync_segments() <= before


@pytest.mark.slow
def test_sigusr1_at_any_moment_kills_no_rank(tmp_path):
    env = {**os.environ, "GRADSYNC_FLIGHT_DIR": str(tmp_path / "flight")}
    for flight in (env, None):                       # with the flight recorder and without it
        proc = start_bench("-n", "2", "--sizes", "4KB,1MB", "--algorithms", "ring", env=flight)
        workers = workers_of(proc.pid, at_least=2)
        for delay in (0.0, 0.3, 1.5, 4.0):
            time.sleep(delay)
            for w in workers:
                try:
                    os.kill(w, signal.SIGUSR1)
                except ProcessLookupError:
                    pass
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err


@pytest.mark.slow
def test_the_flight_dir_pair_works_on_a_healthy_run(tmp_path):
    folder = tmp_path / "flight"
    out = gradsync("bench", "-n", "2", "--sizes", "4KB", "--algorithms", "ring", "--iters", "2",
                   "--flight-dir", str(folder), timeout=300)
    assert out.returncode == 0, out.stderr
    doctor = gradsync("doctor", str(folder))
    assert doctor.returncode == 0 and doctor.stdout.startswith("Nothing went wrong in gradsync's collectives")


@pytest.mark.slow
def test_a_rank_killed_mid_row_is_named_within_the_timeout():
    proc = start_bench("-n", "3", "--sizes", "4MB", "--algorithms", "ring", "--iters", "3000", "--timeout", "10")
    victim = workers_of(proc.pid, at_least=3)[2]
    time.sleep(8)
    os.kill(victim, signal.SIGKILL)
    killed = time.monotonic()
    out, err = proc.communicate(timeout=60)
    assert time.monotonic() - killed <= 10 + 5
    forget_engine_messages(err)
    lines = err.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, err
    assert "rank 2: died (killed by SIGKILL)" in lines[0] and "the first to fail" in lines[0]
    assert "pair.cc" not in err and "frame #" not in err
