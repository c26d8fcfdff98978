"""The benchmark tools' CPU tests run them as a user would, in a fresh process under Triton's interpreter
(TRITON_INTERPRET must be set before triton is first imported)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def interpreted():
    """interpreted(*args): `python *args` from the repository root under TRITON_INTERPRET=1 (`-m MODULE ...` or
    `-c SCRIPT`); fails the test with the output's tail unless it exits 0, else returns the finished process."""
    pytest.importorskip("triton")

    def run(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
        env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
        proc = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=timeout)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc
    return run
