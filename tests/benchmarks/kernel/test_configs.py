"""benchmarks.kernel.configs: the sweep's winner must meet the tolerance; templates adapt to each shape."""

from __future__ import annotations

import pytest

from benchmarks.kernel.configs import best_of_sweep, for_shape, label, main_config, parse_config
from benchmarks.kernel.shapes import select, uniform


def test_sweep_winner_must_meet_the_tolerance():
    from vattn.kernel import MainConfig

    fast_coarse = dict(kv_dtype="fp8", rel_err=0.024, us=135.0, config=MainConfig(qk_fp8=1).__dict__)
    slower_exact = dict(kv_dtype="fp8", rel_err=0.0018, us=150.0, config=MainConfig(qk_fp8=2).__dict__)
    assert best_of_sweep([fast_coarse, slower_exact]) == MainConfig(qk_fp8=2)
    assert best_of_sweep([fast_coarse]) is None
    # the bf16 bar is tighter: 6e-3 passes for fp8, not for bf16; a NaN never passes
    assert best_of_sweep([dict(fast_coarse, kv_dtype="bf16", rel_err=6e-3)]) is None
    assert best_of_sweep([dict(slower_exact, nan=True)]) is None
    # a template keeps fp8 Q.K^T off bf16 KV and picks warps by the shape's packed rows
    bf16 = for_shape(MainConfig(qk_fp8=2), select("16x35k-bf16")[0])
    assert bf16.qk_fp8 == 0 and bf16.num_warps == 4
    assert for_shape(MainConfig(qk_fp8=2), uniform(16, 35_000, q_len=8)).num_warps == 8


def test_config_text_round_trips_to_a_label():
    c = parse_config("64,4,2,2,1,0,1")
    assert c == main_config(64, 4, 2, 2, 1, 0, 1) and c.hoist_rows and not c.kmajor
    assert label(c) == "vattn[bn64,w4,s2,qk8x2,pf,hoist]"
    assert parse_config("") is None
    with pytest.raises(SystemExit, match=r"--config: got '64,4'; expected block_n,num_warps,num_stages"):
        parse_config("64,4")
