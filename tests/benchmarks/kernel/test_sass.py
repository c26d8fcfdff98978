"""benchmarks.kernel.sass on a CPU: the main kernel compiles for sm_90a and hoist_rows removes page-16 address work."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[3]
INTERP = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def test_hoisted_row_offsets_shrink_the_page16_kernel_to_the_page1_size():
    if INTERP:  # triton.compile for a real target refuses interpreted kernels: rerun in a process without it
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(Path(__file__))],
                              env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
        return
    from benchmarks.kernel import sass
    from benchmarks.kernel.configs import main_config

    try:
        plain, hoisted, page1 = (sass.assemble(sass.ptx(page, main_config(64, 4, 2, 2, 1, 0, hoist)))
                                 for page, hoist in ((16, 0), (16, 1), (1, 0)))
    except SystemExit as exc:  # no ptxas/cuobjdump anywhere
        pytest.skip(str(exc))
    for r in (plain, hoisted, page1):
        assert r["registers"] <= 255 and r["spill_bytes"] == 0, r
    assert hoisted["sass_integer"] < 0.8 * plain["sass_integer"], (hoisted, plain)
    assert hoisted["sass"] <= 1.02 * page1["sass"], (hoisted, page1)
