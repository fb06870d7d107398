"""The prepared GPU check runs end to end where no GPU is (its smoke run on the CPU), so that a
session lent a GPU runs a script that works: the backend's values at world 1 are right and
every codec rate is a positive number; without --device cpu and without CUDA it refuses in one
line with exit 2."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_check.py"


@pytest.mark.slow
def test_the_smoke_run_checks_the_backend_and_times_every_codec(tmp_path):
    out = tmp_path / "gpu.json"
    run = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--elements", "65536", "--out", str(out)],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["backend"]["all_reduce_device_ok"] and result["backend"]["all_reduce_cpu_ok"]
    assert result["backend"]["ddp_grad_max_diff"] <= 1e-6
    assert set(result["rates"]["codecs"]) == {"cerar N=8 c=8", "cerar N=8 c=12", "cerar N=8 c=16", "powersgd:rank=4"}
    assert all(isinstance(v, float) and v > 0 for v in result["rates"]["codecs"].values())


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here")
def test_without_a_gpu_it_refuses_in_one_line():
    run = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.count("\n") == 1 and "no CUDA device here" in run.stderr
