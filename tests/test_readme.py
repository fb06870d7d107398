"""The README's Python examples run as written, and its tour prints what the README says."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


@pytest.mark.slow   # a multi-process run of several seconds; CI runs it with -m slow
def test_the_runtime_example_runs_and_prints_what_it_says(tmp_path):
    block = next(b for b in python_blocks() if "def worker" in b)
    script = tmp_path / "example.py"
    script.write_text(block)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == str([-0.2, -0.2])


def test_the_in_process_example_runs():
    block = next(b for b in python_blocks() if "gradsync.emulate" in b)
    exec(compile(block, "README.md", "exec"), {})


def tour_commands() -> list[str]:
    """The commands of the README's tour, in order, as written."""
    text = README.read_text()
    block = re.search(r"## A short tour\n+```sh\n(.*?)```", text, re.S).group(1)
    return [line.strip() for line in block.splitlines() if line.strip() and not line.startswith("#")]


def can_emulate_links() -> bool:
    import os
    import shutil
    return os.geteuid() == 0 and shutil.which("tc") is not None and shutil.which("ip") is not None


# what each tour command must print, as the README says it (by the command's first words)
TOUR_SAYS = {
    "gradsync bench --workers 4 --sizes 4KB,1MB,64MB": ["ring", "tree", "cerar", "64 MB:", "max error:"],
    "gradsync calibrate": [],
    "gradsync bench --workers 4 --topology calibrated.json": ["pred. error = (predicted - measured) / measured"],
    "gradsync compare --topology pcie-switch-4": [r"re:^central +60(\.0)? ms", r"re:^host +80(\.0)? ms",
                                                  r"re:^sharded +15(\.0)? ms"],
    "gradsync compare --topology p3.16xlarge": ["5.21 ms", "5.93 ms"],
    "gradsync simulate --algorithm ring --topology ethernet": [],
    "gradsync tune": ["crossover at"],
    "gradsync explain": ["bottleneck"],
    "gradsync bench --workers 4 --algorithms ring --sizes 16MB --trace": ["trace written to measured.json"],
    "gradsync simulate --algorithm ring --topology calibrated.json": [],
    "gradsync trace compare": ["error = (simulated - measured) / measured", "whole collective: measured"],
    "gradsync bench --workers 4 --sizes 4KB,1MB --flight-dir": [],
    "gradsync doctor": ["Nothing went wrong"],
    "gradsync train": ["epoch"],
}


@pytest.mark.slow
def test_the_whole_tour_runs_and_prints_what_the_readme_says(tmp_path):
    import shlex
    import shutil

    shutil.rmtree("/tmp/flight", ignore_errors=True)
    commands = tour_commands()
    assert len(commands) >= 15
    for command in commands:
        if command == "gradsync serve":
            continue                             # a server runs until stopped: tests/test_web.py starts it
        if "--link-bandwidth" in command and not can_emulate_links():
            continue                             # needs root and tc (tests/test_links.py)
        args = shlex.split(command)
        assert args[0] == "gradsync"
        out = subprocess.run([sys.executable, "-m", "gradsync", *args[1:]], capture_output=True, text=True,
                             cwd=tmp_path, timeout=1200)
        assert out.returncode == 0, f"{command}: {out.stderr[-1500:]}"
        says = next((v for k, v in TOUR_SAYS.items() if command.startswith(k)), [])
        for needle in says:          # text, or after "re:" a regular expression matched per line
            pattern = needle[3:] if needle.startswith("re:") else re.escape(needle)
            assert re.search(pattern, out.stdout, re.I | re.M), f"{command}: no {needle!r} in {out.stdout[-1500:]}"
    for written in ("calibrated.json", "run.json", "measured.json", "simulated.json"):
        assert (tmp_path / written).exists()
