"""benchmarks.kernel.merge_probe on a CPU, under Triton's interpreter: its one-program-a-sequence merge and vattn's
reduce, on the same partials, both equal the float64 merge (so the probe times a real merge)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

# TRITON_INTERPRET must be set before triton is first imported: the merge runs in a fresh process
SCRIPT = r"""
import json
from benchmarks.kernel import merge_probe
recs = [merge_probe.run(seqs, pieces, rows, 32, gqa, replays=1, device="cpu")
        for seqs, pieces, rows, gqa in ((1, 8, 8, 4), (3, 4, 16, 8))]
print(json.dumps(recs))
"""


def test_probe_and_reduce_merge_the_partials_as_float64_does():
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    res = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    recs = json.loads(res.stdout.strip().splitlines()[-1])
    assert [(r["sequences"], r["pieces"]) for r in recs] == [(1, 8), (3, 4)]
    for r in recs:  # bf16 outputs: ~2^-9 relative rounding
        assert r["rel_err_probe"] < 5e-3, r
        assert r["rel_err_reduce"] < 5e-3, r
