"""benchmarks.kernel.plan_search on the CPU: every search width's plan is checked against plan_python."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def test_every_width_plans_like_plan_python_under_interpreter(tmp_path):
    pytest.importorskip("triton")
    out = tmp_path / "plan-search.json"
    # a fresh process: TRITON_INTERPRET must be set before triton is first imported
    proc = subprocess.run([sys.executable, "-m", "benchmarks.kernel.plan_search", "--shapes", "host-64x24",
                           "--device", "cpu", "--out", str(out)], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, TRITON_INTERPRET="1"))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (rec,) = json.loads(out.read_text())
    widths = [k.removeprefix("matches_plan_python_ncand") for k in rec if k.startswith("matches_")]
    assert widths == ["8", "16", "32", "64", "128"]
    assert all(rec[f"matches_plan_python_ncand{w}"] for w in widths)
    assert rec["default_ncand"] == 8  # host-64x24: a batch of 64 on 2 warps
