"""The instruments of the backend trials (``benchmarks/backend_trials.py``; its figures are in
docs/reliability.md): a trial records what happened to every survivor, and judges it by rules
that can fail. The campaign itself is a benchmark; the short form here runs two trials."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import trial_report  # noqa: E402
import trial_watch  # noqa: E402


def row(**given):
    base = {"hung": False, "exit": {"code": 1}, "outcome": "error", "named": "global", "waited_s": 0.1}
    return {**base, **given}


def test_each_survivor_gets_the_first_verdict_that_applies():
    timeout = 10.0
    assert trial_report.verdict(row(), timeout) == "named"
    assert trial_report.verdict(row(waited_s=12.5), timeout) == "named late"
    assert trial_report.verdict(row(named=None), timeout) == "error not naming"
    assert trial_report.verdict(row(exit={"signal": "SIGSEGV"}), timeout) == "crash"     # named, then crashed
    assert trial_report.verdict(row(hung=True, exit={"signal": "SIGKILL"}), timeout) == "hang"
    assert trial_report.verdict(row(outcome="ok", exit={"code": 0}, difference=0.0), timeout) == "ok"
    assert trial_report.verdict(row(outcome="ok", exit={"code": 0}, difference=1e-6), timeout) == "wrong result"
    assert trial_report.verdict(row(outcome=None, exit={"signal": "SIGTERM"}), timeout) == "ended by SIGTERM"


def test_the_victim_is_named_by_its_peer_or_by_its_rank_in_the_text():
    assert trial_report.names({"peer": 2, "text": "rank 0: rank 2 died"}, 2, "ddp") == "global"
    assert trial_report.names({"peer": 1, "text": "rank 0: rank 1 failed"}, 3, "ddp") is None   # a survivor named
    assert trial_report.names({"peer": None, "text": "Connection closed by peer"}, 3, "ddp") is None
    assert trial_report.names({"peer": None, "text": "timed out waiting for rank 3"}, 3, "ddp") == "global"
    assert trial_report.names({"peer": 1, "text": "rank 1 died"}, 3, "hsdp") == "group"        # 3 is 1 in {2, 3}


def test_a_crashed_worker_s_signal_is_read_from_its_zombie_before_it_is_reaped():
    child = subprocess.Popen([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"])
    try:
        until = time.time() + 30
        while (trial_watch.stat(child.pid) or trial_watch.Proc(0, 0, 0, "R", 0, 0)).state != "Z":
            assert time.time() < until, "the child never became a zombie"
            time.sleep(0.01)
        assert trial_watch.exit_of(trial_watch.stat(child.pid).exit_status) == {"signal": "SIGSEGV"}
    finally:
        child.wait()
    assert child.returncode == -signal.SIGSEGV


def test_the_crash_line_names_the_crashed_thread_s_innermost_frame():
    dump = ["Fatal Python error: Segmentation fault", "Thread 0x1 (most recent call first):",
            '  File "/x/lib/python3.11/threading.py", line 327 in wait',
            "Current thread 0x2 (most recent call first):",
            '  File "/v/lib/python3.11/site-packages/torch/autograd/graph.py", line 979 in _engine_run_backward']
    assert trial_report.crash_where(dump) == \
        "Fatal Python error: Segmentation fault in torch/autograd/graph.py:979 _engine_run_backward"


@pytest.mark.slow
def test_two_trials_record_every_survivor_and_leave_nothing_running(tmp_path):
    # FSDP2 on the gradsync backend: a rank killed during a training step, then a control
    out = tmp_path / "trials.json"
    subprocess.run([sys.executable, str(BENCHMARKS / "backend_trials.py"), "--trials", "2", "--kinds", "fsdp",
                    "--faults", "kill", "--phases", "training", "--control-every", "2", "--seed", "3",
                    "--out", str(out)], check=True, timeout=600, capture_output=True)
    fault, control = json.loads(out.read_text())["trials"]
    assert control["fault"] is None and len(control["survivors"]) == 4
    # the control ends with the one-process reference's parameters on every rank (float64)
    assert all(r["verdict"] == "ok" and r["difference"] <= 1e-9 for r in control["survivors"]), control
    assert fault["note"]["doing"] in ("training", "checkpoint", "final-gather"), fault["note"]
    assert sorted(r["rank"] for r in fault["survivors"]) == sorted({0, 1, 2, 3} - {fault["fault"]["rank"]})
    assert all(r["exit"] is not None and r["verdict"] for r in fault["survivors"]), fault["survivors"]
    assert fault["victim"]["exit"] == {"signal": "SIGKILL"}
    for trial in (fault, control):              # the harness leaves none of its workers running
        left = subprocess.run(["pgrep", "-f", trial["folder"]], capture_output=True, text=True).stdout.split()
        assert not left, (trial["folder"], left)
