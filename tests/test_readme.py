"""The README's Python examples run as written."""

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


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
