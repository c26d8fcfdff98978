"""benchmarks.kernel.merge_probe on a CPU, under Triton's interpreter: its one-program-a-sequence merge and vattn's
reduce, on the same partials, both equal the float64 merge (so the probe times a real merge)."""

from __future__ import annotations

import json


# TRITON_INTERPRET must be set before triton is first imported: the merge runs in a fresh process
SCRIPT = r"""
import json
from benchmarks.kernel import merge_probe
recs = [merge_probe.run(seqs, pieces, rows, 32, gqa, replays=1, device="cpu")
        for seqs, pieces, rows, gqa in ((1, 8, 8, 4), (3, 4, 16, 8))]
print(json.dumps(recs))
"""


def test_probe_and_reduce_merge_the_partials_as_float64_does(interpreted):
    res = interpreted("-c", SCRIPT)
    recs = json.loads(res.stdout.strip().splitlines()[-1])
    assert [(r["sequences"], r["pieces"]) for r in recs] == [(1, 8), (3, 4)]
    for r in recs:  # bf16 outputs: ~2^-9 relative rounding
        assert r["rel_err_probe"] < 5e-3, r
        assert r["rel_err_reduce"] < 5e-3, r
